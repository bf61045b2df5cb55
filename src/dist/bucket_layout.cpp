#include "dist/bucket_layout.h"

#include <algorithm>

#include "core/error.h"

namespace sd::dist {

BucketLayout::BucketLayout(const std::vector<int64_t>& numels, int64_t cap_elements, int world, bool sharded)
    : bucket_of_(numels.size()), slot_of_(numels.size()), world_(world), sharded_(sharded) {
  SD_CHECK(cap_elements > 0, "bucket size must be positive, got {}", cap_elements);
  SD_CHECK(world >= 1, "world size must be positive, got {}", world);
  for (size_t k = numels.size(); k-- > 0;) {
    SD_CHECK(numels[k] > 0, "parameter {} has no elements", k);
    if (buckets_.empty() || buckets_.back().numel + numels[k] > cap_elements) buckets_.emplace_back();
    Bucket& b = buckets_.back();
    BucketSlot slot{k, b.numel, numels[k]};
    b.slots.push_back(slot);
    b.numel += numels[k];
    bucket_of_[k] = buckets_.size() - 1;
    slot_of_[k] = slot;
  }
  for (Bucket& b : buckets_) b.padded_numel = sharded ? (b.numel + world - 1) / world * world : b.numel;
}

int64_t BucketLayout::owned_begin(size_t b, int rank) const {
  return sharded_ ? buckets_[b].padded_numel / world_ * rank : 0;
}

int64_t BucketLayout::owned_end(size_t b, int rank) const {
  return sharded_ ? buckets_[b].padded_numel / world_ * (rank + 1) : buckets_[b].numel;
}

std::vector<OwnedPiece> BucketLayout::owned_pieces(size_t b, int rank) const {
  const int64_t begin = owned_begin(b, rank), end = owned_end(b, rank);
  std::vector<OwnedPiece> pieces;
  for (const BucketSlot& s : buckets_[b].slots) {
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo < hi) pieces.push_back({s.param, lo - s.offset, hi - s.offset, lo - begin});
  }
  return pieces;
}

}  // namespace sd::dist

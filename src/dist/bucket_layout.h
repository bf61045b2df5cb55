// Trainable parameters laid out in flat buckets. A bucket is the unit of gradient communication (its gradients
// are reduced as soon as backward has produced all of them) and of sharding: with sharding, rank r owns the r-th
// of `world` equal slices of every bucket (its master weights, optimizer moments and EMA cover that slice only),
// as PyTorch FSDP shards each flat parameter. Without sharding every rank owns every bucket whole.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sd::dist {

struct BucketSlot {
  size_t param = 0;    // index into the parameter list
  int64_t offset = 0;  // first element inside the bucket
  int64_t numel = 0;
};

struct Bucket {
  std::vector<BucketSlot> slots;  // by increasing offset
  int64_t numel = 0;              // elements of its parameters
  int64_t padded_numel = 0;       // numel rounded up to a multiple of the world size when sharded
};

// The part of one parameter that lies inside a rank's owned slice of a bucket.
struct OwnedPiece {
  size_t param = 0;
  int64_t begin = 0, end = 0;  // element range within the (flattened) parameter
  int64_t offset = 0;          // where that range starts inside the owned slice
};

class BucketLayout {
 public:
  // `numels` of the parameters in their fixed order (identical on every rank). Buckets take parameters in reverse
  // order, since backward reaches the last layers first, up to `cap_elements` each (a larger parameter gets a
  // bucket of its own).
  BucketLayout(const std::vector<int64_t>& numels, int64_t cap_elements, int world, bool sharded);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  size_t num_params() const { return slot_of_.size(); }
  size_t bucket_of(size_t param) const { return bucket_of_[param]; }
  const BucketSlot& slot_of(size_t param) const { return slot_of_[param]; }
  int world() const { return world_; }
  bool sharded() const { return sharded_; }

  // Element range [begin, end) of bucket `b` that `rank` owns.
  int64_t owned_begin(size_t b, int rank) const;
  int64_t owned_end(size_t b, int rank) const;
  int64_t owned_numel(size_t b, int rank) const { return owned_end(b, rank) - owned_begin(b, rank); }
  // The parameter pieces inside `rank`'s slice of bucket `b` (padding excluded).
  std::vector<OwnedPiece> owned_pieces(size_t b, int rank) const;

 private:
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<BucketSlot> slot_of_;
  int world_;
  bool sharded_;
};

}  // namespace sd::dist

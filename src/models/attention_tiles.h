// How the attention kernels that walk over query rows (tiled_attention.cpp, wide_head_attention.cpp) split their
// work: one work item per tile of query rows [row, row + rows) of one batch x head slice, spread over LibTorch's
// threads, each tile small enough that its float32 scores stay in a core's L2 cache. And how the fused kernels
// (small_head_attention.cpp, wide_head_attention.cpp) pick their element type.
#pragma once
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>

#include "core/parallel.h"

namespace sd::models {

// Query rows per tile for lq queries against lk keys: enough for 256 KiB of float32 scores, but from `fewest` to
// `most` rows whatever the keys (each kernel's bounds are its own measurements), and at most lq.
inline int64_t tile_rows_for(int64_t lq, int64_t lk, int64_t fewest, int64_t most) {
  constexpr int64_t kScoreBytes = 256 << 10;
  return std::min(lq, std::clamp<int64_t>(kScoreBytes / (4 * std::max<int64_t>(lk, 1)), fewest, most));
}

// Query rows [row, row + rows) of batch x head slice `bh`.
struct Tile {
  int64_t bh, row, rows;
};

// Runs fn(tile, thread) for every tile of `tile_rows` query rows (the last of a slice may be shorter) of each of
// `slices` slices of lq queries, spread over LibTorch's threads.
template <typename Fn>
void for_each_tile(int64_t slices, int64_t lq, int64_t tile_rows, const Fn& fn) {
  if (lq == 0) return;  // no tiles (and tile_rows_for gives 0 rows)
  const int64_t tiles_per_slice = (lq + tile_rows - 1) / tile_rows;
  sd::parallel_for(0, slices * tiles_per_slice, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t bh = i / tiles_per_slice, row = i % tiles_per_slice * tile_rows;
      fn(Tile{bh, row, std::min(tile_rows, lq - row)}, at::get_thread_num());
    }
  });
}

// Calls fn(T()) with T the C++ type of `dtype`, float32 or bf16.
template <typename Fn>
void with_element_type(at::ScalarType dtype, const Fn& fn) {
  if (dtype == at::kBFloat16) return fn(c10::BFloat16());
  fn(0.f);
}

}  // namespace sd::models

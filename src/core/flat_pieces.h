// A flat tensor held in pieces, each covering a run of its elements. A lone rank's gradient is one: autograd's
// gradient of each parameter stays where autograd made it instead of being copied into the parameter's bucket.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "core/error.h"

namespace sd {

struct FlatPiece {
  int64_t offset = 0;  // where values' first element sits in the whole
  at::Tensor values;   // one-dimensional and contiguous
};
using FlatPieces = std::vector<FlatPiece>;

// Elements [offset, offset + numel) of the whole, which must lie inside one piece (pieces are in offset order).
inline at::Tensor narrow_pieces(const FlatPieces& pieces, int64_t offset, int64_t numel) {
  for (const FlatPiece& piece : pieces)
    if (piece.offset <= offset && offset + numel <= piece.offset + piece.values.numel())
      return piece.values.narrow(0, offset - piece.offset, numel);
  fail("narrow_pieces: elements {}..{} are not inside one piece", offset, offset + numel);
}

}  // namespace sd

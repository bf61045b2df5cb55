// The two layouts of attention heads: the model's [B, L, heads*d], each token's heads side by side, and
// [B*heads, L, d], each head's tokens together (what batched products per head read).
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// [B, L, heads*d] -> [B*heads, L, d] (diffusers' Attention.head_to_batch_dim).
inline at::Tensor head_to_batch_dim(const at::Tensor& x, int64_t heads) {
  const int64_t b = x.size(0), l = x.size(1), dim = x.size(2);
  return x.reshape({b, l, heads, dim / heads}).permute({0, 2, 1, 3}).reshape({b * heads, l, dim / heads});
}

// [B*heads, L, d] -> [B, L, heads*d] (diffusers' Attention.batch_to_head_dim).
inline at::Tensor batch_to_head_dim(const at::Tensor& x, int64_t heads) {
  const int64_t bh = x.size(0), l = x.size(1), d = x.size(2);
  return x.reshape({bh / heads, heads, l, d}).permute({0, 2, 1, 3}).reshape({bh / heads, l, d * heads});
}

}  // namespace sd::models

// Attention that never holds the whole [B*heads, Lq, Lk] score matrix, in training as in inference: the forward pass
// and the backward pass walk over tiles of query rows, and backward recomputes each tile's probabilities from q and
// k instead of keeping them (the idea of FlashAttention, without its online softmax: a tile holds whole rows, so
// every row's softmax is computed exactly as the plain path computes it). Work items (one query tile of one
// batch x head slice) run across LibTorch's threads, each with single-threaded GEMMs.
//
// What it saves: the plain path keeps the probabilities for backward, 4 x B x heads x Lq x Lk bytes per attention
// layer in float32 (335 MB for each of SD-2's five 64x64-latent self-attentions at batch 1); this keeps q, k and
// v only. What it costs: one more GEMM (q kᵀ) per tile in backward.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// softmax(q kᵀ · scale) v with the softmax in float32 and the probabilities cast to v's dtype before the last GEMM.
// `upcast_attention`: the scores come from float32 q and k (diffusers' upcast_attention).
// `tile_rows`: query rows per tile, 0 for attention_tile_rows().
// q: [BH, Lq, d], k: [BH, Lk, d], v: [BH, Lk, dv] -> [BH, Lq, dv]; differentiable in q, k and v.
at::Tensor tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                           bool upcast_attention, int64_t tile_rows = 0);

// Query rows per tile for keys of length `lk`: enough rows for efficient GEMMs, few enough that a tile's float32
// scores stay in a core's L2 cache.
int64_t attention_tile_rows(int64_t lq, int64_t lk);

}  // namespace sd::models

// Attention for heads of tens of channels (SD-1.x: 40-160, SD-2: 64) in float32 or bf16, per block of query rows: the
// block's scores, softmax and output stay in the cache, and forward and backward are one autograd node each.
// LibTorch's path copies q, k and v into [B*heads, L, d], and its baddbmm, softmax, bmm and their backwards each
// write or read the whole [B*heads, Lq, Lk] score matrix (32 MiB per SD-1.5 self-attention at 256², 320 MiB for
// SD-2 at 512²): ten passes over it, which at this size cost as much as the products themselves.
//
// Forward writes each block's probabilities once, into the buffer backward reads them from (what LibTorch's path
// keeps too); for memory-efficient training, and wherever they would take more than 64 MiB, it keeps two floats per
// query row instead and backward recomputes the probabilities, as models/tiled_attention.h does for other dtypes,
// for a third more arithmetic.
// The products are oneDNN's sgemm, the path every float32 GEMM in sdtrain takes, or oneDNN's bf16 matmul (on copies
// of q, k and v with each head's rows together, where its fast kernels want them); the softmax is sdtrain's own, in
// AVX-512 where the CPU has it (LibTorch's softmax kernels run their AVX2 code there): SD-2's 64x64 self-attention
// 13-15% faster forward + backward, SD-1.5's at 256² 15% (docs/benchmarks.md, eighteenth sitting).
//
// bf16 rounds where diffusers' AttnProcessor rounds in forward: the scores (unless upcast_attention), the
// probabilities and the output, with the softmax in float32 between; backward keeps float32 except for the
// products' operands (the probabilities and the scores' gradients) and rounds each gradient once.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// Whether wide_head_attention takes these inputs: float32 CPU tensors [B, L, heads*d], or bf16 ones on a CPU that
// runs bf16 in oneDNN, with heads of more than 16 channels (narrower heads take models/small_head_attention.h) and at
// least one query and one key, on a CPU with AVX2 and FMA.
bool wide_head_attention_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads);

// Whether training should keep the probabilities for backward rather than recompute them: when they take at most
// 64 MiB (SD-1.5's 32x32 self-attention at batch 1 keeps 32 MiB in float32, 16 MiB in bf16). Above, at SD's 64x64
// latents, recomputing ties with writing and reading them back (bench_attention: 454 against 463 ms forward + backward
// for SD-1.5 at 512²), and the SD-2 base step at 512² ran as fast with 0.7 GiB less (docs/benchmarks.md, eighteenth
// sitting); at 32x32 keeping is 10% faster.
bool wide_head_attention_worth_keeping_probabilities(const at::Tensor& q, const at::Tensor& k, int64_t heads);

// softmax(q kᵀ · scale) v per head: q [B, Lq, heads*d], k and v [B, Lk, heads*d] -> [B, Lq, heads*d];
// differentiable in q, k and v. `upcast_attention` (diffusers' option) keeps bf16 scores in float32. Without
// `keep_probabilities` forward keeps only each query row's maximum and sum, and backward recomputes the
// probabilities from q and k, to the bit: one more product per block instead of B x heads x Lq x Lk values kept.
at::Tensor wide_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                               double scale, bool upcast_attention = false, bool keep_probabilities = true);

}  // namespace sd::models

// Attention for heads of a few channels (tiny-sd1 has 4 and 8), fused into one pass per query row: the row's scores,
// its softmax and its output stay in a cache-resident buffer, and forward and backward are one autograd node each.
// LibTorch's path for such heads is ~20 ops per attention (head reshapes, copies, baddbmm, softmax, bmm and their
// backwards), each writing or reading the whole [B*heads, Lq, Lk] score matrix for only 4-8 multiply-adds per score.
// bench_attention, 2 threads, batch 2 x 8 heads of 4 over 256 tokens, forward + backward: 1.96 ms plain, 1.39 fused
// in bf16; 3.61 and 1.63 ms in float32 (docs/benchmarks.md, ninth sitting). On AVX-512 CPUs the kernels run on
// sixteen floats at a time instead of eight (sd::kernel_vector_bits): 1.45 -> 0.94 ms there in float32 (fifteenth
// sitting).
//
// The numbers follow diffusers' AttnProcessor: scores rounded to the inputs' dtype (unless upcast_attention), the
// softmax in float32 (max, exponentials, times the reciprocal of their sum), the probabilities rounded to v's dtype
// before they weight v, and the output summed in float32. In training, forward keeps the probabilities for backward
// while they take at most 16 MiB (1.5x faster forward + backward on tiny-sd1's attentions); beyond that, backward
// recomputes each row's probabilities from q, k and the saved row maximum and sum. Over kept probabilities (and
// heads of up to 8 channels) backward sums dk and dv over the rows in registers rather than adding each row's share
// in memory: 20% less backward time at 16x16 in bf16 on AVX-512, forward + backward 1.5x faster over 1024 keys
// (docs/benchmarks.md, twenty-third sitting). Backward keeps its gradients in float32 until they are written.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// Whether small_head_attention takes these inputs: float32 or bf16 CPU tensors of one dtype, heads of at most 16
// channels, and a CPU with AVX2 and FMA (elsewhere the caller's LibTorch path is the right one).
bool small_head_attention_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads);

// softmax(q kᵀ · scale) v per head, on the projections as the linear layers return them:
// q: [B, Lq, heads*d], k and v: [B, Lk, heads*d] -> [B, Lq, heads*d]; differentiable in q, k and v. `causal`: query
// i attends to keys 0 ... i only, as under CLIP's causal mask (the masked scores' probabilities are exact zeros).
// `keep_probabilities` false: backward recomputes them even where they would take less than 16 MiB (as
// --enable_xformers_memory_efficient_attention asks); the gradients are the same to the bit either way.
at::Tensor small_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                                double scale, bool upcast_attention, bool causal = false,
                                bool keep_probabilities = true);

}  // namespace sd::models

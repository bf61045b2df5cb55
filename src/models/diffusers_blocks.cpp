#include "models/diffusers_blocks.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/upsampling.h>

#include <cmath>

#include "core/error.h"
#include "models/fused_activations.h"
#include "models/fused_norm.h"
#include "models/head_layout.h"
#include "models/small_head_attention.h"
#include "models/tiled_attention.h"
#include "models/wide_head_attention.h"

namespace sd::models {

namespace nn = torch::nn;

Activation parse_activation(const std::string& name, const std::string& where) {
  if (name == "silu" || name == "swish") return Activation::SiLU;
  if (name == "mish") return Activation::Mish;
  if (name == "gelu") return Activation::GELU;
  if (name == "relu") return Activation::ReLU;
  fail("{}: unknown activation \"{}\" (expected silu, swish, mish, gelu or relu)", where, name);
}

at::Tensor activate(Activation act, const at::Tensor& x) {
  switch (act) {
    case Activation::SiLU: return fused_activation_fits(x) ? fused_silu(x) : at::silu(x);
    case Activation::Mish: return at::mish(x);
    case Activation::GELU: return at::gelu(x);
    case Activation::ReLU: return at::relu(x);
  }
  return x;
}

namespace {
bool is_full_precision(const at::Tensor& x) { return x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble; }
}  // namespace

at::Tensor group_norm(const nn::GroupNorm& norm, const at::Tensor& x) {
  const auto& o = norm->options;
  if (fused_norm_fits(x, norm->weight, norm->bias))
    return fused_group_norm(x, o.num_groups(), norm->weight, norm->bias, o.eps());
  if (is_full_precision(x) && norm->weight.scalar_type() == x.scalar_type()) return norm.ptr()->forward(x);
  return at::group_norm(x.to(at::kFloat), o.num_groups(), norm->weight.to(at::kFloat), norm->bias.to(at::kFloat),
                        o.eps())
      .to(x.scalar_type());
}

at::Tensor layer_norm(const nn::LayerNorm& norm, const at::Tensor& x) {
  const auto& o = norm->options;
  if (fused_norm_fits(x, norm->weight, norm->bias))
    return fused_layer_norm(x, o.normalized_shape(), norm->weight, norm->bias, o.eps());
  if (is_full_precision(x) && norm->weight.scalar_type() == x.scalar_type()) return norm.ptr()->forward(x);
  return at::layer_norm(x.to(at::kFloat), o.normalized_shape(), norm->weight.to(at::kFloat), norm->bias.to(at::kFloat),
                        o.eps())
      .to(x.scalar_type());
}

at::Tensor scaled_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v, double scale,
                            bool upcast_attention, bool upcast_softmax) {
  const auto dtype = q_in.scalar_type();
  // Inference at large sizes: the [B*heads, Lq, Lk] scores would be 1 GiB for SD at 64x64 latents with guidance.
  if (!at::GradMode::is_enabled() && q_in.size(1) * k_in.size(1) >= (1 << 16))
    return tiled_attention(q_in, k_in, v, scale, upcast_attention);
  at::Tensor q = upcast_attention ? q_in.to(at::kFloat) : q_in;
  at::Tensor k = upcast_attention ? k_in.to(at::kFloat) : k_in;
  at::Tensor scores;
  if (q.size(1) * q.size(2) * k.size(1) < 400) {
    // LibTorch 1.13's small-matrix baddbmm kernel (rows*cols*depth < 400) computes beta*out + alpha*acc on its
    // uninitialised output even for beta = 0, so garbage NaNs leak into the scores (measured: up to 90% of calls
    // for bf16). bmm never reads its output; for float32/64 bmm-then-scale rounds exactly like alpha*acc.
    scores = at::bmm(q, k.transpose(-1, -2)) * scale;
  } else {
    // diffusers' get_attention_scores without a mask: beta = 0 makes the GEMM ignore the uninitialised input.
    scores = at::baddbmm(at::empty({q.size(0), q.size(1), k.size(1)}, q.options()), q, k.transpose(-1, -2),
                         /*beta=*/0, /*alpha=*/scale);
  }
  if (upcast_softmax) scores = scores.to(at::kFloat);
  at::Tensor probs = scores.softmax(-1).to(dtype);
  return at::bmm(probs, v);
}

// ---------------------------------------------------------------------------------------------------------------

ResnetBlock2DImpl::ResnetBlock2DImpl(const ResnetBlock2DOptions& o) : options_(o) {
  norm1 = register_module("norm1", nn::GroupNorm(nn::GroupNormOptions(o.groups, o.in_channels).eps(o.eps)));
  conv1 = register_module("conv1", Conv2d(nn::Conv2dOptions(o.in_channels, o.out_channels, 3).stride(1).padding(1)));
  if (o.temb_channels > 0) time_emb_proj = register_module("time_emb_proj", Linear(o.temb_channels, o.out_channels));
  norm2 = register_module("norm2", nn::GroupNorm(nn::GroupNormOptions(o.groups, o.out_channels).eps(o.eps)));
  conv2 = register_module("conv2", Conv2d(nn::Conv2dOptions(o.out_channels, o.out_channels, 3).stride(1).padding(1)));
  if (o.in_channels != o.out_channels)
    conv_shortcut = register_module("conv_shortcut", Conv2d(nn::Conv2dOptions(o.in_channels, o.out_channels, 1)));
}

at::Tensor ResnetBlock2DImpl::forward(const at::Tensor& x, const at::Tensor& temb) {
  at::Tensor h = activate(options_.act, group_norm(norm1, x));
  h = conv1->forward(h);
  if (time_emb_proj && temb.defined()) {
    at::Tensor t = time_emb_proj->forward(activate(options_.act, temb));  // [N, Cout]
    h = h + t.unsqueeze(-1).unsqueeze(-1);
  }
  h = activate(options_.act, group_norm(norm2, h));
  // dropout: diffusers' configs for SD have dropout 0 (the config parser rejects anything else).
  h = conv2->forward(h);
  at::Tensor shortcut = conv_shortcut ? conv_shortcut->forward(x) : x;
  at::Tensor out = shortcut + h;
  // x / 1.0 is exact, so skipping it keeps the numbers identical.
  if (options_.output_scale_factor != 1.0) out = out / options_.output_scale_factor;
  return out;
}

// ---------------------------------------------------------------------------------------------------------------

Downsample2DImpl::Downsample2DImpl(int64_t channels, int64_t out_channels, int64_t padding) : padding_(padding) {
  conv = register_module("conv", Conv2d(nn::Conv2dOptions(channels, out_channels, 3).stride(2).padding(padding)));
}

at::Tensor Downsample2DImpl::forward(const at::Tensor& x) {
  if (padding_ == 0) return conv->forward(at::constant_pad_nd(x, {0, 1, 0, 1}, 0));
  return conv->forward(x);
}

Upsample2DImpl::Upsample2DImpl(int64_t channels, int64_t out_channels) {
  conv = register_module("conv", Conv2d(nn::Conv2dOptions(channels, out_channels, 3).padding(1)));
}

at::Tensor Upsample2DImpl::forward(const at::Tensor& x, const std::optional<std::vector<int64_t>>& output_size) {
  // diffusers upcasts bf16 to float32 around the interpolation only because old CUDA kernels lacked bf16;
  // nearest-neighbour copies values, so doing it in bf16 gives the same numbers.
  namespace F = torch::nn::functional;
  auto opts = F::InterpolateFuncOptions().mode(torch::kNearest);
  if (output_size)
    opts.size(*output_size);
  else
    opts.scale_factor(std::vector<double>{2.0, 2.0});
  return conv->forward(F::interpolate(x, opts));
}

// ---------------------------------------------------------------------------------------------------------------

AttentionImpl::AttentionImpl(const AttentionOptions& o) : options_(o) {
  const int64_t inner_dim = o.heads * o.dim_head;
  const int64_t context_dim = o.cross_attention_dim > 0 ? o.cross_attention_dim : o.query_dim;
  scale_ = std::pow(static_cast<double>(o.dim_head), -0.5);
  if (o.norm_num_groups > 0)
    group_norm = register_module(
        "group_norm", nn::GroupNorm(nn::GroupNormOptions(o.norm_num_groups, o.query_dim).eps(o.eps).affine(true)));
  to_q = register_module("to_q", Linear(nn::LinearOptions(o.query_dim, inner_dim).bias(o.bias)));
  to_k = register_module("to_k", Linear(nn::LinearOptions(context_dim, inner_dim).bias(o.bias)));
  to_v = register_module("to_v", Linear(nn::LinearOptions(context_dim, inner_dim).bias(o.bias)));
  to_out_proj_ = Linear(nn::LinearOptions(inner_dim, o.query_dim).bias(o.out_bias));
  to_out->push_back(to_out_proj_);
  to_out->push_back(nn::Dropout(0.0));
  register_module("to_out", to_out);
}

// q [B, Lq, heads*d], k and v [B, Lk, heads*d] -> [B, Lq, heads*d]
at::Tensor AttentionImpl::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
  const int64_t heads = options_.heads;
  // Training under --enable_xformers_memory_efficient_attention keeps no probabilities, nor does any training whose
  // probabilities would be large: backward recomputes them. The fused kernels' softmax is float32 whatever the
  // dtype, which is all upcast_softmax asks for.
  if (small_head_attention_fits(q, k, v, heads))
    return small_head_attention(q, k, v, heads, scale_, options_.upcast_attention, /*causal=*/false,
                                !memory_efficient_);
  if (wide_head_attention_fits(q, k, v, heads))
    return wide_head_attention(q, k, v, heads, scale_, options_.upcast_attention,
                               !memory_efficient_ && wide_head_attention_worth_keeping_probabilities(q, k, heads));
  const at::Tensor qh = head_to_batch_dim(q, heads), kh = head_to_batch_dim(k, heads), vh = head_to_batch_dim(v, heads);
  const at::Tensor out = memory_efficient_
                             ? tiled_attention(qh, kh, vh, scale_, options_.upcast_attention)
                             : scaled_attention(qh, kh, vh, scale_, options_.upcast_attention, options_.upcast_softmax);
  return batch_to_head_dim(out, heads);
}

at::Tensor AttentionImpl::forward(const at::Tensor& hidden, const at::Tensor& context) {
  const at::Tensor residual = hidden;
  at::Tensor h = hidden;
  const bool spatial = hidden.dim() == 4;
  int64_t n = 0, c = 0, height = 0, width = 0;
  if (spatial) {
    n = h.size(0), c = h.size(1), height = h.size(2), width = h.size(3);
    h = h.view({n, c, height * width}).transpose(1, 2);  // [N, HW, C]
  }
  if (group_norm) h = sd::models::group_norm(group_norm, h.transpose(1, 2)).transpose(1, 2);

  at::Tensor q = to_q->forward(h);
  const at::Tensor& kv_input = context.defined() ? context : h;
  at::Tensor k = to_k->forward(kv_input);
  at::Tensor v = to_v->forward(kv_input);
  at::Tensor out = to_out_proj_->forward(attend(q, k, v));  // to_out.1 is Dropout(0)

  if (spatial) out = out.transpose(-1, -2).reshape({n, c, height, width});
  if (options_.residual_connection) out = out + residual;
  if (options_.rescale_output_factor != 1.0) out = out / options_.rescale_output_factor;
  return out;
}

}  // namespace sd::models

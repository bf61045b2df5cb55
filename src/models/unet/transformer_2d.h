// diffusers' Transformer2DModel (the "spatial transformer" of SD's cross-attention blocks) and its parts:
// BasicTransformerBlock (self-attention, cross-attention, GEGLU feed-forward, each pre-LayerNorm + residual).
#pragma once
#include "models/diffusers_blocks.h"

namespace sd::models {

// proj (Linear dim -> 2*inner) split into value and gate: value * gelu(gate).
class GEGLUImpl : public torch::nn::Module {
 public:
  GEGLUImpl(int64_t dim_in, int64_t dim_out);
  // x: [N, L, dim_in] -> [N, L, dim_out]
  at::Tensor forward(const at::Tensor& x);

  Linear proj{nullptr};
};
TORCH_MODULE(GEGLU);

// net = [GEGLU(dim, 4*dim), Dropout, Linear(4*dim, dim)] — parameter names ff.net.0.proj, ff.net.2.
class FeedForwardImpl : public torch::nn::Module {
 public:
  explicit FeedForwardImpl(int64_t dim, int64_t mult = 4);
  // x: [N, L, dim] -> [N, L, dim]
  at::Tensor forward(const at::Tensor& x);

  torch::nn::ModuleList net;

 private:
  GEGLU geglu_{nullptr};
  Linear out_{nullptr};
};
TORCH_MODULE(FeedForward);

struct TransformerBlockOptions {
  int64_t dim = 0;
  int64_t heads = 8;
  int64_t dim_head = 64;
  int64_t cross_attention_dim = 0;
  bool upcast_attention = false;
};

class BasicTransformerBlockImpl : public torch::nn::Module {
 public:
  explicit BasicTransformerBlockImpl(const TransformerBlockOptions& options);
  // x: [N, L, dim], context: [N, Lk, cross_attention_dim] -> [N, L, dim]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context);

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  Attention attn1{nullptr}, attn2{nullptr};
  FeedForward ff{nullptr};
};
TORCH_MODULE(BasicTransformerBlock);

struct Transformer2DOptions {
  int64_t in_channels = 0;
  int64_t heads = 8;
  int64_t dim_head = 64;
  int64_t num_layers = 1;
  int64_t cross_attention_dim = 0;
  int64_t norm_num_groups = 32;
  bool use_linear_projection = false;  // SD-2: Linear proj_in/proj_out on tokens; SD-1: 1×1 convs on the map
  bool upcast_attention = false;
};

// GroupNorm → proj_in → tokens → transformer_blocks → proj_out → + input.
class Transformer2DModelImpl : public torch::nn::Module {
 public:
  explicit Transformer2DModelImpl(const Transformer2DOptions& options);
  // x: [N, C, H, W], context: [N, Lk, cross_attention_dim] -> [N, C, H, W]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context);

  torch::nn::GroupNorm norm{nullptr};
  torch::nn::ModuleList transformer_blocks;

 private:
  Transformer2DOptions options_;
  // Registered as proj_in / proj_out; which pair exists depends on use_linear_projection.
  Conv2d proj_in_conv_{nullptr}, proj_out_conv_{nullptr};
  Linear proj_in_linear_{nullptr}, proj_out_linear_{nullptr};
  std::vector<BasicTransformerBlock> blocks_;
};
TORCH_MODULE(Transformer2DModel);

}  // namespace sd::models

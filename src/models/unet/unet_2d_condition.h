// UNet2DConditionModel (diffusers 0.24) for SD-1.x / SD-2.x: the noise-prediction network, its loader and an
// analytic parameter count.
#pragma once
#include <filesystem>
#include <string>

#include "io/tensor_file.h"
#include "models/unet/unet_blocks.h"
#include "models/unet/unet_config.h"
#include "models/unet/unet_memory_options.h"

namespace sd::models {

// diffusers' get_timestep_embedding as Timesteps(dim, flip_sin_to_cos, freq_shift) calls it, always in float32.
// timesteps: [N] any real or integer dtype -> [N, dim] float32
at::Tensor timestep_embedding(const at::Tensor& timesteps, int64_t dim, bool flip_sin_to_cos, double freq_shift);

// linear_1 → act → linear_2.
class TimestepEmbeddingImpl : public torch::nn::Module {
 public:
  TimestepEmbeddingImpl(int64_t in_channels, int64_t time_embed_dim, Activation act);
  // x: [N, in] -> [N, time_embed_dim]
  at::Tensor forward(const at::Tensor& x);

  Linear linear_1{nullptr}, linear_2{nullptr};

 private:
  Activation act_;
};
TORCH_MODULE(TimestepEmbedding);

//   sample ─ conv_in ─ down_blocks ─ mid_block ─ up_blocks (+ skips) ─ conv_norm_out ─ act ─ conv_out
//   timestep ─ time_proj (sinusoidal) ─ time_embedding ─────┘ (into every resnet)
//   encoder_hidden_states ───────────────────────────────────┘ (into every cross-attention)
class UNet2DConditionModelImpl : public torch::nn::Module {
 public:
  explicit UNet2DConditionModelImpl(UNetConfig config);

  // sample: [N, in_channels, H, W]; timestep: [N] or [] (int64 or floating, broadcast to N);
  // encoder_hidden_states: [N, L, cross_attention_dim] -> [N, out_channels, H, W]
  at::Tensor forward(const at::Tensor& sample, const at::Tensor& timestep, const at::Tensor& encoder_hidden_states);

  void set_memory_options(const UNetMemoryOptions& o);
  // Recompute blocks in the backward pass instead of storing their activations: the down and up blocks working at
  // the `levels` highest resolutions, which hold most of the activations (a level has a quarter of the pixels of
  // the one above and twice the channels: about the same convolution work, half the activations; the trade is
  // measured in docs/benchmarks.md). levels = resolution_levels() checkpoints every block, the mid block too.
  void set_checkpointed_levels(int levels);
  int checkpointed_levels() const { return checkpointed_levels_; }
  int resolution_levels() const { return static_cast<int>(down_.size()); }
  // Every attention layer trains with the tiled attention (AttentionImpl::set_memory_efficient).
  void set_memory_efficient_attention(bool enabled);

  const UNetConfig& config() const { return config_; }

  // named_parameters() in the order forward first uses them, so backward produces their gradients in about the
  // reverse order (what gradient buckets are filled and sent in). Registration order differs: a block registers all
  // its resnets before its attentions but runs them interleaved, and the embeddings run before conv_in.
  std::vector<std::pair<std::string, at::Tensor>> named_parameters_in_forward_order() const;

  Conv2d conv_in{nullptr}, conv_out{nullptr};
  TimestepEmbedding time_embedding{nullptr};
  torch::nn::ModuleList down_blocks, up_blocks;
  UNetMidBlock2DCrossAttn mid_block{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};

 private:
  std::vector<at::Tensor> run_down(size_t i, const at::Tensor& h, const at::Tensor& temb, const at::Tensor& context);
  at::Tensor run_mid(const at::Tensor& h, const at::Tensor& temb, const at::Tensor& context);
  at::Tensor run_up(size_t i, const at::Tensor& h, const std::vector<at::Tensor>& skips, const at::Tensor& temb,
                    const at::Tensor& context, const std::optional<std::vector<int64_t>>& upsample_size);

  // Down block i and up block n-1-i work at level i (0: the input's resolution); the mid block at level n-1.
  bool checkpoints_level(size_t level) const { return static_cast<int>(level) < checkpointed_levels_; }

  UNetConfig config_;
  Activation act_;
  std::vector<UNetDownBlock> down_;
  std::vector<UNetUpBlock> up_;
  int checkpointed_levels_ = 0;
};
TORCH_MODULE(UNet2DConditionModel);

// Reads a diffusers `unet/` folder (config.json and the weights open_weights picks, of `variant` if given) into a
// model of `dtype` (float32 or bfloat16; stored float16/bfloat16/float32 weights are converted).
UNet2DConditionModel load_unet(const std::filesystem::path& dir, at::ScalarType dtype = at::kFloat,
                               const std::string& variant = "");
// The same from a config and weights already opened (e.g. the UNet part of a single-file checkpoint).
UNet2DConditionModel load_unet(UNetConfig config, const io::TensorFile& weights, at::ScalarType dtype = at::kFloat);

// Parameters a UNet2DConditionModel built from `config` has, computed from the config alone (so the count of
// SD-1.5's 860M-parameter UNet needs no memory).
int64_t count_parameters(const UNetConfig& config);

// Floating-point operations of one forward pass (2 per multiply-add) of convolutions, linear layers and the
// attention matmuls (q.kT and probs.v), counted from the config for a batch of `batch` latents of height x width and
// a text context of `context_length` tokens. Norms, activations and other elementwise work are left out, as MFU
// conventionally counts. A training step (forward, backward for activations and for weights) costs 3x this.
int64_t count_forward_flops(const UNetConfig& config, int64_t batch, int64_t height, int64_t width,
                            int64_t context_length = 77);

}  // namespace sd::models

// The LoRA seam of the models: Linear and Conv2d layers that can carry low-rank adapters, as diffusers'
// LoRACompatibleLinear / LoRACompatibleConv do:
//   output = base(x) + Σ scale · (alpha / rank) · up(down(x))
// The model files build their layers from these types and know nothing else of LoRA; adapters are attached from
// outside by module path (e.g. "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"), are not module
// parameters (so weight files load and save exactly as before), and can be merged into the base weight.
#pragma once
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/options/conv.h>
#include <torch/nn/options/linear.h>

#include <string>
#include <vector>

#include "models/conv2d.h"

namespace sd::models {

struct LoraAdapter {
  at::Tensor down;   // Linear: [rank, in]; Conv2d: [rank, in, kh, kw] (the base's kernel, stride and padding)
  at::Tensor up;     // Linear: [out, rank]; Conv2d: [out, rank, 1, 1]
  double alpha = 0;  // the file's or trainer's alpha; the adapter's output is multiplied by alpha / rank
  double scale = 1;  // the user's strength (--lora_scale, diffusers' cross_attention_kwargs["scale"])
  int64_t rank() const { return down.size(0); }
  double multiplier() const { return scale * alpha / static_cast<double>(rank()); }
};

// target += multiplier · delta (as many values as target), summed in at least float32 and rounded to target's dtype
// once; without a graph.
void add_in_float32(at::Tensor& target, const at::Tensor& delta, double multiplier);

// What a layer that can carry adapters offers. Adapters are applied in the input's dtype (a float32 adapter on a
// bf16 model is cast on the fly, keeping its gradient flowing to the float32 tensor).
class LoraHost {
 public:
  virtual ~LoraHost() = default;

  // Throws sd::Error naming `what` (e.g. the file and module) unless the shapes fit this layer.
  void add_adapter(LoraAdapter adapter, const std::string& what);
  const std::vector<LoraAdapter>& adapters() const { return adapters_; }
  // weight += Σ multiplier · up·down (computed in at least float32, stored in the weight's dtype); the adapters are
  // dropped, as diffusers' fuse_lora does.
  void merge_adapters();
  void remove_adapters() { adapters_.clear(); }
  // weight += multiplier · delta, delta holding as many values as the weight (a LyCORIS LoHa, LoKr or DoRA update,
  // which is not a low-rank product, so it is merged rather than attached). Summed in at least float32, as
  // merge_adapters. Throws sd::Error naming `what` unless the sizes fit.
  void add_to_weight(const at::Tensor& delta, double multiplier, const std::string& what);
  // bias += multiplier · delta (LyCORIS' full update of a layer, .diff_b), as add_to_weight. Throws sd::Error naming
  // `what` for a layer without a bias or a delta of another size.
  void add_to_bias(const at::Tensor& delta, double multiplier, const std::string& what);
  // The weight as it stands, with the updates added so far (a detached view, to read): what a DoRA update rescales.
  at::Tensor current_weight();

  // [out, in] or [out, in, kh, kw]: what the adapters must fit.
  virtual at::IntArrayRef base_weight_shape() const = 0;

 protected:
  // base_output + the adapters' outputs for input x.
  at::Tensor add_adapter_outputs(const at::Tensor& x, const at::Tensor& base_output) const;

 private:
  virtual at::Tensor& base_weight() = 0;
  virtual at::Tensor& base_bias() = 0;  // undefined without one
  // up(down(x)) with the layer's own geometry.
  virtual at::Tensor low_rank_output(const at::Tensor& x, const at::Tensor& down, const at::Tensor& up) const = 0;

  std::vector<LoraAdapter> adapters_;
};

// While alive, the Linear and Conv2d layers below are built with uninitialised parameters: for models whose weights
// are all read next (models/weights.h's load_weights is strict, so none stays unread). Otherwise they draw the
// default initialisation of LibTorch's (and PyTorch's) modules, which took 12 s of the 19 s that loading SD-1.5's UNet
// took on a 2-core VM, only to be overwritten.
class ScopedUninitializedLayers {
 public:
  ScopedUninitializedLayers();
  ~ScopedUninitializedLayers();
  ScopedUninitializedLayers(const ScopedUninitializedLayers&) = delete;
  ScopedUninitializedLayers& operator=(const ScopedUninitializedLayers&) = delete;

 private:
  bool previous_;
};

// torch::nn::Embedding(rows, dim), its weight drawn N(0, 1) as torch's is, unless a ScopedUninitializedLayers is
// alive (CLIP's 49408 x 768 token embedding took a quarter of a second to draw, only to be overwritten).
torch::nn::Embedding embedding_layer(int64_t rows, int64_t dim);

// torch::nn::Linear's parameters ("weight" [out, in], "bias" [out]) and initialisation, drawn in the same order.
class LinearImpl : public torch::nn::Cloneable<LinearImpl>, public LoraHost {
 public:
  LinearImpl(int64_t in_features, int64_t out_features)
      : LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options);
  void reset() override;
  // x: [..., in] -> [..., out] (models/linear.h)
  at::Tensor forward(const at::Tensor& x);
  at::IntArrayRef base_weight_shape() const override { return weight.sizes(); }

  torch::nn::LinearOptions options;
  at::Tensor weight, bias;  // bias undefined without one

 private:
  at::Tensor& base_weight() override { return weight; }
  at::Tensor& base_bias() override { return bias; }
  at::Tensor low_rank_output(const at::Tensor& x, const at::Tensor& down, const at::Tensor& up) const override;
};
TORCH_MODULE(Linear);

// torch::nn::Conv2d's parameters ("weight" [out, in, kh, kw], "bias" [out]) and initialisation, for the zero-padded,
// undilated, ungrouped convolutions of the SD models (other options are refused).
class Conv2dImpl : public torch::nn::Cloneable<Conv2dImpl>, public LoraHost {
 public:
  explicit Conv2dImpl(const torch::nn::Conv2dOptions& options);
  void reset() override;
  // x: [N, in, H, W] -> [N, out, H', W'] (models/conv2d.h)
  at::Tensor forward(const at::Tensor& x);
  at::IntArrayRef base_weight_shape() const override { return weight.sizes(); }
  // Bytes held for the frozen weight's input gradient (models/conv2d.h), 0 unless trained through while frozen.
  int64_t frozen_weight_bytes() const { return frozen_weight_->bytes(); }

  torch::nn::Conv2dOptions options;
  at::Tensor weight, bias;  // bias undefined without one

 private:
  at::IntArrayRef padding() const { return *c10::get<torch::ExpandingArray<2>>(options.padding()); }
  at::Tensor& base_weight() override { return weight; }
  at::Tensor& base_bias() override { return bias; }
  at::Tensor low_rank_output(const at::Tensor& x, const at::Tensor& down, const at::Tensor& up) const override;

  c10::intrusive_ptr<FrozenWeight> frozen_weight_ = c10::make_intrusive<FrozenWeight>();
};
TORCH_MODULE(Conv2d);

// The shapes {down, up} of a rank-`rank` adapter on a layer whose weight is [out, in] or [out, in, kh, kw].
std::pair<std::vector<int64_t>, std::vector<int64_t>> lora_adapter_shapes(at::IntArrayRef weight, int64_t rank);

// Every layer of `model` that can carry adapters, by module path, in module order.
std::vector<std::pair<std::string, LoraHost*>> lora_hosts(torch::nn::Module& model);
// The down and up tensors of every adapter attached anywhere in `model` (what a block reads besides its
// parameters, e.g. for gradient checkpointing).
std::vector<at::Tensor> adapter_tensors(const torch::nn::Module& model);
// What a checkpointed block reads besides its inputs: its parameters and any adapters attached to its layers.
std::vector<at::Tensor> parameters_and_adapters(const torch::nn::Module& block);
void merge_adapters(torch::nn::Module& model);

}  // namespace sd::models

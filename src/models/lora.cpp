#include "models/lora.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/conv.h>
#include <torch/nn/init.h>

#include <cmath>

#include "core/error.h"
#include "models/conv2d.h"
#include "models/linear.h"

namespace sd::models {

namespace {

std::string shape_str(at::IntArrayRef s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

thread_local bool layers_uninitialized = false;

// What LibTorch's Linear and Conv modules draw in reset_parameters(), in the same order from the same generator.
void initialize_as_torch_does(at::Tensor& weight, at::Tensor& bias) {
  torch::nn::init::kaiming_uniform_(weight, /*a=*/std::sqrt(5.0));
  if (!bias.defined()) return;
  const int64_t fan_in = std::get<0>(torch::nn::init::_calculate_fan_in_and_fan_out(weight));
  const double bound = 1 / std::sqrt(static_cast<double>(fan_in));
  torch::nn::init::uniform_(bias, -bound, bound);
}

// The layer's parameters, registered under torch::nn's names, initialised unless a ScopedUninitializedLayers is alive.
void register_layer_parameters(torch::nn::Module& layer, at::IntArrayRef weight_shape, bool with_bias,
                               at::Tensor& weight, at::Tensor& bias) {
  weight = layer.register_parameter("weight", torch::empty(weight_shape));
  bias = with_bias ? layer.register_parameter("bias", torch::empty({weight_shape[0]})) : at::Tensor();
  if (!layers_uninitialized) initialize_as_torch_does(weight, bias);
}

}  // namespace

void add_in_float32(at::Tensor& target, const at::Tensor& delta, double multiplier) {
  at::NoGradGuard no_grad;
  const at::ScalarType dtype = at::promote_types(target.scalar_type(), at::kFloat);
  const at::Tensor addend = delta.to(dtype).reshape(target.sizes());
  if (dtype == target.scalar_type())
    target.add_(addend, multiplier);  // no copy of a float32 weight
  else
    target.copy_(target.to(dtype).add_(addend, multiplier));
}

ScopedUninitializedLayers::ScopedUninitializedLayers() : previous_(layers_uninitialized) {
  layers_uninitialized = true;
}

ScopedUninitializedLayers::~ScopedUninitializedLayers() { layers_uninitialized = previous_; }

torch::nn::Embedding embedding_layer(int64_t rows, int64_t dim) {
  torch::nn::EmbeddingOptions options(rows, dim);
  if (layers_uninitialized) options._weight(torch::empty({rows, dim}));
  return torch::nn::Embedding(options);
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> lora_adapter_shapes(at::IntArrayRef weight, int64_t rank) {
  std::vector<int64_t> down(weight.begin(), weight.end()), up{weight[0], rank};
  down[0] = rank;
  if (weight.size() == 4) up.insert(up.end(), {1, 1});  // a 1x1 conv after the layer-shaped down conv
  return {down, up};
}

void LoraHost::add_adapter(LoraAdapter adapter, const std::string& what) {
  const at::IntArrayRef weight = base_weight_shape();
  SD_CHECK(adapter.down.defined() && adapter.up.defined() && adapter.down.dim() >= 1 && adapter.down.size(0) > 0,
           "{}: a LoRA needs a down and an up weight", what);
  const auto [down, up] = lora_adapter_shapes(weight, adapter.rank());
  SD_CHECK(adapter.down.sizes() == at::IntArrayRef(down) && adapter.up.sizes() == at::IntArrayRef(up),
           "{}: LoRA down {} / up {} do not fit the layer's weight {} (expected down {}, up {})", what,
           shape_str(adapter.down.sizes()), shape_str(adapter.up.sizes()), shape_str(weight), shape_str(down),
           shape_str(up));
  adapters_.push_back(std::move(adapter));
}

void LoraHost::merge_adapters() {
  at::NoGradGuard no_grad;
  at::Tensor& weight = base_weight();
  // Each adapter's product added in at least float32, then rounded to the weight's dtype: diffusers 0.24's _fuse_lora
  // for its one adapter per layer.
  const at::ScalarType dtype = at::promote_types(weight.scalar_type(), at::kFloat);
  for (const LoraAdapter& a : adapters_)
    add_in_float32(weight, at::mm(a.up.to(dtype).flatten(1), a.down.to(dtype).flatten(1)), a.multiplier());
  adapters_.clear();
}

void LoraHost::add_to_weight(const at::Tensor& delta, double multiplier, const std::string& what) {
  at::Tensor& weight = base_weight();
  SD_CHECK(delta.numel() == weight.numel(), "{}: an update of {} values does not fit the layer's weight {}", what,
           delta.numel(), shape_str(weight.sizes()));
  add_in_float32(weight, delta, multiplier);
}

void LoraHost::add_to_bias(const at::Tensor& delta, double multiplier, const std::string& what) {
  at::Tensor& bias = base_bias();
  SD_CHECK(bias.defined(), "{}: a bias update for a layer without a bias", what);
  SD_CHECK(delta.numel() == bias.numel(), "{}: a bias update of {} values does not fit the layer's bias {}", what,
           delta.numel(), shape_str(bias.sizes()));
  add_in_float32(bias, delta, multiplier);
}

at::Tensor LoraHost::current_weight() { return base_weight().detach(); }

at::Tensor LoraHost::add_adapter_outputs(const at::Tensor& x, const at::Tensor& base_output) const {
  at::Tensor out = base_output;
  for (const LoraAdapter& a : adapters_) {
    const at::ScalarType dtype = x.scalar_type();
    out = out + low_rank_output(x, a.down.to(dtype), a.up.to(dtype)) * a.multiplier();
  }
  return out;
}

LinearImpl::LinearImpl(const torch::nn::LinearOptions& layer_options) : options(layer_options) { reset(); }

void LinearImpl::reset() {
  register_layer_parameters(*this, {options.out_features(), options.in_features()}, options.bias(), weight, bias);
}

at::Tensor LinearImpl::forward(const at::Tensor& x) { return add_adapter_outputs(x, models::linear(x, weight, bias)); }

at::Tensor LinearImpl::low_rank_output(const at::Tensor& x, const at::Tensor& down, const at::Tensor& up) const {
  return models::linear(models::linear(x, down, {}), up, {});
}

Conv2dImpl::Conv2dImpl(const torch::nn::Conv2dOptions& layer_options) : options(layer_options) {
  const auto& o = options;
  SD_CHECK(c10::get_if<torch::ExpandingArray<2>>(&o.padding()) &&
               c10::get_if<torch::enumtype::kZeros>(&o.padding_mode()) && o.groups() == 1 && (*o.dilation())[0] == 1 &&
               (*o.dilation())[1] == 1,
           "Conv2d: only zero-padded, undilated, ungrouped convolutions are supported");
  reset();
}

void Conv2dImpl::reset() {
  const auto& o = options;
  register_layer_parameters(*this, {o.out_channels(), o.in_channels(), (*o.kernel_size())[0], (*o.kernel_size())[1]},
                            o.bias(), weight, bias);
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) {
  return add_adapter_outputs(x, conv2d(x, weight, bias, *options.stride(), padding(), frozen_weight_));
}

at::Tensor Conv2dImpl::low_rank_output(const at::Tensor& x, const at::Tensor& down, const at::Tensor& up) const {
  namespace F = torch::nn::functional;
  const auto& o = options;
  const at::Tensor h =
      F::conv2d(x, down, F::Conv2dFuncOptions().stride(o.stride()).padding(o.padding()).dilation(o.dilation()));
  return at::conv2d(h, up);
}

std::vector<std::pair<std::string, LoraHost*>> lora_hosts(torch::nn::Module& model) {
  std::vector<std::pair<std::string, LoraHost*>> hosts;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false))
    if (auto* host = dynamic_cast<LoraHost*>(item.value().get())) hosts.emplace_back(item.key(), host);
  return hosts;
}

std::vector<at::Tensor> adapter_tensors(const torch::nn::Module& model) {
  std::vector<at::Tensor> tensors;
  for (const auto& module : model.modules(/*include_self=*/true))
    if (const auto* host = dynamic_cast<const LoraHost*>(module.get()))
      for (const LoraAdapter& a : host->adapters()) tensors.insert(tensors.end(), {a.down, a.up});
  return tensors;
}

std::vector<at::Tensor> parameters_and_adapters(const torch::nn::Module& block) {
  std::vector<at::Tensor> tensors = block.parameters(/*recurse=*/true);
  for (const at::Tensor& t : adapter_tensors(block)) tensors.push_back(t);
  return tensors;
}

void merge_adapters(torch::nn::Module& model) {
  for (auto& [path, host] : lora_hosts(model)) host->merge_adapters();
}

}  // namespace sd::models

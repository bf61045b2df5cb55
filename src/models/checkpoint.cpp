#include "models/checkpoint.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace sd::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The block function travels to backward() inside the context's saved_data, which only holds IValues.
struct FunctionHolder : torch::CustomClassHolder {
  explicit FunctionHolder(BlockFunction f) : fn(std::move(f)) {}
  BlockFunction fn;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // `tensors` = inputs followed by params. The inputs are saved for the recomputation; the params are kept as
  // they are (the very leaf tensors the module's forward reads), so the recomputed graph reaches them.
  static variable_list forward(AutogradContext* ctx, const BlockFunction& fn, int64_t num_inputs,
                               at::TensorList tensors) {
    variable_list inputs(tensors.begin(), tensors.begin() + num_inputs);
    ctx->save_for_backward(inputs);
    ctx->saved_data["fn"] = c10::IValue::make_capsule(c10::make_intrusive<FunctionHolder>(fn));
    c10::List<at::Tensor> params;
    for (size_t i = num_inputs; i < tensors.size(); ++i) params.push_back(tensors[i]);
    ctx->saved_data["params"] = params;
    c10::List<bool> needs;
    for (const auto& t : tensors) needs.push_back(t.requires_grad());
    ctx->saved_data["needs_grad"] = needs;
    return fn(inputs);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const auto holder = ctx->saved_data["fn"].toCapsule();
    const BlockFunction& fn = static_cast<FunctionHolder*>(holder.get())->fn;
    const auto params = ctx->saved_data["params"].toTensorList();
    const auto needs = ctx->saved_data["needs_grad"].toBoolList();
    const size_t num_inputs = saved.size();

    // Recompute from fresh leaves, so the inner graph stops at this node's boundary.
    variable_list inputs;
    for (size_t i = 0; i < num_inputs; ++i) {
      at::Tensor x = saved[i].detach();
      if (needs[i]) x.requires_grad_(true);
      inputs.push_back(x);
    }
    variable_list outputs;
    {
      at::AutoGradMode enable(true);
      outputs = fn(inputs);
    }

    // Differentiate only with respect to what needs a gradient, through the outputs that received one.
    variable_list wrt;
    std::vector<size_t> wrt_slot;  // index into the forward's tensor arguments
    for (size_t i = 0; i < needs.size(); ++i) {
      if (!needs[i]) continue;
      wrt.push_back(i < num_inputs ? inputs[i] : params.get(i - num_inputs));
      wrt_slot.push_back(i);
    }
    variable_list out_used, grad_used;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].requires_grad() && grad_outputs[i].defined())
        out_used.push_back(outputs[i]), grad_used.push_back(grad_outputs[i]);

    // One gradient slot per forward argument: fn, num_inputs, then each tensor.
    variable_list result(2 + needs.size());
    if (!wrt.empty() && !out_used.empty()) {
      variable_list grads = torch::autograd::grad(out_used, wrt, grad_used, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t i = 0; i < grads.size(); ++i) result[2 + wrt_slot[i]] = grads[i];
    }
    return result;
  }
};

}  // namespace

TensorList checkpoint(const BlockFunction& fn, const TensorList& inputs, const TensorList& params) {
  bool any_grad = false;
  for (const auto& t : inputs) any_grad |= t.defined() && t.requires_grad();
  for (const auto& t : params) any_grad |= t.requires_grad();
  if (!at::GradMode::is_enabled() || !any_grad) return fn(inputs);
  // Autograd nodes cannot take undefined tensors (an absent context, say): pass the defined inputs only and put
  // the undefined ones back in place for fn.
  std::vector<bool> defined;
  TensorList tensors;
  for (const auto& t : inputs) {
    defined.push_back(t.defined());
    if (t.defined()) tensors.push_back(t);
  }
  const auto num_inputs = static_cast<int64_t>(tensors.size());
  BlockFunction on_defined = [fn, defined](const TensorList& present) {
    TensorList all;
    size_t next = 0;
    for (bool d : defined) all.push_back(d ? present[next++] : at::Tensor());
    return fn(all);
  };
  tensors.insert(tensors.end(), params.begin(), params.end());
  return CheckpointFunction::apply(on_defined, num_inputs, at::TensorList(tensors));
}

}  // namespace sd::models

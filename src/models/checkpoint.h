// Gradient checkpointing for LibTorch 1.13, whose C++ API has no torch::utils::checkpoint: a custom autograd
// Function that runs a block without recording its graph and runs it again, recording, in the backward pass.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace sd::models {

using TensorList = std::vector<at::Tensor>;
using BlockFunction = std::function<TensorList(const TensorList& inputs)>;

// Returns fn(inputs), keeping only `inputs` for the backward pass instead of fn's intermediate activations.
// `params` are the parameters fn reads (from its module): their gradients are computed in the recomputation and
// returned through this node, so they accumulate like any other gradient and frozen parameters are skipped.
// fn must be deterministic (no dropout/RNG) and must not return one of its inputs or the same tensor twice.
// When no gradient is needed (grad mode off, or nothing requires grad) fn is simply called.
TensorList checkpoint(const BlockFunction& fn, const TensorList& inputs, const TensorList& params);

}  // namespace sd::models

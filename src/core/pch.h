// Precompiled header: the heavy third-party headers almost every translation unit needs, and nothing more.
// A precompiled header saves parsing but not GCC's deferred template instantiations, which every translation unit
// including it redoes at its end: with <torch/nn.h>, <torch/optim.h> and <torch/serialize.h> in here an empty file
// took 7.9 s to compile, without them 2.9 s. The model files that need torch::nn include it themselves (~2 s more
// each); the other two thirds of the files compile in about half the time (docs/benchmarks.md, "Build time").
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <fmt/format.h>
#include <map>
#include <memory>
#include <string>
#include <vector>

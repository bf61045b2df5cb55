// Precompiled header: the heavy third-party headers almost every translation unit needs.
#pragma once
#include <torch/nn.h>
#include <torch/optim.h>
#include <torch/serialize.h>
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <fmt/format.h>
#include <map>
#include <memory>
#include <string>
#include <vector>

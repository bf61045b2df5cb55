// Precompiled for the fuzz build: the heavy headers most reader sources include (each costs ~30 s under clang with
// the sanitizers otherwise).
#pragma once
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

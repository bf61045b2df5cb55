// What UNet training may trade of its speed for memory, as the flags of every UNet-training subcommand give it
// (cli/training_flags.h); UNet2DConditionModelImpl::set_memory_options applies it.
#pragma once
#include <optional>

namespace sd::models {

struct UNetMemoryOptions {
  bool gradient_checkpointing = false;  // recompute every block in backward (diffusers' gradient checkpointing)
  std::optional<int> gradient_checkpointing_levels;  // only the blocks at this many of the highest resolutions
  bool memory_efficient_attention = false;  // tiled attention that keeps no attention probabilities for backward
};

}  // namespace sd::models

// The flags every training subcommand takes (batching, optimizer, lr schedule, EMA, checkpoints, logging,
// precision, distributed), defined once. A subcommand sets its reference script's defaults in the options before
// registering them, so --help shows the right ones.
#pragma once
#include <CLI/CLI.hpp>

#include "models/unet/unet_memory_options.h"
#include "train/trainer.h"

namespace sd::cli {

void add_trainer_flags(CLI::App* cmd, train::TrainerOptions& o);

// --gradient_checkpointing[_levels] and --enable_xformers_memory_efficient_attention (alias
// --memory_efficient_attention): the UNet's two ways to trade speed for memory, for every subcommand that trains
// through a UNet.
void add_unet_memory_flags(CLI::App* cmd, models::UNetMemoryOptions& o, const std::string& group);

// --lora_format (diffusers, or also a kohya/A1111 file) for the subcommands that train LoRA adapters; it needs
// `lora_switch`, the flag that chooses LoRA training.
CLI::Option* add_lora_format_flag(CLI::App* cmd, std::string& format, CLI::Option* lora_switch,
                                  const std::string& group);

// Flags of diffusers' scripts that only make sense in Python (hub uploads, xformers, ...): accepted so command
// lines carry over, each with a one-line note when used.
void add_python_only_training_flags(CLI::App* cmd);

// Records the command line in o.run_info (for <logging_dir>/run.json); call from the subcommand's callback.
void record_command_line(CLI::App* cmd, train::TrainerOptions& o);

}  // namespace sd::cli

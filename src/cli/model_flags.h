// The flags that name a model, alike in every subcommand: the model itself (a diffusers pipeline folder, a
// single-file checkpoint or a Hub name in the local Hugging Face cache) and its companions --revision, --variant and
// --config_from, read into a pipeline::ModelRequest for pipeline::resolve_model.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "pipeline/model_source.h"

namespace sd::cli {

// Registers the model as `name` (a flag such as "--model", or a positional argument such as "input") and its
// companions, all in `group`; returns the model's option (to mark it required). `variant_flag` renames --variant
// where that name means something else (convert's output variant).
CLI::Option* add_model_flags(CLI::App* cmd, const std::string& name, pipeline::ModelRequest& request,
                             const std::string& group = "Model", const std::string& variant_flag = "--variant");

}  // namespace sd::cli

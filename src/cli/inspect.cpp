// `sdtrain inspect MODEL`: each component's parameter count, dtype and size, read from the weight files' headers
// alone (nothing is loaded), and MosaicML's summary line (UNet trainable, VAE and text encoder frozen). MODEL is
// anything a model flag accepts.
#include <cstdio>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "pipeline/model_source.h"

namespace sd::cli {

namespace {

int run_inspect(const pipeline::ModelRequest& model) {
  const auto components = pipeline::summarize_components(pipeline::resolve_model(model));
  for (const auto& c : components) {
    std::string dtypes;
    for (const auto& d : c.dtypes) dtypes += (dtypes.empty() ? "" : ",") + d;
    std::printf("%-13s %-22s %14.6f M params  %-9s %9.2f MB\n", c.name.c_str(), c.class_name.c_str(),
                static_cast<double>(c.parameters) / 1e6, dtypes.c_str(), static_cast<double>(c.bytes) / 1e6);
  }
  std::printf("%s\n", pipeline::parameter_line(components).c_str());
  return 0;
}

}  // namespace

void add_inspect(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand("inspect", "Parameter counts, dtypes and sizes of a model's components");
  auto model = std::make_shared<pipeline::ModelRequest>();
  add_model_flags(cmd, "model", *model)->required();
  cmd->callback([model, &chosen] { chosen = [model] { return run_inspect(*model); }; });
}

}  // namespace sd::cli

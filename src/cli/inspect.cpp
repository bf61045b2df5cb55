// `sdtrain inspect DIR`: each component's parameter count, dtype and size, read from the safetensors headers
// alone (nothing is loaded), and MosaicML's summary line (UNet trainable, VAE and text encoder frozen).
#include <cstdio>

#include "cli/commands.h"
#include "cli/flags.h"
#include "pipeline/stable_diffusion.h"

namespace sd::cli {

namespace fs = std::filesystem;

namespace {

int run_inspect(const std::string& dir_arg) {
  const auto components = pipeline::summarize_components(dir_arg);
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
  auto* cmd = app.add_subcommand("inspect", "Parameter counts, dtypes and sizes of a pipeline's components");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("dir", *dir, "Pipeline folder (diffusers layout)")->required();
  cmd->callback([dir, &chosen] { chosen = [dir] { return run_inspect(*dir); }; });
}

}  // namespace sd::cli

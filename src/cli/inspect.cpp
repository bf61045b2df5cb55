// `sdtrain inspect DIR`: each component's parameter count, dtype and size, read from the safetensors headers
// alone (nothing is loaded), and MosaicML's summary line (UNet trainable, VAE and text encoder frozen).
#include <cstdio>
#include <set>

#include "cli/commands.h"
#include "cli/flags.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "pipeline/stable_diffusion.h"

namespace sd::cli {

namespace fs = std::filesystem;

namespace {

struct ComponentInfo {
  int64_t parameters = 0;
  std::set<std::string> dtypes;
  uintmax_t bytes = 0;
};

// Floating-point tensors are parameters; integer ones (a stored position_ids buffer) are not.
ComponentInfo component_info(const fs::path& weights) {
  io::SafeTensorsFile file(weights);
  ComponentInfo info;
  for (const auto& name : file.names()) {
    const auto& entry = file.entry(name);
    if (!at::isFloatingType(entry.dtype)) continue;
    int64_t n = 1;
    for (int64_t d : entry.shape) n *= d;
    info.parameters += n;
    info.dtypes.insert(entry.dtype == at::kHalf       ? "float16"
                       : entry.dtype == at::kBFloat16 ? "bfloat16"
                       : entry.dtype == at::kDouble   ? "float64"
                                                      : "float32");
  }
  info.bytes = fs::file_size(weights);
  return info;
}

int run_inspect(const std::string& dir_arg) {
  const fs::path dir = dir_arg;
  pipeline::check_pipeline_layout(dir);
  const auto index = io::JsonConfig::load(dir / "model_index.json");
  struct Part {
    const char* name;
    const char* file;
    bool trainable;
  };
  const Part parts[] = {{"unet", "diffusion_pytorch_model.safetensors", true},
                        {"vae", "diffusion_pytorch_model.safetensors", false},
                        {"text_encoder", "model.safetensors", false}};
  int64_t total = 0, trainable = 0;
  for (const auto& part : parts) {
    ComponentInfo info = component_info(dir / part.name / part.file);
    std::string cls = index.raw().contains(part.name) ? index.raw()[part.name][1].get<std::string>() : "?";
    std::string dtypes;
    for (const auto& d : info.dtypes) dtypes += (dtypes.empty() ? "" : ",") + d;
    std::printf("%-13s %-22s %14.6f M params  %-9s %9.2f MB\n", part.name, cls.c_str(), info.parameters / 1e6,
                dtypes.c_str(), static_cast<double>(info.bytes) / 1e6);
    total += info.parameters;
    if (part.trainable) trainable += info.parameters;
  }
  std::printf("Model has %.6f M parameters and %.6f M trainable\n", total / 1e6, trainable / 1e6);
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

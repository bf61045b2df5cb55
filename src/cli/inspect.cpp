// `sdtrain inspect MODEL`: each component's parameter count, dtype and size, read from the weight files' headers
// alone (nothing is loaded), and MosaicML's summary line (UNet trainable, VAE and text encoder frozen). MODEL is
// anything a model flag accepts, or a LoRA file (any format generate --lora reads): its modules by kind with their
// ranks and alphas, its size and its metadata (kohya's ss_* training record).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "pipeline/lora_file.h"
#include "pipeline/model_source.h"

namespace sd::cli {

namespace {

// Metadata values can be long (kohya's ss_tag_frequency is a JSON of every caption tag): one line each.
std::string one_line(std::string value) {
  for (char& c : value)
    if (c == '\n' || c == '\r') c = ' ';
  return value.size() > 100 ? value.substr(0, 97) + "..." : value;
}

void print_lora_summary(const std::string& path, const pipeline::LoraFileSummary& s) {
  std::printf("%s: %sLoRA file (%s names): %lld modules (UNet %lld, text encoder %lld), %.6f M params, %s, %.2f MB\n",
              path.c_str(), s.sdxl ? "SDXL " : "", fmt::format("{}", fmt::join(s.namings, ", ")).c_str(),
              static_cast<long long>(s.unet_modules + s.text_encoder_modules), static_cast<long long>(s.unet_modules),
              static_cast<long long>(s.text_encoder_modules), static_cast<double>(s.weights.parameters) / 1e6,
              fmt::format("{}", fmt::join(s.weights.dtypes, ",")).c_str(), static_cast<double>(s.weights.bytes) / 1e6);
  for (const auto& [kind, k] : s.kinds) {
    const std::string ranks = k.ranks.empty() ? "-" : fmt::format("{}", fmt::join(k.ranks, ", "));
    // Without an alpha a LoRA scales by alpha / rank = 1, and so does a LyCORIS update.
    const std::string alphas = k.alphas.empty() ? "none (scale 1)" : fmt::format("{}", fmt::join(k.alphas, ", "));
    std::printf("  %-10s %5lld modules  rank %s  alpha %s\n", kind.c_str(), static_cast<long long>(k.modules),
                ranks.c_str(), alphas.c_str());
  }
  for (const auto& [key, value] : s.metadata) std::printf("  %s: %s\n", key.c_str(), one_line(value).c_str());
}

// A LoRA file given as the model, or a folder holding one (not a pipeline folder, which inspect summarizes).
std::optional<std::filesystem::path> lora_file_of(const std::string& given) {
  if (std::filesystem::exists(std::filesystem::path(given) / "model_index.json")) return std::nullopt;
  return pipeline::find_lora_file(given);
}

int run_inspect(const pipeline::ModelRequest& model) {
  if (const auto lora = lora_file_of(model.name_or_path)) {
    if (const auto summary = pipeline::summarize_lora_file(*lora)) {
      print_lora_summary(lora->string(), *summary);
      return 0;
    }
  }
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
  auto* cmd = app.add_subcommand(
      "inspect",
      "Parameter counts, dtypes and sizes of a model's components, or a LoRA file's modules, ranks and alphas");
  auto model = std::make_shared<pipeline::ModelRequest>();
  add_model_flags(cmd, "model", *model)->required();
  cmd->callback([model, &chosen] { chosen = [model] { return run_inspect(*model); }; });
}

}  // namespace sd::cli

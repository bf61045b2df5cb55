// `sdtrain init --preset NAME --out DIR [--seed N] [--save_dtype T] [--overwrite]`: a randomly initialised pipeline in
// the diffusers layout, for training from scratch, benchmarks and demos.
#include <cstdio>

#include "cli/commands.h"
#include "cli/flags.h"
#include "io/atomic_file.h"
#include "pipeline/presets.h"
#include "pipeline/stable_diffusion.h"

namespace sd::cli {

namespace {

struct InitOptions {
  std::string preset;
  std::string out;
  uint64_t seed = 0;
  std::string save_dtype = "float32";
  bool overwrite = false;
};

int run_init(const InitOptions& o) {
  const at::ScalarType dtype = o.save_dtype == "float16"    ? at::kHalf
                               : o.save_dtype == "bfloat16" ? at::kBFloat16
                                                            : at::kFloat;
  pipeline::check_not_replacing_pipeline("--out", o.out, o.overwrite);
  io::check_output_dir("--out", o.out);
  pipeline::write_preset(o.preset, o.seed, o.out, dtype);
  std::printf("%s\n", o.out.c_str());
  return 0;
}

}  // namespace

void add_init(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand("init", "Write a randomly initialised pipeline (diffusers layout)");
  auto o = std::make_shared<InitOptions>();
  flag(cmd, "--preset", o->preset, "Architecture: tiny, sd15, sd2-base or sd2-768-v")
      ->required()
      ->check(CLI::IsMember(pipeline::preset_names()));
  flag(cmd, "--out", o->out, "Output folder")->required();
  flag(cmd, "--seed", o->seed, "Seed of the random weights")->check(seed_value());
  flag(cmd, "--save_dtype", o->save_dtype, "dtype of the stored weights")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  switch_flag(cmd, "--overwrite", o->overwrite, "Replace a pipeline already in the output folder");
  cmd->callback([o, &chosen] { chosen = [o] { return run_init(*o); }; });
}

}  // namespace sd::cli

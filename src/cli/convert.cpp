// `sdtrain convert INPUT OUTPUT`: between the layouts Stable Diffusion weights come in. INPUT is anything a model flag
// accepts (pipeline folder, single-file .safetensors/.ckpt, cached Hub name); OUTPUT ending in .safetensors (any
// case) is written as one file in the original (LDM / A1111) layout, anything else as a diffusers pipeline folder,
// e.g. with --variant fp16 for diffusion_pytorch_model.fp16.safetensors files. --lora merges LoRA files into the
// weights on the way (kohya's merge_lora.py; diffusers' fuse_lora then save_pretrained), --vae replaces the VAE.
#include <cstdio>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "core/text.h"
#include "io/atomic_file.h"
#include "pipeline/lora_file.h"
#include "pipeline/model_source.h"
#include "pipeline/single_file.h"

namespace sd::cli {

namespace {

namespace fs = std::filesystem;

struct ConvertOptions {
  pipeline::ModelRequest input;
  std::string output;
  std::string variant;
  std::string save_dtype;
  bool overwrite = false;
  LoraRequest loras;
  std::string vae;
};

at::ScalarType save_dtype(const ConvertOptions& o) {
  if (o.save_dtype == "float16" || (o.save_dtype.empty() && o.variant == "fp16")) return at::kHalf;
  if (o.save_dtype == "bfloat16") return at::kBFloat16;
  return at::kFloat;
}

// Writing over the input folder would delete its weights (with --variant, or a .bin pipeline's files): refused even
// with --overwrite.
void check_output_is_a_new_folder(const pipeline::ModelSource& source, const ConvertOptions& o) {
  std::error_code ignored;
  SD_CHECK(!fs::equivalent(source.path, o.output, ignored), "OUTPUT {}: is the input pipeline; write to a new folder",
           o.output);
  pipeline::check_not_replacing_pipeline("OUTPUT", o.output, o.overwrite);
}

int run_convert(const ConvertOptions& o) {
  SD_CHECK(!o.output.empty(), "OUTPUT: expected a folder or a .safetensors file, got an empty path");
  const std::string extension = lowercase(fs::path(o.output).extension().string());
  const bool single_file = extension == ".safetensors";
  SD_CHECK(extension != ".ckpt" && extension != ".pt" && extension != ".bin",
           "{}: single files are written as .safetensors (which A1111 and ComfyUI read), not {}", o.output, extension);
  SD_CHECK(!single_file || o.variant.empty(), "--variant names the files of a pipeline folder; {} is a single file",
           o.output);
  if (single_file)
    io::check_output_file("OUTPUT", o.output);
  else
    io::check_output_dir("OUTPUT", o.output);
  check_lora_files_exist(o.loras);
  check_vae_exists(o.vae);
  const pipeline::ModelSource source = pipeline::resolve_model(o.input);
  if (!single_file) check_output_is_a_new_folder(source, o);
  pipeline::StableDiffusion pipe = pipeline::load_pipeline(source);
  if (!o.vae.empty()) pipeline::replace_vae(pipe, o.vae);
  pipeline::apply_lora_files(pipe, o.loras.files, o.loras.scales, /*fuse=*/true);
  if (single_file)
    pipeline::save_single_file(pipe, o.output, save_dtype(o));
  else
    pipeline::save_pipeline(pipe, o.output, save_dtype(o), o.variant);
  std::printf("%s\n", o.output.c_str());
  return 0;
}

}  // namespace

void add_convert(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand(
      "convert", "Convert between a diffusers pipeline folder and a single-file (LDM / A1111) checkpoint");
  auto o = std::make_shared<ConvertOptions>();
  add_model_flags(cmd, "input", o->input, "Input", "--input_variant")->required();
  cmd->add_option("output", o->output, "OUT.safetensors: one file in the LDM layout; otherwise a pipeline folder")
      ->required();
  flag(cmd, "--variant", o->variant, "Pipeline output: name the weight files *.VARIANT.* (e.g. fp16)");
  flag(cmd, "--save_dtype", o->save_dtype,
       "dtype of the written weights (default float16 for --variant fp16, else float32)")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  switch_flag(cmd, "--overwrite", o->overwrite, "Pipeline output: replace a pipeline already in that folder");
  add_lora_flags(cmd, o->loras, "merged into the written weights");
  add_vae_flag(cmd, o->vae, "written in its place (A1111's baked-in VAE)");
  cmd->callback([o, &chosen] { chosen = [o] { return run_convert(*o); }; });
}

}  // namespace sd::cli

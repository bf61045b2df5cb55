// `sdtrain init` presets: randomly initialised pipelines with the real SD architectures (sd15, sd2-base,
// sd2-768-v) or a tiny one that runs in about a second (tiny), written in the diffusers layout.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/stable_diffusion.h"

namespace sd::pipeline {

std::vector<std::string> preset_names();
// Throws sd::Error naming the flag for an unknown name.
PipelineConfigs preset_configs(const std::string& name);

// A diffusers tokenizer/ folder: the CLIP vocabulary linked into the binary with SD-1's or SD-2's special tokens.
void write_preset_tokenizer(const std::filesystem::path& dir, bool sd2);

// Builds the pipeline of a preset with weights drawn from `seed` (the libraries' default initialisers), its
// tokenizer written from the CLIP vocabulary linked into the binary under `work_dir`/tokenizer.
StableDiffusion make_preset(const std::string& name, uint64_t seed, const std::filesystem::path& work_dir);

// make_preset + save_pipeline into `out` (weights stored as `dtype`).
void write_preset(const std::string& name, uint64_t seed, const std::filesystem::path& out, at::ScalarType dtype);

}  // namespace sd::pipeline

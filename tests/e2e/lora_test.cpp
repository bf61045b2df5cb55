// LoRA end to end: the reference LoRA image (golden C11) through `sdtrain generate --lora`, merged or not, and
// through LyCORIS (full, DoRA) and peft DoRA files of the same update; a LoRA trained by `sdtrain train --lora_rank` on
// the fixture images, exported in both formats, generating the same images from either file, merged or not; resume and
// two sharded ranks reproducing one rank; one clear line for bad input.

#include <nlohmann/json.hpp>
#include <torch/serialize.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "io/atomic_file.h"
#include "io/image.h"
#include "io/safetensors.h"
#include "process_util.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

fs::path tiny_sd1() { return sd::test::fixtures() / "tiny-sd1"; }

// `sdtrain generate` of the C11 settings (PNDM, 4 steps, guidance 7.5, the golden's latents) with `extra` flags;
// returns the raw float images.
at::Tensor generate_c11(const fs::path& dir, const std::vector<std::string>& extra,
                        const fs::path& model = tiny_sd1()) {
  const io::TensorMap g = io::load_safetensors(sd::test::golden("tiny-sd1/lora_txt2img.safetensors"));
  const fs::path latents = dir / "latents.safetensors", raw = dir / "raw.safetensors";
  io::save_safetensors(latents, {{"latents", g.at("input.latents")}});
  std::vector<std::string> command = {sd::test::sdtrain_binary(),
                                      "generate",
                                      "--model=" + model.string(),
                                      "--prompt=a photo of an astronaut riding a horse",
                                      "--negative_prompt=blurry",
                                      "--num_inference_steps=4",
                                      "--guidance_scale=7.5",
                                      "--seed=0",
                                      "--threads=1",
                                      "--init_latents=" + latents.string(),
                                      "--save_raw=" + raw.string(),
                                      "--output_dir=" + (dir / "png").string()};
  command.insert(command.end(), extra.begin(), extra.end());
  auto r = sd::test::run_process(command, 120s);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? io::load_safetensors(raw).at("images") : at::zeros({1});
}

at::Tensor png_pixels(const fs::path& path) {
  const io::RgbImage image = io::load_image_rgb(path);
  return at::from_blob(const_cast<uint8_t*>(image.pixels.data()), {image.height, image.width, 3}, at::kByte).clone();
}

TEST(LoraE2E, BinaryReproducesTheDiffusersLoraImageMergedOrNot) {
  const at::Tensor golden = io::load_safetensors(sd::test::golden("tiny-sd1/lora_txt2img.safetensors")).at("image");
  const std::string lora = "--lora=" + sd::test::golden("tiny-sd1/lora_diffusers.safetensors").string();
  for (bool fuse : {false, true}) {
    SCOPED_TRACE(fuse ? "fused" : "unfused");
    sd::test::TempDir dir;
    std::vector<std::string> flags = {lora, "--lora_scale=0.7"};
    if (fuse) flags.push_back("--fuse_lora");
    const at::Tensor images = generate_c11(dir.path(), flags);
    EXPECT_TRUE(sd::test::close_rel_max(images, golden, 1e-4));
    // diffusers' numpy_to_pil: (image * 255).round() as uint8.
    const at::Tensor expected_png = (golden[0] * 255).round().to(at::kInt);
    const at::Tensor png = png_pixels(dir.path() / "png" / "p0-s0-i0.png").to(at::kInt);
    EXPECT_LE((png - expected_png).abs().max().item<int64_t>(), 1) << "PNG pixels vs the golden image";
  }
}

// The reference LoRA rewritten as LyCORIS modules of the same update, under kohya's names: a LoHa whose second
// factor is all ones (ΔW = up·down ⊙ 1), a LoKr whose first factor is [[1]] (ΔW = [[1]] ⊗ up·down), a full update
// (diff = up·down), and a DoRA whose magnitudes are the norms W + ΔW has anyway (by output row for half the layers,
// by input channel for the others), alpha = rank. All reproduce the diffusers image A1111-style (merged into the
// weights).
TEST(LoraE2E, LyCorisLoHaLoKrFullAndDoRAOfTheReferenceUpdateReproduceItsImage) {
  const at::Tensor golden = io::load_safetensors(sd::test::golden("tiny-sd1/lora_txt2img.safetensors")).at("image");
  const io::TensorMap reference = io::load_safetensors(sd::test::golden("tiny-sd1/lora_diffusers.safetensors"));
  const io::TensorMap unet = io::load_safetensors(tiny_sd1() / "unet" / "diffusion_pytorch_model.safetensors");
  io::TensorMap loha, lokr, full, dora;
  int64_t layers = 0;
  const std::string down_suffix = ".lora.down.weight";
  for (const auto& [key, down] : reference) {
    if (key.size() < down_suffix.size() ||
        key.compare(key.size() - down_suffix.size(), down_suffix.size(), down_suffix))
      continue;
    const std::string module = key.substr(5, key.size() - 5 - down_suffix.size());  // after "unet."
    std::string stem = "lora_unet_" + module;
    std::replace(stem.begin(), stem.end(), '.', '_');
    const at::Tensor up = reference.at("unet." + module + ".lora.up.weight");
    const at::Tensor rank = at::scalar_tensor(static_cast<double>(down.size(0)));
    loha[stem + ".hada_w1_a"] = up;
    loha[stem + ".hada_w1_b"] = down;
    loha[stem + ".hada_w2_a"] = at::ones({up.size(0), 1});
    loha[stem + ".hada_w2_b"] = at::ones({1, down.size(1)});
    loha[stem + ".alpha"] = rank;
    lokr[stem + ".lokr_w1"] = at::ones({1, 1});
    lokr[stem + ".lokr_w2_a"] = up;
    lokr[stem + ".lokr_w2_b"] = down;
    lokr[stem + ".alpha"] = rank;
    full[stem + ".diff"] = at::mm(up, down);
    dora[stem + ".lora_down.weight"] = down;
    dora[stem + ".lora_up.weight"] = up;
    dora[stem + ".alpha"] = rank;
    const at::Tensor merged = unet.at(module + ".weight") + at::mm(up, down);
    const int64_t along = layers++ % 2;  // 0: a norm per output row ([out, 1]), 1: per input channel ([1, in])
    dora[stem + ".dora_scale"] = merged.norm(2, {1 - along}, /*keepdim=*/true);
  }
  ASSERT_EQ(loha.size(), 88u * 5);
  for (const auto& [name, tensors] :
       {std::pair{"loha", loha}, std::pair{"lokr", lokr}, std::pair{"full", full}, std::pair{"dora", dora}}) {
    SCOPED_TRACE(name);
    sd::test::TempDir dir;
    const fs::path file = dir.path() / (std::string(name) + ".safetensors");
    io::save_safetensors(file, tensors);
    const at::Tensor images = generate_c11(dir.path(), {"--lora=" + file.string(), "--lora_scale=0.7"});
    EXPECT_TRUE(sd::test::close_rel_max(images, golden, 1e-4));
  }
}

// The reference LoRA as a peft DoRA (diffusers' --use_dora scripts): its own tensors plus lora_magnitude_vector, the
// output rows' norms of W + 0.7·ΔW. peft puts the strength inside the norm, so at --lora_scale 0.7 the weight is
// W + 0.7·ΔW exactly and the image is diffusers' for the reference LoRA at that scale.
TEST(LoraE2E, PeftDoRAOfTheReferenceUpdateReproducesItsImage) {
  const at::Tensor golden = io::load_safetensors(sd::test::golden("tiny-sd1/lora_txt2img.safetensors")).at("image");
  io::TensorMap dora = io::load_safetensors(sd::test::golden("tiny-sd1/lora_diffusers.safetensors"));
  const io::TensorMap unet = io::load_safetensors(tiny_sd1() / "unet" / "diffusion_pytorch_model.safetensors");
  const std::string down_suffix = ".lora.down.weight";
  for (const auto& [key, down] : io::TensorMap(dora)) {
    if (key.size() < down_suffix.size() ||
        key.compare(key.size() - down_suffix.size(), down_suffix.size(), down_suffix))
      continue;
    const std::string module = key.substr(0, key.size() - down_suffix.size());  // unet.<module>
    const at::Tensor weight = unet.at(module.substr(5) + ".weight");
    const at::Tensor merged = weight + at::mm(dora.at(module + ".lora.up.weight"), down) * 0.7;
    dora[module + ".lora_magnitude_vector"] = merged.norm(2, {1});
  }
  ASSERT_EQ(dora.size(), 88u * 3);
  sd::test::TempDir dir;
  const fs::path file = dir.path() / "pytorch_lora_weights.safetensors";
  io::save_safetensors(file, dora);
  const at::Tensor images = generate_c11(dir.path(), {"--lora=" + dir.path().string(), "--lora_scale=0.7"});
  EXPECT_TRUE(sd::test::close_rel_max(images, golden, 1e-4));
}

// `convert --lora` writes the pipeline with the LoRA merged in: it generates generate's --fuse_lora images exactly.
TEST(LoraE2E, ConvertMergesALoraIntoThePipelineItWrites) {
  sd::test::TempDir dir;
  const std::string lora = "--lora=" + sd::test::golden("tiny-sd1/lora_diffusers.safetensors").string();
  const fs::path merged = dir.path() / "merged";
  auto r = sd::test::run_process(
      {sd::test::sdtrain_binary(), "convert", tiny_sd1().string(), merged.string(), lora, "--lora_scale=0.7"}, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const at::Tensor from_merged = generate_c11(dir.path() / "a", {}, merged);
  const at::Tensor fused = generate_c11(dir.path() / "b", {lora, "--lora_scale=0.7", "--fuse_lora"});
  EXPECT_TRUE(at::equal(from_merged, fused));
  const at::Tensor golden = io::load_safetensors(sd::test::golden("tiny-sd1/lora_txt2img.safetensors")).at("image");
  EXPECT_TRUE(sd::test::close_rel_max(from_merged, golden, 1e-4));

  // Bad input stops before anything is written.
  for (const auto& [flags, error] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--lora=" + (dir.path() / "none.safetensors").string()},
            "--lora " + (dir.path() / "none.safetensors").string() + ": no such file or folder"},
           {{lora, "--lora_scale=0.5", "--lora_scale=0.7"},
            "--lora_scale given 2 time(s) for 1 --lora file(s): give one scale per --lora, in the same order"}}) {
    std::vector<std::string> command = {sd::test::sdtrain_binary(), "convert", tiny_sd1().string(),
                                        (dir.path() / "bad").string()};
    command.insert(command.end(), flags.begin(), flags.end());
    auto bad = sd::test::run_process(command, 120s);
    EXPECT_TRUE(sd::test::is_one_line_error({bad.exit_code, bad.output}, error)) << bad.output;
    EXPECT_FALSE(fs::exists(dir.path() / "bad"));
  }
}

// `sdtrain inspect` of a LoRA file: its modules by kind with their ranks and alphas, its size and metadata, without a
// model; a folder holding pytorch_lora_weights.safetensors stands for that file.
TEST(LoraE2E, InspectShowsALoraFilesModulesRanksAlphasAndMetadata) {
  sd::test::TempDir dir;
  const fs::path reference = sd::test::golden("tiny-sd1/lora_diffusers.safetensors");
  auto inspect = [](const fs::path& path) {
    auto r = sd::test::run_process({sd::test::sdtrain_binary(), "inspect", path.string()}, 60s);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  EXPECT_EQ(inspect(reference), reference.string() +
                                    ": LoRA file (diffusers names): 88 modules (UNet 88, text encoder 0), 0.033280 M "
                                    "params, float32, 0.13 MB\n"
                                    "  LoRA          88 modules  rank 4  alpha none (scale 1)\n");
  fs::create_directories(dir.path() / "folder");
  fs::copy_file(reference, dir.path() / "folder" / "pytorch_lora_weights.safetensors");
  EXPECT_NE(inspect(dir.path() / "folder").find("88 modules (UNet 88, text encoder 0)"), std::string::npos);

  const std::string q = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q",
                    te = "lora_te_text_model_encoder_layers_0_self_attn_q_proj",
                    locon = "lora_unet_down_blocks_1_resnets_0_conv1", loha = "lora_unet_down_blocks_0_resnets_0_conv1",
                    lokr = "lora_unet_down_blocks_0_attentions_0_proj_in",
                    tucker = "lora_unet_down_blocks_1_resnets_0_conv2",
                    dora = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_k",
                    whole = "lora_unet_conv_in";
  const io::TensorMap tensors = {
      {q + ".lora_down.weight", at::zeros({2, 32})},  // 64 + 64 values
      {q + ".lora_up.weight", at::zeros({32, 2})},
      {q + ".alpha", at::scalar_tensor(1.0)},
      {te + ".lora_down.weight", at::zeros({2, 32}, at::kHalf)},  // 128 values, float16
      {te + ".lora_up.weight", at::zeros({32, 2}, at::kHalf)},
      {te + ".alpha", at::scalar_tensor(1.0)},
      {locon + ".lora_down.weight", at::zeros({4, 32, 3, 3})},  // 1152 + 256 values
      {locon + ".lora_up.weight", at::zeros({64, 4, 1, 1})},
      {locon + ".alpha", at::scalar_tensor(2.0)},
      {loha + ".hada_w1_a", at::zeros({32, 2})},  // 2 x (64 + 576) values
      {loha + ".hada_w1_b", at::zeros({2, 288})},
      {loha + ".hada_w2_a", at::zeros({32, 2})},
      {loha + ".hada_w2_b", at::zeros({2, 288})},
      {loha + ".alpha", at::scalar_tensor(1.0)},
      {lokr + ".lokr_w1", at::zeros({4, 4})},  // 16 + 64 values, no rank, no alpha
      {lokr + ".lokr_w2", at::zeros({8, 8})},
      {tucker + ".lora_down.weight", at::zeros({4, 64, 1, 1})},  // 256 + 144 + 256 values: a 3x3 LoCon
      {tucker + ".lora_mid.weight", at::zeros({4, 4, 3, 3})},
      {tucker + ".lora_up.weight", at::zeros({64, 4, 1, 1})},
      {tucker + ".alpha", at::scalar_tensor(2.0)},
      {dora + ".lora_down.weight", at::zeros({2, 32})},  // 64 + 64 + 32 values
      {dora + ".lora_up.weight", at::zeros({32, 2})},
      {dora + ".dora_scale", at::zeros({32, 1})},
      {dora + ".alpha", at::scalar_tensor(1.0)},
      {whole + ".diff", at::zeros({32, 4, 3, 3})},  // 1152 + 32 values
      {whole + ".diff_b", at::zeros({32})},
  };
  const fs::path file = dir.path() / "mixed.safetensors";
  io::save_safetensors(file, tensors,
                       {{"ss_network_dim", "2"}, {"ss_tag_frequency", "{\"a\":\n" + std::string(120, 'x')}});
  // 5024 values: 128 of them float16 (256 bytes), the rest float32 (19584 bytes).
  EXPECT_EQ(inspect(file), file.string() +
                               ": LoRA file (kohya names): 8 modules (UNet 7, text encoder 1), 0.005024 M params, "
                               "float16,float32, 0.02 MB\n"
                               "  Full           1 modules  rank -  alpha none (scale 1)\n"
                               "  LoCon          2 modules  rank 4  alpha 2\n"
                               "  LoHa           1 modules  rank 2  alpha 1\n"
                               "  LoKr           1 modules  rank -  alpha none (scale 1)\n"
                               "  LoRA           2 modules  rank 2  alpha 1\n"
                               "  LoRA+DoRA      1 modules  rank 2  alpha 1\n"
                               "  ss_network_dim: 2\n"
                               "  ss_tag_frequency: {\"a\": " +
                               std::string(91, 'x') + "...\n");

  // IA3 (a diagonal scale of the keys) and OFT have no rank; LyCORIS modules generate does not read are shown by
  // their parts (here the scale LyCORIS' trainer folds into the factors it saves).
  const fs::path lycoris = dir.path() / "ia3_oft.safetensors";
  io::save_safetensors(lycoris, {{dora + ".weight", at::zeros({32})},
                                 {dora + ".on_input", at::zeros({}, at::kBool)},
                                 {"lora_unet_mid_block_attentions_0_proj_in.oft_blocks", at::zeros({4, 8, 8})},
                                 {"lora_unet_mid_block_attentions_0_proj_out.scalar", at::zeros({})}});
  EXPECT_EQ(inspect(lycoris), lycoris.string() +
                                  ": LoRA file (kohya names): 3 modules (UNet 3, text encoder 0), 0.000289 M params, "
                                  "float32, 0.00 MB\n"
                                  "  IA3            1 modules  rank -  alpha none (scale 1)\n"
                                  "  OFT            1 modules  rank -  alpha none (scale 1)\n"
                                  "  not read (scalar)     1 modules  rank -  alpha none (scale 1)\n"
                                  "  format: pt\n");

  // An SDXL LoRA is shown for what it is (generate refuses it: sdtrain runs SD-1.x and SD-2.x).
  const fs::path sdxl = dir.path() / "sdxl.safetensors";
  const std::string te2 = "lora_te2_text_model_encoder_layers_0_self_attn_q_proj";
  io::save_safetensors(sdxl,
                       {{te2 + ".lora_down.weight", at::zeros({2, 32})},
                        {te2 + ".lora_up.weight", at::zeros({32, 2})},
                        {q + ".lora_down.weight", at::zeros({2, 32})},
                        {q + ".lora_up.weight", at::zeros({32, 2})}},
                       {{"ss_base_model_version", "sdxl_base_v1-0"}});
  EXPECT_EQ(inspect(sdxl), sdxl.string() +
                               ": SDXL LoRA file (kohya names): 2 modules (UNet 1, text encoder 1), 0.000256 M "
                               "params, float32, 0.00 MB\n"
                               "  LoRA           2 modules  rank 2  alpha none (scale 1)\n"
                               "  ss_base_model_version: sdxl_base_v1-0\n");
}

// diffusers 0.24 without safetensors writes pytorch_lora_weights.bin (torch.save); a folder stands for it.
TEST(LoraE2E, ATorchSaveLoraInAFolderGivesTheSafetensorsImage) {
  const fs::path reference = sd::test::golden("tiny-sd1/lora_diffusers.safetensors");
  c10::impl::GenericDict state(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, tensor] : io::load_safetensors(reference)) state.insert(name, tensor);
  const std::vector<char> bytes = torch::pickle_save(state);
  sd::test::TempDir a, b;
  fs::create_directories(a.path() / "lora");
  std::ofstream(a.path() / "lora" / "pytorch_lora_weights.bin", std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const at::Tensor from_bin = generate_c11(a.path(), {"--lora=" + (a.path() / "lora").string(), "--lora_scale=0.7"});
  const at::Tensor from_safetensors = generate_c11(b.path(), {"--lora=" + reference.string(), "--lora_scale=0.7"});
  EXPECT_TRUE(at::equal(from_bin, from_safetensors));
}

std::vector<std::string> lora_train_command(const fs::path& data, const fs::path& out,
                                            const std::vector<std::string>& extra) {
  std::vector<std::string> command = {sd::test::sdtrain_binary(),
                                      "train",
                                      "--pretrained_model_name_or_path=" + tiny_sd1().string(),
                                      "--train_data_dir=" + data.string(),
                                      "--resolution=32",
                                      "--random_flip",
                                      "--train_batch_size=1",
                                      "--learning_rate=5e-2",
                                      "--lr_warmup_steps=0",
                                      "--seed=7",
                                      "--threads=1",
                                      "--lora_rank=4",
                                      "--output_dir=" + out.string()};
  command.insert(command.end(), extra.begin(), extra.end());
  return command;
}

TEST(LoraE2E, TrainedLoraGivesTheSameImagesFromBothFormatsMergedOrNot) {
  sd::test::TempDir dir;
  const fs::path data = sd::test::write_image_folder(dir.path() / "data"), out = dir.path() / "cat-lora";
  auto r = sd::test::run_process(
      lora_train_command(data, out,
                         {"--max_train_steps=3", "--lora_alpha=8", "--train_text_encoder_lora", "--lora_format=kohya",
                          "--mixed_precision=bf16", "--gradient_checkpointing_levels=1"}),
      300s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path diffusers_file = out / "pytorch_lora_weights.safetensors", kohya_file = out / "cat-lora.safetensors";
  EXPECT_NE(r.output.find(diffusers_file.string()), std::string::npos) << r.output;
  const io::SafeTensorsFile kohya(kohya_file);
  EXPECT_EQ(kohya.names().size(), 3u * (88 + 20));  // UNet attention projections, 5 text-encoder layers x 4
  EXPECT_EQ(kohya.metadata().at("ss_network_module"), "networks.lora");
  EXPECT_EQ(kohya.metadata().at("ss_network_dim"), "4");
  EXPECT_EQ(kohya.metadata().at("ss_network_alpha"), "8.0");
  EXPECT_EQ(kohya.metadata().at("ss_base_model_version"), "sd_v1");
  EXPECT_EQ(kohya.metadata().at("ss_steps"), "3");
  EXPECT_EQ(kohya.metadata().at("ss_mixed_precision"), "bf16");
  EXPECT_EQ(kohya.metadata().at("ss_gradient_checkpointing"), "True");
  EXPECT_EQ(kohya.metadata().at("ss_prior_loss_weight"), "1.0");
  EXPECT_EQ(kohya.metadata().at("ss_num_train_images"), "3");
  EXPECT_EQ(kohya.metadata().at("ss_num_reg_images"), "0");
  EXPECT_EQ(io::SafeTensorsFile(diffusers_file).names().size(), 2u * (88 + 20));
  // Training moved the zero-initialised up weights.
  EXPECT_GT(kohya.read("lora_unet_mid_block_attentions_0_transformer_blocks_0_attn2_to_k.lora_up.weight")
                .abs()
                .max()
                .item<float>(),
            0);

  sd::test::TempDir a, b, c, d;
  const at::Tensor plain = generate_c11(a.path(), {});
  const at::Tensor from_diffusers = generate_c11(b.path(), {"--lora=" + diffusers_file.string(), "--lora_scale=0.8"});
  const at::Tensor from_kohya = generate_c11(c.path(), {"--lora=" + kohya_file.string(), "--lora_scale=0.8"});
  const at::Tensor fused = generate_c11(d.path(), {"--lora=" + kohya_file.string(), "--lora_scale=0.8", "--fuse_lora"});
  EXPECT_GT((from_diffusers - plain).abs().max().item<float>(), 1e-3) << "the LoRA changes the image";
  EXPECT_TRUE(sd::test::close_rel_max(from_kohya, from_diffusers, 1e-5));
  EXPECT_TRUE(sd::test::close_rel_max(fused, from_diffusers, 1e-4));
}

// The LoRA script's own flags: --rank (overriding --lora_rank), one --validation_prompt with --num_validation_images,
// validation after every epoch by default, each image what `sdtrain generate` makes of the exported file at the
// script's 30 steps with seed + i.
TEST(LoraE2E, TheLoraScriptsFlagsTrainAndValidateAsItDoes) {
  sd::test::TempDir dir;
  const fs::path data = sd::test::write_image_folder(dir.path() / "data"), out = dir.path() / "out";
  auto r = sd::test::run_process(
      lora_train_command(data, out,
                         {"--rank=2", "--max_train_steps=9", "--validation_prompt=a cat", "--num_validation_images=2"}),
      300s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("LoRA rank 2 alpha 2 on 88 layers"), std::string::npos) << r.output;
  // run.json records the defaults the run used: the LoRA script's where they differ from the full script's.
  const auto defaults = nlohmann::json::parse(io::read_text_file(out / "logs" / "run.json")).at("defaults");
  EXPECT_EQ(defaults.at("validation_epochs"), "1") << defaults;
  std::set<std::string> images;
  for (const auto& entry : fs::directory_iterator(out / "validation")) images.insert(entry.path().filename().string());
  EXPECT_EQ(images, (std::set<std::string>{"step-3-0.png", "step-3-1.png", "step-6-0.png", "step-6-1.png",
                                           "step-9-0.png", "step-9-1.png"}));
  // One batch of both images, as validation makes them (a batch of one may round differently).
  sd::test::TempDir generated;
  auto g = sd::test::run_process(
      {sd::test::sdtrain_binary(), "generate", "--model=" + tiny_sd1().string(),
       "--lora=" + (out / "pytorch_lora_weights.safetensors").string(), "--prompt=a cat", "--num_inference_steps=30",
       "--num_images_per_prompt=2", "--seed=7", "--threads=1", "--output_dir=" + generated.path().string()},
      300s);
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_EQ(io::read_text_file(generated.path() / "p0-s7-i0.png"),
            io::read_text_file(out / "validation" / "step-9-0.png"));
  EXPECT_EQ(io::read_text_file(generated.path() / "p0-s8-i1.png"),
            io::read_text_file(out / "validation" / "step-9-1.png"));
}

// On a terminal, validation's denoising shows a bar of its own (minutes on a CPU at real sizes). In a log (a pipe, a
// cluster job's file) progress is a plain line every SDTRAIN_PROGRESS_SECONDS (default 60 s: none in a short run).
TEST(LoraE2E, ProgressShowsOnATerminalAndEveryFewSecondsInALog) {
  sd::test::TempDir dir;
  const fs::path data = sd::test::write_image_folder(dir.path() / "data"), out = dir.path() / "out";
  std::string command;
  for (const std::string& arg :
       lora_train_command(data, out, {"--max_train_steps=3", "--validation_prompt=a cat", "--num_validation_images=1"}))
    command += "'" + arg + "' ";
  const std::string finished = "validation at step 3 [########################] 31/31";  // PNDM: 30 steps + 1
  const auto on_terminal = sd::test::run_command("script -qec \"" + command + "\" /dev/null");
  ASSERT_EQ(on_terminal.exit_code, 0) << on_terminal.output;
  EXPECT_NE(on_terminal.output.find(finished), std::string::npos) << on_terminal.output;
  const auto piped = sd::test::run_command(command);
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(piped.output.find("validation at step"), std::string::npos) << piped.output;
  EXPECT_EQ(piped.output.find("\r"), std::string::npos) << piped.output;

  const auto logged = sd::test::run_command("SDTRAIN_PROGRESS_SECONDS=0.000001 " + command);
  ASSERT_EQ(logged.exit_code, 0) << logged.output;
  for (const std::string line :
       {"\nsdtrain: lora 33% 1/3 ", "\nsdtrain: lora 100% 3/3 ", "\nsdtrain: validation at step 3 100% 31/31 "})
    EXPECT_NE(logged.output.find(line), std::string::npos) << line << " in\n" << logged.output;
  EXPECT_EQ(logged.output.find("\r"), std::string::npos) << logged.output;
}

// A resumed LoRA run (bf16 frozen models, EMA, accumulation, text-encoder adapters) writes the bits of an
// uninterrupted one; two ranks sharding the adapters' state train what one rank with accumulation trains.
TEST(LoraE2E, ResumeIsBitExactAndShardedRanksMatchOneRank) {
  sd::test::TempDir dir;
  const fs::path data = sd::test::write_image_folder(dir.path() / "data");
  const fs::path whole = dir.path() / "whole", split = dir.path() / "split", ranks = dir.path() / "ranks";
  const std::vector<std::string> flags = {
      "--max_train_steps=4",    "--checkpointing_steps=2",   "--use_ema",
      "--mixed_precision=bf16", "--train_text_encoder_lora", "--resume_from_checkpoint=latest"};
  auto accumulate = flags;
  accumulate.push_back("--gradient_accumulation_steps=2");
  auto a = sd::test::run_process(lora_train_command(data, whole, accumulate), 300s);
  ASSERT_EQ(a.exit_code, 0) << a.output;

  fs::create_directories(split);
  fs::copy(whole / "checkpoint-2", split / "checkpoint-2", fs::copy_options::recursive);
  auto resumed = sd::test::run_process(lora_train_command(data, split, accumulate), 300s);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  for (const char* file :
       {"checkpoint-4/pytorch_lora_weights.safetensors", "checkpoint-4/pytorch_lora_weights_ema.safetensors",
        "checkpoint-4/optimizer.safetensors", "pytorch_lora_weights.safetensors"})
    EXPECT_EQ(io::read_text_file(whole / file), io::read_text_file(split / file)) << file;

  auto sharded = flags;
  sharded.push_back("--sharding=shard_grad_op");
  auto two = sd::test::run_process(sd::test::under_launch(2, lora_train_command(data, ranks, sharded)), 300s);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  // bf16 compute: the two micro-batches' gradients are summed in another order; the EMA averages that over steps.
  // The sharded checkpoint holds the adapters whole too, as the unsharded one does.
  for (const char* file : {"pytorch_lora_weights.safetensors", "checkpoint-4/pytorch_lora_weights.safetensors",
                           "checkpoint-4/pytorch_lora_weights_ema.safetensors"}) {
    const io::TensorMap one = io::load_safetensors(whole / file);
    const io::TensorMap both = io::load_safetensors(ranks / file);
    ASSERT_EQ(both.size(), one.size()) << file;
    for (const auto& [name, t] : one) EXPECT_TRUE(sd::test::close_rel_max(both.at(name), t, 2e-2)) << file << name;
  }
}

TEST(LoraE2E, BadInputs) {
  sd::test::TempDir dir;
  auto command_line = [](const std::vector<std::string>& args) {
    std::string line;
    for (const auto& a : args) line += "'" + a + "' ";
    return line;
  };
  const fs::path data = sd::test::write_image_folder(dir.path() / "data"), out = dir.path() / "out";
  // The error comes after the data listing's line, once the UNet's layers are known: it is the last line.
  auto train_error = [&](const std::vector<std::string>& extra, const std::string& fragment) {
    const auto command = lora_train_command(data, out, extra);
    const auto result = sd::test::run_command(command_line(command));
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("\nsdtrain: error: " + fragment + "\n"), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("terminate called"), std::string::npos) << result.output;
  };
  // Resuming with another rank names the rank, not only the alpha that follows from it.
  const fs::path resumable = dir.path() / "resumable";
  ASSERT_EQ(sd::test::run_process(
                lora_train_command(data, resumable, {"--max_train_steps=1", "--checkpointing_steps=1"}), 300s)
                .exit_code,
            0);
  const auto other_rank = sd::test::run_command(command_line(lora_train_command(
      data, resumable, {"--max_train_steps=2", "--resume_from_checkpoint=latest", "--lora_rank=8"})));
  EXPECT_NE(other_rank.output.find("\nsdtrain: error: " + (resumable / "checkpoint-1").string() +
                                   ": the checkpoint was trained with --lora_alpha 4.0 and --lora_rank 4; this run "
                                   "has --lora_alpha 8.0 and --lora_rank 8\n"),
            std::string::npos)
      << other_rank.output;
  // What a resume overrides, finds changed or finds already done is said, not silently taken.
  const fs::path more = dir.path() / "more";
  sd::test::write_captioned_images(more, 5);
  const auto done = sd::test::run_command(command_line(
      lora_train_command(more, resumable, {"--max_train_steps=1", "--resume_from_checkpoint=latest", "--seed=9"})));
  EXPECT_EQ(done.exit_code, 0) << done.output;
  EXPECT_NE(done.output.find("the checkpoint was trained on 3 samples per epoch, this data has 5; the data order will "
                             "differ from the original run"),
            std::string::npos)
      << done.output;
  EXPECT_NE(done.output.find("--seed 9 is ignored: a resumed run continues the checkpoint's random draws (seed 7)"),
            std::string::npos)
      << done.output;
  EXPECT_NE(done.output.find("the checkpoint is at step 1, --max_train_steps is 1: nothing is left to train"),
            std::string::npos)
      << done.output;
  train_error({"--lora_target_modules=to_q,to_x"},
              "--lora_target_modules: 'to_x' matches no Linear or Conv2d layer of the UNet");
  EXPECT_TRUE(sd::test::is_one_line_error(
      sd::test::run_command(sd::test::sdtrain_binary() + " train --pretrained_model_name_or_path=" +
                            tiny_sd1().string() + " --synthetic_data=latents --lora_alpha=8"),
      "--lora_alpha requires --lora_rank"));
  auto synthetic = lora_train_command(data, out, {"--train_text_encoder_lora"});
  synthetic[3] = "--synthetic_data=latents";
  EXPECT_TRUE(sd::test::is_one_line_error(sd::test::run_command(command_line(synthetic)),
                                          "--train_text_encoder_lora needs the text encoder"));

  auto generate_error = [&](const std::vector<std::string>& extra, const std::string& fragment) {
    std::vector<std::string> command = {
        sd::test::sdtrain_binary(),       "generate",
        "--model=" + tiny_sd1().string(), "--prompt=x",
        "--num_inference_steps=1",        "--output_dir=" + (dir.path() / "gen").string()};
    command.insert(command.end(), extra.begin(), extra.end());
    EXPECT_TRUE(sd::test::is_one_line_error(sd::test::run_command(command_line(command)), fragment))
        << command_line(command);
  };
  generate_error({"--lora=/nonexistent/lora.safetensors"},
                 "--lora /nonexistent/lora.safetensors: no such file or folder");
  fs::create_directories(dir.path() / "empty");
  generate_error({"--lora=" + (dir.path() / "empty").string()},
                 (dir.path() / "empty").string() +
                     ": a folder without pytorch_lora_weights.safetensors or pytorch_lora_weights.bin");
  const std::string golden = sd::test::golden("tiny-sd1/lora_diffusers.safetensors").string();
  generate_error({"--lora=" + golden, "--lora=" + golden, "--lora_scale=0.5"},
                 "--lora_scale given 1 time(s) for 2 --lora file(s)");
  io::save_safetensors(dir.path() / "unknown.safetensors",
                       {{"lora_unet_mid_block_foo.lora_down.weight", at::zeros({1, 1})}});
  generate_error({"--lora=" + (dir.path() / "unknown.safetensors").string()},
                 "has no Linear, Conv2d or norm layer named lora_unet_mid_block_foo");
  io::TensorMap wrong = io::load_safetensors(golden);
  const std::string key = "unet.mid_block.attentions.0.transformer_blocks.0.attn1.to_q.lora.down.weight";
  wrong[key] = wrong[key].narrow(1, 0, 8).contiguous();
  io::save_safetensors(dir.path() / "wrong.safetensors", wrong);
  generate_error({"--lora=" + (dir.path() / "wrong.safetensors").string()},
                 "mid_block.attentions.0.transformer_blocks.0.attn1.to_q: LoRA down [4, 8] / up [64, 4] do not fit");
}

}  // namespace
}  // namespace sd

// End-to-end: the sdtrain binary's init, inspect and tokenize subcommands, and its one-line errors.
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using sd::test::run_command;

std::string sdtrain(const std::string& args) { return sd::test::sdtrain_binary() + " " + args; }

TEST(Cli, InitTinyThenInspect) {
  sd::test::TempDir dir;
  auto init = run_command(sdtrain("init --preset tiny --out " + (dir.path() / "m").string() + " --seed 1"));
  ASSERT_EQ(init.exit_code, 0) << init.output;
  auto inspect = run_command(sdtrain("inspect " + (dir.path() / "m").string()));
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("unet          UNet2DConditionModel         2.164452 M params  float32"),
            std::string::npos)
      << inspect.output;
  EXPECT_NE(inspect.output.find("Model has 4.737444 M parameters and 2.164452 M trainable"), std::string::npos)
      << inspect.output;
}

TEST(Cli, InitSd2BaseHasMosaicMLsParameterCount) {
  sd::test::TempDir dir;
  auto out = (dir.path() / "sd2").string();
  auto init = run_command(sdtrain("init --preset sd2-base --save_dtype float16 --out " + out));
  ASSERT_EQ(init.exit_code, 0) << init.output;
  auto inspect = run_command(sdtrain("inspect " + out));
  EXPECT_NE(inspect.output.find("Model has 1289.952427 M parameters and 865.910724 M trainable"), std::string::npos)
      << inspect.output;
  EXPECT_NE(inspect.output.find("text_encoder  CLIPTextModel              340.387840 M params  float16"),
            std::string::npos)
      << inspect.output;
}

TEST(Cli, TokenizeMatchesTheReferenceTokenizer) {
  for (const char* model : {"tiny-sd1", "tiny-sd2"}) {
    const std::string key = std::string(model) == "tiny-sd1" ? "sd1" : "sd2";
    auto r = run_command(sdtrain("tokenize --model " + (sd::test::fixtures() / model).string() +
                                 " --add-token '<dicoo>' 'a photo of a <dicoo>' 'wow! amazing!!'"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::istringstream lines(r.output);
    std::string line1, line2;
    std::getline(lines, line1);
    std::getline(lines, line2);
    auto ids = nlohmann::json::parse(line1);
    ASSERT_EQ(ids.size(), 77u);
    EXPECT_EQ(ids[0], 49406);
    EXPECT_EQ(ids[5], 49408);  // the added token, matched whole
    EXPECT_EQ(nlohmann::json::parse(line2)[2], key == "sd1" ? 256 : 0) << "'!' is an added token only in sd2";
  }
}

TEST(Cli, Errors) {
  EXPECT_TRUE(
      sd::test::is_one_line_error(run_command(sdtrain("inspect /nonexistent/model")), "/nonexistent/model: not found"));
  EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("tokenize --model /nonexistent/model hi")),
                                          "/nonexistent/model"));
  auto bad = run_command(sdtrain("init --preset sd3 --out /tmp/x"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--preset"), std::string::npos) << bad.output;
  const std::string commands = "(expected one of: init, inspect, tokenize, generate, convert, textual-inversion, ";
  EXPECT_TRUE(
      sd::test::is_one_line_error(run_command(sdtrain("frobnicate")), "unknown command 'frobnicate' " + commands));
  EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("trian --help")), "unknown command 'trian'"));
  // An unknown flag is named before any missing required one, with the nearest flag when one is near.
  EXPECT_TRUE(sd::test::is_one_line_error(
      run_command(sdtrain("train --validation_promt 'a cat'")),
      "train has no flag --validation_promt; did you mean --validation_prompt? (see sdtrain train --help)"));
  EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("generate --model m --prompt a --bogus=3")),
                                          "generate has no flag --bogus (see sdtrain generate --help)"));
  EXPECT_TRUE(
      sd::test::is_one_line_error(run_command(sdtrain("train --pretrained_model_name_or_path m --validation_prompt a "
                                                      "--validation_prompts b")),
                                  "--validation_prompts excludes --validation_prompt"));
  EXPECT_TRUE(sd::test::is_one_line_error(
      run_command(sdtrain("train --pretrained_model_name_or_path m --image_interpolation_mode area")),
      "--image_interpolation_mode: 'area' is not one of bilinear, bicubic, lanczos, box, hamming, nearest, "
      "nearest_exact"));
}

TEST(Cli, FlagValuesAreCheckedBeforeAnyWork) {
  const std::string model = " --model " + (sd::test::fixtures() / "tiny-sd1").string() + " --prompt x";
  const std::string not_a_seed = "\" is not a seed (a whole number from 0 to 18446744073709551615)";
  for (const std::string seed : {"-1", "18446744073709551616", "1.5", "''"}) {
    const std::string shown = seed == "''" ? "" : seed;
    EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("generate" + model + " --seed " + seed)),
                                            "--seed: \"" + shown + not_a_seed));
  }
  EXPECT_EQ(run_command(sdtrain("init --preset tiny --seed 18446744073709551615 --out ''")).output,
            "sdtrain: error: --out: expected a folder, got an empty path\n");
  EXPECT_TRUE(sd::test::is_one_line_error(
      run_command(sdtrain("convert " + (sd::test::fixtures() / "tiny-sd1").string() + " ''")),
      "OUTPUT: expected a folder or a .safetensors file, got an empty path"));
  EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("generate" + model + " --guidance_scale nan")),
                                          "--guidance_scale: nan is not a finite number"));
  EXPECT_TRUE(
      sd::test::is_one_line_error(run_command(sdtrain("generate" + model + " --output_dir ''")),
                                  "nothing would be written: --output_dir is empty and --save_raw is not given"));
  sd::test::TempDir dir;
  const fs::path grid = dir.path() / "out" / "grid.png";
  fs::create_directories(grid);
  EXPECT_TRUE(sd::test::is_one_line_error(
      run_command(sdtrain("generate" + model + " --num_inference_steps 1 --output_dir " + grid.parent_path().string())),
      "--output_dir " + grid.string() + ": is a folder, not a file"));
  // No image written before the error.
  EXPECT_EQ(std::distance(fs::directory_iterator(grid.parent_path()), fs::directory_iterator()), 1);
  const fs::path single = dir.path() / "m.safetensors";
  fs::create_directories(single);
  EXPECT_TRUE(sd::test::is_one_line_error(
      run_command(sdtrain("convert " + (sd::test::fixtures() / "tiny-sd1").string() + " " + single.string())),
      "OUTPUT " + single.string() + ": is a folder, not a file"));
  EXPECT_TRUE(
      sd::test::is_one_line_error(run_command(sdtrain("train --pretrained_model_name_or_path m --synthetic_data "
                                                      "latents --global_batch_size 4 --gradient_accumulation_steps 2")),
                                  "--gradient_accumulation_steps excludes --global_batch_size"));
  EXPECT_TRUE(sd::test::is_one_line_error(
      run_command(sdtrain(
          "train --pretrained_model_name_or_path m --synthetic_data latents --lr_scheduler polynomial --lr_power nan")),
      "--lr_power: nan is not a finite number"));
  // A forgotten value: CLI11 would take the next flag as it (and the run's outputs would land in the default folder).
  EXPECT_TRUE(sd::test::is_one_line_error(
      run_command(sdtrain(
          "train --pretrained_model_name_or_path m --synthetic_data latents --validation_prompts --output_dir out")),
      "--validation_prompts: got the flag --output_dir instead of a value"));
  EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("generate" + model + " --negative_prompt --seed 3")),
                                          "--negative_prompt: got the flag --seed instead of a value"));
}

// init and convert write whole pipelines: over an existing one only when asked, over their own input never.
TEST(Cli, InitAndConvertReplaceAPipelineOnlyWithOverwrite) {
  sd::test::TempDir dir;
  const std::string m = (dir.path() / "m").string(), copy = (dir.path() / "copy").string();
  ASSERT_EQ(run_command(sdtrain("init --preset tiny --out " + m)).exit_code, 0);
  const std::string unet = "/unet/diffusion_pytorch_model.safetensors";
  const std::string before = io::read_text_file(m + unet);
  EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("init --preset tiny --seed 3 --out " + m)),
                                          "--out " + m +
                                              ": already holds a pipeline (model_index.json); pass "
                                              "--overwrite to replace it"));
  EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("convert " + m + " " + m + "/ --variant fp16")),
                                          "OUTPUT " + m + "/: is the input pipeline; write to a new folder"));
  EXPECT_TRUE(sd::test::is_one_line_error(
      run_command(sdtrain("convert " + m + " " + m + " --variant fp16 --overwrite")), "is the input pipeline"));
  EXPECT_EQ(io::read_text_file(m + unet), before);

  ASSERT_EQ(run_command(sdtrain("convert " + m + " " + copy)).exit_code, 0);
  EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("convert " + m + " " + copy + " --variant fp16")),
                                          "OUTPUT " + copy + ": already holds a pipeline"));
  ASSERT_EQ(run_command(sdtrain("convert " + m + " " + copy + " --variant fp16 --overwrite")).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(copy + "/unet/diffusion_pytorch_model.fp16.safetensors"));
  const std::string single = (dir.path() / "m.SafeTensors").string(), pickle = (dir.path() / "m.CKPT").string();
  ASSERT_EQ(run_command(sdtrain("convert " + m + " " + single)).exit_code, 0);
  EXPECT_TRUE(std::filesystem::is_regular_file(single));
  EXPECT_TRUE(sd::test::is_one_line_error(
      run_command(sdtrain("convert " + m + " " + pickle)),
      pickle + ": single files are written as .safetensors (which A1111 and ComfyUI read), not .ckpt"));
  ASSERT_EQ(run_command(sdtrain("init --preset tiny --seed 3 --out " + m + " --overwrite")).exit_code, 0);
  EXPECT_NE(io::read_text_file(m + unet), before);
}

}  // namespace
}  // namespace sd

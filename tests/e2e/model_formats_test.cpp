// The model files people have, through the binary: a torch.save .bin pipeline, a single-file checkpoint and a
// cached Hub name generate exactly tiny-sd1's images; `sdtrain convert` goes to the single file and back and writes
// an fp16 variant that loads; a pickle that would run code is refused with one line before anything is written.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "io/torch_zip_util.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using sd::test::fixtures;
using sd::test::TempDir;

std::string quote(const fs::path& p) { return "'" + p.string() + "'"; }

sd::test::CommandResult sdtrain(const std::string& args) {
  return sd::test::run_command(sd::test::sdtrain_binary() + " " + args);
}

// The images `generate` makes from `model_args` (2 steps, fixed seed), as the raw float tensor.
at::Tensor generated(const std::string& model_args, const fs::path& dir, const std::string& env = "") {
  const fs::path raw = dir / "raw.safetensors";
  const auto r = sd::test::run_command(env + sd::test::sdtrain_binary() + " generate " + model_args +
                                       " --prompt 'a red cube' --num_inference_steps 2 --seed 3 --threads 1"
                                       " --output_dir '' --save_raw " +
                                       quote(raw));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? io::load_safetensors(raw).at("images") : at::Tensor();
}

void expect_same_tensors(const fs::path& actual, const fs::path& expected) {
  const io::TensorMap a = io::load_safetensors(actual), e = io::load_safetensors(expected);
  ASSERT_EQ(a.size(), e.size()) << actual;
  for (const auto& [name, tensor] : e) {
    ASSERT_TRUE(a.count(name)) << name;
    EXPECT_TRUE(a.at(name).scalar_type() == tensor.scalar_type() && at::equal(a.at(name), tensor)) << name;
  }
}

class ModelFormats : public ::testing::Test {
 protected:
  void SetUp() override { reference_ = generated("--model " + quote(fixtures() / "tiny-sd1"), dir_.path()); }
  TempDir dir_;
  at::Tensor reference_;
};

TEST_F(ModelFormats, BinPipelineGeneratesTheSameImages) {
  const at::Tensor images = generated("--model " + quote(fixtures() / "formats" / "tiny-sd1-bin"), dir_.path());
  EXPECT_TRUE(images.defined() && at::equal(images, reference_));
}

TEST_F(ModelFormats, SingleFileGeneratesTheSameImages) {
  const fs::path file = fixtures() / "formats" / "tiny-sd1-ldm.safetensors";
  EXPECT_TRUE(at::equal(generated("--model " + quote(file), dir_.path()), reference_));
  EXPECT_TRUE(
      at::equal(generated("--model " + quote(file) + " --config_from " + quote(fixtures() / "tiny-sd1"), dir_.path()),
                reference_));
}

TEST_F(ModelFormats, CachedHubNameGeneratesTheSameImages) {
  const std::string commit = "0123456789abcdef0123456789abcdef01234567";
  const fs::path repo = dir_.path() / "hub" / "models--sdtrain-test--tiny-sd1";
  fs::create_directories(repo / "refs");
  fs::create_directories(repo / "snapshots");
  fs::copy(fixtures() / "tiny-sd1", repo / "blobs", fs::copy_options::recursive);
  fs::create_directory_symlink("../blobs", repo / "snapshots" / commit);
  sd::test::write_bytes(repo / "refs" / "main", commit);
  const std::string env = "HF_HUB_CACHE=" + quote(dir_.path() / "hub") + " ";
  EXPECT_TRUE(at::equal(generated("--model sdtrain-test/tiny-sd1", dir_.path(), env), reference_));

  const auto r = sd::test::run_command(env + sd::test::sdtrain_binary() +
                                       " generate --model sdtrain-test/absent --prompt x --output_dir " +
                                       quote(dir_.path() / "never"));
  EXPECT_TRUE(sd::test::is_one_line_error(r, "huggingface-cli download sdtrain-test/absent"));
  EXPECT_FALSE(fs::exists(dir_.path() / "never"));
}

TEST_F(ModelFormats, ConvertToTheSingleFileAndBack) {
  const fs::path single = dir_.path() / "tiny.safetensors", back = dir_.path() / "back";
  auto r = sdtrain("convert " + quote(fixtures() / "tiny-sd1") + " " + quote(single));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_tensors(single, fixtures() / "formats" / "tiny-sd1-ldm.safetensors");

  r = sdtrain("convert " + quote(fixtures() / "formats" / "tiny-sd1-ldm.safetensors") + " " + quote(back) +
              " --config_from " + quote(fixtures() / "tiny-sd1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* file : {"unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
                           "text_encoder/model.safetensors"})
    expect_same_tensors(back / file, fixtures() / "tiny-sd1" / file);
  EXPECT_TRUE(at::equal(generated("--model " + quote(back), dir_.path()), reference_));
}

TEST_F(ModelFormats, Fp16VariantIsWrittenAndLoads) {
  const fs::path out = dir_.path() / "fp16";
  auto r = sdtrain("convert " + quote(fixtures() / "tiny-sd1") + " " + quote(out) + " --variant fp16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const io::TensorMap unet = io::load_safetensors(out / "unet" / "diffusion_pytorch_model.fp16.safetensors");
  const io::TensorMap source =
      io::load_safetensors(fixtures() / "tiny-sd1" / "unet" / "diffusion_pytorch_model.safetensors");
  EXPECT_TRUE(at::equal(unet.at("conv_in.weight"), source.at("conv_in.weight").to(at::kHalf)));
  EXPECT_TRUE(fs::exists(out / "text_encoder" / "model.fp16.safetensors"));
  EXPECT_FALSE(fs::exists(out / "unet" / "diffusion_pytorch_model.safetensors"));
  const at::Tensor images = generated("--model " + quote(out) + " --variant fp16", dir_.path());
  ASSERT_TRUE(images.defined());
  EXPECT_LT((images - reference_).abs().max().item<double>(), 0.05);  // fp16 weights, float32 compute

  r = sdtrain("generate --model " + quote(out) + " --prompt x --output_dir " + quote(dir_.path() / "never"));
  EXPECT_TRUE(sd::test::is_one_line_error(r, "--variant"));
  r = sdtrain("generate --model " + quote(fixtures() / "tiny-sd1") + " --variant fp32 --prompt x --output_dir " +
              quote(dir_.path() / "never"));
  EXPECT_TRUE(sd::test::is_one_line_error(r, "no component has weights of variant 'fp32'"));
  EXPECT_FALSE(fs::exists(dir_.path() / "never"));
}

TEST_F(ModelFormats, CodeRunningPickleIsRefusedBeforeAnythingRuns) {
  const fs::path model = dir_.path() / "evil";
  fs::copy(fixtures() / "formats" / "tiny-sd1-bin", model, fs::copy_options::recursive);
  const fs::path marker = dir_.path() / "pwned";
  const std::string pickle =
      "\x80\x02"
      "cos\nsystem\n" +
      sd::test::pickle_unicode("touch " + marker.string()) + "\x85R.";
  sd::test::write_bytes(model / "unet" / "diffusion_pytorch_model.bin", sd::test::torch_archive(pickle, ""));
  const auto r = sdtrain("generate --model " + quote(model) + " --prompt x --output_dir " + quote(dir_.path() / "out"));
  EXPECT_TRUE(sd::test::is_one_line_error(r, "refusing to load: the pickle asks for the Python object 'os.system'"));
  EXPECT_NE(r.output.find((model / "unet" / "diffusion_pytorch_model.bin").string()), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_FALSE(fs::exists(dir_.path() / "out"));
}

}  // namespace
}  // namespace sd

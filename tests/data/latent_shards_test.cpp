// The latent shard format read from a directory written by hand, as docs/data.md tells another tool to write it.
#include "data/latent_shards.h"

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace sd::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Samples 0-2 in two shards at resolution 64 (latents 4 x 8 x 8, text 77 x 32): moments, sample 1 with two captions.
class LatentShards : public ::testing::Test {
 protected:
  void SetUp() override {
    io::TensorMap first_shard = sample(0, 1);
    first_shard.merge(sample(1, 2));
    io::save_safetensors(dir() / "latents-00000.safetensors", first_shard);
    io::save_safetensors(dir() / "latents-00001.safetensors", sample(2, 1));
    io::save_safetensors(dir() / "empty_caption.safetensors", {{"text_hidden", at::full({1, 77, 32}, -1.0)}});
    write_index(index());
  }

  // Tensors of sample n in half precision, as MosaicML stores them: readers convert to float32.
  static io::TensorMap sample(int64_t n, int64_t captions, std::vector<int64_t> latent = {4, 8, 8}) {
    return {{fmt::format("{}.latent_mean.64", n), at::full(latent, static_cast<double>(n)).to(at::kHalf)},
            {fmt::format("{}.latent_std.64", n), at::full(latent, 0.5).to(at::kHalf)},
            {fmt::format("{}.text_hidden", n),
             at::arange(captions).view({-1, 1, 1}).expand({captions, 77, 32}).to(at::kFloat)}};
  }

  static json index() {
    return {{"format", "sdtrain-latents"},
            {"version", 1},
            {"latents", "moments"},
            {"resolutions", {64}},
            {"scaling_factor", 0.18215},
            {"latent_channels", 4},
            {"text_dim", 32},
            {"shards",
             {{{"file", "latents-00000.safetensors"}, {"first_sample", 0}, {"samples", 2}},
              {{"file", "latents-00001.safetensors"}, {"first_sample", 2}, {"samples", 1}}}}};
  }

  void write_index(const json& j) const { io::write_text_file(dir() / "index.json", j.dump()); }
  fs::path dir() const { return dir_.path(); }

  sd::test::TempDir dir_;
};

TEST_F(LatentShards, ReadsWhatTheFormatDescribes) {
  LatentDataset dataset(dir(), 64);
  ASSERT_EQ(dataset.size(), 3);
  EXPECT_TRUE(dataset.index().moments);
  EXPECT_EQ(dataset.latent_size(2), (Resolution{8, 8}));
  const LatentSample two = dataset.read(2);
  EXPECT_EQ(two.mean.scalar_type(), at::kFloat);
  EXPECT_EQ(two.mean[0][0][0].item<float>(), 2.0f);
  EXPECT_EQ(two.std.sizes(), (at::IntArrayRef{4, 8, 8}));
  EXPECT_EQ(dataset.read(1).text_hidden.size(0), 2);
  ASSERT_TRUE(dataset.has_empty_caption());
  EXPECT_EQ(dataset.empty_caption().sizes(), (at::IntArrayRef{77, 32}));
  dataset.select({2, 0});
  EXPECT_EQ(dataset.size(), 2);
  EXPECT_EQ(dataset.read(0).mean[0][0][0].item<float>(), 2.0f);

  fs::remove(dir() / "empty_caption.safetensors");  // optional: only caption dropout needs it
  EXPECT_FALSE(LatentDataset(dir(), 64).has_empty_caption());
}

// Ranks compare the fingerprint: the same copy at another mount point agrees; another shard size or another subset
// of the samples does not.
TEST_F(LatentShards, FingerprintIsTheShardsNamesAndSizesAndTheSamplesKept) {
  const std::string whole = LatentDataset(dir(), 64).fingerprint();
  const fs::path copy = dir() / "copy";
  fs::create_directories(copy);
  for (const char* file : {"index.json", "latents-00000.safetensors", "latents-00001.safetensors"})
    fs::copy_file(dir() / file, copy / file);
  EXPECT_EQ(LatentDataset(copy, 64).fingerprint(), whole);
  LatentDataset subset(copy, 64);
  subset.select({2, 0});
  EXPECT_NE(subset.fingerprint(), whole);
  io::save_safetensors(copy / "latents-00001.safetensors", sample(2, 2));  // another caption
  EXPECT_NE(LatentDataset(copy, 64).fingerprint(), whole);
}

TEST_F(LatentShards, MissingOrMismatchedPiecesAreOneErrorNamingThem) {
  auto error = [&](int resolution = 64) { return sd::test::error_of([&] { LatentDataset(dir(), resolution); }); };
  EXPECT_NE(error(256).find("holds latents at resolution(s) 64, not at --resolution 256"), std::string::npos);

  io::TensorMap std_of_other_size = sample(2, 1);
  std_of_other_size["2.latent_std.64"] = at::ones({4, 8, 9});
  io::save_safetensors(dir() / "latents-00001.safetensors", std_of_other_size);
  EXPECT_NE(error().find("latents-00001.safetensors: 2.latent_std.64 has shape [4, 8, 9]; expected [4, 8, 8]"),
            std::string::npos)
      << error();
  io::save_safetensors(dir() / "latents-00001.safetensors", sample(2, 1, {3, 8, 8}));
  EXPECT_NE(error().find("2.latent_mean.64 has shape [3, 8, 8]; expected [4, -1, -1]"), std::string::npos) << error();

  fs::remove(dir() / "latents-00001.safetensors");
  EXPECT_NE(error().find("latents-00001.safetensors is listed in index.json but missing"), std::string::npos);

  json gap = index();
  gap["shards"][1]["first_sample"] = 3;
  write_index(gap);
  EXPECT_NE(error().find("expected consecutive, non-empty ranges"), std::string::npos);

  // An index claiming far more samples than a shard can name is refused before anything is sized by the claim.
  io::save_safetensors(dir() / "latents-00001.safetensors", sample(2, 1));
  json huge = index();
  huge["shards"][1]["samples"] = int64_t{1} << 40;
  write_index(huge);
  EXPECT_NE(error().find("shard latents-00001.safetensors claims 1099511627776 samples, more than 10000000"),
            std::string::npos)
      << error();
  // A claim within that bound but beyond what the shard holds is refused by the shard's check, naming the sample.
  json more = index();
  more["shards"][1]["samples"] = 5000;
  write_index(more);
  EXPECT_NE(error().find("latents-00001.safetensors: no tensor '3.latent_mean.64'"), std::string::npos) << error();

  fs::remove(dir() / "index.json");
  EXPECT_NE(error().find("no index.json (not written by `sdtrain preprocess`, or its preprocessing has not finished"),
            std::string::npos);
}

}  // namespace
}  // namespace sd::data

#include "data/webdataset.h"

#include <fstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/image.h"
#include "io/tar_builder.h"
#include "test_util.h"

namespace sd::data {
namespace {

namespace fs = std::filesystem;
using sd::test::TarBuilder;
using sd::test::TempDir;

using KeyAndExtension = std::optional<std::pair<std::string, std::string>>;

TEST(WebDataset, KeyIsThePathUpToTheBaseNamesFirstDot) {
  EXPECT_EQ(split_sample_key("00000/000123.jpg"), KeyAndExtension({"00000/000123", "jpg"}));
  EXPECT_EQ(split_sample_key("a.b/c.seg.png"), KeyAndExtension({"a.b/c", "seg.png"}));
  EXPECT_EQ(split_sample_key("000123.json"), KeyAndExtension({"000123", "json"}));
  EXPECT_EQ(split_sample_key("dir/README"), std::nullopt);
  EXPECT_EQ(split_sample_key("dir/.hidden"), std::nullopt);
}

TEST(WebDataset, IndexFindsEachSamplesImageAndCaptionFromTheHeadersAlone) {
  TempDir dir;
  // As img2dataset writes a shard: image, caption and metadata per key.
  TarBuilder()
      .file("000000000.jpg", "J0")
      .file("000000000.txt", "a red car")
      .file("000000000.json", "{}")
      .file("000000001.WEBP", "W1")
      .file("000000001.json", R"({"caption": "a dog"})")
      .end()
      .write(dir.path() / "00000.tar");
  const ShardIndex index = index_shard(dir.path() / "00000.tar", 7);
  ASSERT_EQ(index.samples.size(), 2u);
  // Every member takes a header block and its data padded to a block: the jpg's data is at 512, the txt's at 1536.
  EXPECT_EQ(index.samples[0].image_offset, 512u);
  EXPECT_EQ(index.samples[0].image_size, 2u);
  EXPECT_EQ(index.samples[0].caption_offset, 1536u);
  EXPECT_FALSE(index.samples[0].caption_is_json);  // txt wins over json
  EXPECT_EQ(index.samples[0].shard, 7u);
  EXPECT_TRUE(index.samples[1].caption_is_json);  // extensions are lower-cased: WEBP is an image
  EXPECT_EQ(index.incomplete, 0);
  EXPECT_TRUE(index.warnings.empty());
}

TEST(WebDataset, SamplesWithoutImageOrCaptionAreCountedAndStrayMembersWarnedAbout) {
  TempDir dir;
  TarBuilder()
      .file("README", "no extension")
      .file("1.jpg", "no caption")
      .file("2.txt", "no image")
      .file("3.png", "first")
      .file("3.png", "second")
      .file("3.txt", "kept")
      .end()
      .write(dir.path() / "s.tar");
  const ShardIndex index = index_shard(dir.path() / "s.tar", 0);
  ASSERT_EQ(index.samples.size(), 1u);
  EXPECT_EQ(index.incomplete, 2);
  EXPECT_EQ(index.incomplete_example, (dir.path() / "s.tar").string() + ": '1'");
  ASSERT_EQ(index.warnings.size(), 2u);
  EXPECT_NE(index.warnings[0].find("s.tar: member 'README' has no extension"), std::string::npos);
  EXPECT_NE(index.warnings[1].find("s.tar: sample '3' has two 'png' files"), std::string::npos);
}

TEST(WebDataset, TruncatedShardKeepsTheSamplesBeforeTheDamage) {
  TempDir dir;
  TarBuilder tar;
  tar.file("0.jpg", "a").file("0.txt", "b").file("1.jpg", std::string(5000, 'c'));
  std::string bytes = tar.bytes();
  bytes.resize(bytes.size() - 3000);
  TarBuilder().raw(bytes).write(dir.path() / "t.tar");
  const ShardIndex index = index_shard(dir.path() / "t.tar", 0);
  EXPECT_EQ(index.samples.size(), 1u);
  ASSERT_EQ(index.warnings.size(), 1u);
  EXPECT_NE(index.warnings[0].find("member '1.jpg'"), std::string::npos);
}

TEST(WebDataset, NotATarIsAnErrorNamingIt) {
  TempDir dir;
  std::ofstream(dir.path() / "x.tar") << std::string(1000, 'x');
  EXPECT_NE(sd::test::error_of([&] { WebDatasetShards({dir.path() / "x.tar"}, "text", 1); }).find("x.tar: not a tar"),
            std::string::npos);
}

// A 6x4 PNG whose pixels are all `value`.
std::string png_bytes(const fs::path& dir, uint8_t value) {
  const fs::path path = dir / "tmp.png";
  io::save_png(path, io::RgbImage{6, 4, std::vector<uint8_t>(6 * 4 * 3, value)});
  return io::read_text_file(path);
}

TEST(WebDataset, ShardsReadEachSampleWithOnePreadAndReplaceUndecodableImages) {
  TempDir dir;
  TarBuilder()
      .file("a.png", png_bytes(dir.path(), 10))
      .file("a.txt", "from txt")
      .file("b.png", "not an image")
      .file("b.txt", "broken")
      .end()
      .write(dir.path() / "0.tar");
  TarBuilder()
      .file("c.png", png_bytes(dir.path(), 30))
      .file("c.json", R"({"text": "from the caption column"})")
      .file("d.png", png_bytes(dir.path(), 40))
      .file("d.json", R"({"caption": "img2dataset's key"})")
      .file("e.png", png_bytes(dir.path(), 50))
      .file("e.json", R"({"url": "no caption"})")
      .end()
      .write(dir.path() / "1.tar");
  const WebDatasetShards shards({dir.path() / "0.tar", dir.path() / "1.tar"}, "text", 2);
  ASSERT_EQ(shards.size(), 5);
  EXPECT_EQ(shards.num_shards(), 2);
  EXPECT_EQ(shards.read(0).captions, std::vector<std::string>{"from txt"});
  EXPECT_EQ(shards.read(2).captions, std::vector<std::string>{"from the caption column"});
  EXPECT_EQ(shards.read(3).captions, std::vector<std::string>{"img2dataset's key"});
  EXPECT_THROW(shards.read(4), UnusableSample);
  EXPECT_EQ(shards.describe(1), (dir.path() / "0.tar").string() + ": sample 'b'");

  // b's image does not decode and e has no caption: each is replaced by the sample after it, wrapping around, with
  // one warning per replaced sample however often it is drawn.
  testing::internal::CaptureStderr();
  EXPECT_EQ(shards.decode(0).image.pixels[0], 10);
  EXPECT_EQ(shards.decode(1).image.pixels[0], 30);
  EXPECT_EQ(shards.decode(1).captions, std::vector<std::string>{"from the caption column"});
  EXPECT_EQ(shards.decode(4).image.pixels[0], 10);
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find("0.tar: sample 'b': "), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("(1 sample(s) replaced so far)"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("1.tar: sample 'e': no .txt caption"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("(2 sample(s) replaced so far)"), std::string::npos) << warnings;
  EXPECT_EQ(warnings.find("(3 sample(s)"), std::string::npos) << warnings;

  // Only the headers of images are read to bucket them.
  const std::vector<Resolution> sizes = image_sizes(shards, {9, 9}, 2);
  EXPECT_EQ(sizes, (std::vector<Resolution>{{6, 4}, {9, 9}, {6, 4}, {6, 4}, {6, 4}}));

  // A shard that shrinks or vanishes after indexing is an error, not a replacement: no other sample stands in for
  // lost data. The message names the sample (a's header survives the cut, the end of its image and its caption do not).
  fs::resize_file(dir.path() / "0.tar", 520);
  EXPECT_NE(sd::test::error_of([&] { shards.decode(0); }).find("0.tar: sample 'a': its caption (8 bytes at offset "),
            std::string::npos);
  EXPECT_NE(sd::test::error_of([&] { shards.image_head(0, 4096); }).find("0.tar: sample 'a': its image ("),
            std::string::npos);
  fs::remove(dir.path() / "1.tar");
  EXPECT_NE(sd::test::error_of([&] { shards.decode(2); }).find("1.tar: cannot open the tar archive"),
            std::string::npos);
}

// A .json caption may be a list, as an imagefolder caption column may; JSON that does not parse is named as such.
TEST(WebDataset, JsonCaptionsMayBeListsAndBrokenJsonIsNamed) {
  TempDir dir;
  TarBuilder()
      .file("a.png", png_bytes(dir.path(), 10))
      .file("a.json", R"({"caption": ["one", "two"]})")
      .file("b.png", png_bytes(dir.path(), 20))
      .file("b.json", "{not json")
      .file("c.png", png_bytes(dir.path(), 30))
      .file("c.json", R"({"caption": ["one", 2]})")
      .end()
      .write(dir.path() / "0.tar");
  const WebDatasetShards shards({dir.path() / "0.tar"}, "text", 1);
  EXPECT_EQ(shards.read(0).captions, (std::vector<std::string>{"one", "two"}));
  auto unusable = [&](int64_t index) {
    try {
      shards.read(index);
    } catch (const UnusableSample& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(unusable(1), (dir.path() / "0.tar").string() + ": sample 'b': its .json is not valid JSON");
  EXPECT_EQ(unusable(2), (dir.path() / "0.tar").string() +
                             ": sample 'c': no .txt caption, and its .json has no 'text' or 'caption' that is a string "
                             "or a list of strings");
}

TEST(WebDataset, ShardsWithoutAnyUsableSampleAreAnError) {
  TempDir dir;
  TarBuilder().file("a.jpg", "x").end().write(dir.path() / "0.tar");
  EXPECT_EQ(sd::test::error_of([&] { WebDatasetShards({dir.path() / "0.tar"}, "text", 1); }),
            "--train_shards: the 1 shard(s) hold no sample with both an image and a caption (a sample's members must "
            "follow each other in the tar, as `tar --sort=name` and img2dataset write them)");
}

// Ranks compare the fingerprint: the same shards at another mount point agree; a shard of another size does not.
TEST(WebDataset, FingerprintIsTheShardsNamesAndSizes) {
  TempDir dir;
  for (const fs::path& folder : {dir.path() / "a", dir.path() / "b"}) {
    fs::create_directories(folder);
    TarBuilder().file("0.jpg", "J0").file("0.txt", "a red car").end().write(folder / "0.tar");
  }
  const std::string a = WebDatasetShards({dir.path() / "a" / "0.tar"}, "text", 1).fingerprint();
  EXPECT_EQ(WebDatasetShards({dir.path() / "b" / "0.tar"}, "text", 1).fingerprint(), a);
  TarBuilder()
      .file("0.jpg", "J0")
      .file("0.txt", "a red car")
      .file("1.jpg", "J1")
      .file("1.txt", "x")
      .end()
      .write(dir.path() / "b" / "0.tar");
  EXPECT_NE(WebDatasetShards({dir.path() / "b" / "0.tar"}, "text", 1).fingerprint(), a);
}

}  // namespace
}  // namespace sd::data

#include "data/webdataset.h"

#include <fstream>

#include "core/error.h"
#include "io/tar_builder.h"
#include "test_util.h"

namespace sd::data {
namespace {

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

std::vector<WebDatasetSample> read_all(WebDatasetReader& reader) {
  std::vector<WebDatasetSample> samples;
  while (std::optional<WebDatasetSample> s = reader.next()) samples.push_back(std::move(*s));
  return samples;
}

TEST(WebDataset, ConsecutiveMembersWithOneKeyFormASample) {
  TempDir dir;
  // As img2dataset writes a shard: image, caption and metadata per key.
  TarBuilder()
      .file("000000000.jpg", "J0")
      .file("000000000.txt", "a red car")
      .file("000000000.json", "{}")
      .file("000000001.WEBP", "W1")
      .file("000000001.txt", "a dog")
      .file("000000002.png", "P2")
      .end()
      .write(dir.path() / "00000.tar");
  WebDatasetReader reader(dir.path() / "00000.tar");
  const std::vector<WebDatasetSample> samples = read_all(reader);
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].key, "000000000");
  EXPECT_EQ(samples[0].files,
            (std::map<std::string, std::string>{{"jpg", "J0"}, {"txt", "a red car"}, {"json", "{}"}}));
  EXPECT_EQ(samples[0].shard, dir.path() / "00000.tar");
  EXPECT_EQ(samples[1].files.at("webp"), "W1");  // extensions are lower-cased
  EXPECT_EQ(find_image(samples[1])->first, "webp");
  EXPECT_EQ(*find_image(samples[2])->second, "P2");
  EXPECT_FALSE(samples[2].files.count("txt"));
  EXPECT_TRUE(reader.warnings().empty());
}

TEST(WebDataset, StrayMembersAndDuplicatesAreWarnedAboutAndDropped) {
  TempDir dir;
  TarBuilder()
      .file("README", "no extension")
      .file("7.jpg", "first")
      .file("7.jpg", "second")
      .end()
      .write(dir.path() / "s.tar");
  WebDatasetReader reader(dir.path() / "s.tar");
  const std::vector<WebDatasetSample> samples = read_all(reader);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].files.at("jpg"), "first");
  ASSERT_EQ(reader.warnings().size(), 2u);
  EXPECT_NE(reader.warnings()[0].find("s.tar: member 'README' has no extension"), std::string::npos);
  EXPECT_NE(reader.warnings()[1].find("s.tar: sample '7' has two 'jpg' files"), std::string::npos);
}

TEST(WebDataset, TruncatedShardKeepsTheSamplesBeforeTheDamage) {
  TempDir dir;
  TarBuilder tar;
  tar.file("0.jpg", "a").file("0.txt", "b").file("1.jpg", std::string(5000, 'c'));
  std::string bytes = tar.bytes();
  bytes.resize(bytes.size() - 3000);
  TarBuilder().raw(bytes).write(dir.path() / "t.tar");
  WebDatasetReader reader(dir.path() / "t.tar");
  const std::vector<WebDatasetSample> samples = read_all(reader);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].key, "0");
  ASSERT_EQ(reader.warnings().size(), 1u);
  EXPECT_NE(reader.warnings()[0].find("member '1.jpg'"), std::string::npos);
}

TEST(WebDataset, NotATarIsAnErrorNamingIt) {
  TempDir dir;
  std::ofstream(dir.path() / "x.tar") << std::string(1000, 'x');
  EXPECT_THROW(WebDatasetReader(dir.path() / "x.tar"), sd::Error);
}

}  // namespace
}  // namespace sd::data

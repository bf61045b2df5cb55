#include "data/shard_pattern.h"

#include <fstream>
#include <functional>

#include "core/error.h"
#include "test_util.h"

namespace sd::data {
namespace {

namespace fs = std::filesystem;
using Names = std::vector<std::string>;

using sd::test::error_of;

TEST(ShardPattern, ZeroPaddedRangesAsWebDatasetWritesThem) {
  const Names names = expand_braces("data/{00000..00099}.tar");
  ASSERT_EQ(names.size(), 100u);
  EXPECT_EQ(names.front(), "data/00000.tar");
  EXPECT_EQ(names[42], "data/00042.tar");
  EXPECT_EQ(names.back(), "data/00099.tar");
  EXPECT_EQ(expand_braces("{07..10}"), (Names{"07", "08", "09", "10"}));  // padded to the wider bound
  EXPECT_EQ(expand_braces("{8..11}"), (Names{"8", "9", "10", "11"}));     // no leading zero, no padding
  EXPECT_EQ(expand_braces("{0..2}"), (Names{"0", "1", "2"}));             // a lone "0" does not pad
}

TEST(ShardPattern, RangesCountDownTakeStepsAndLetters) {
  EXPECT_EQ(expand_braces("{4..1}"), (Names{"4", "3", "2", "1"}));
  EXPECT_EQ(expand_braces("{2..-1}"), (Names{"2", "1", "0", "-1"}));
  EXPECT_EQ(expand_braces("{1..10..3}"), (Names{"1", "4", "7", "10"}));
  EXPECT_EQ(expand_braces("{a..g..2}"), (Names{"a", "c", "e", "g"}));
  EXPECT_EQ(expand_braces("{Y..b}"), (Names{"Y", "Z", "a", "b"}));
}

TEST(ShardPattern, ListsNestingAndSeveralGroups) {
  EXPECT_EQ(expand_braces("{a,b}/{0..1}.tar"), (Names{"a/0.tar", "a/1.tar", "b/0.tar", "b/1.tar"}));
  EXPECT_EQ(expand_braces("python{2.{5..7},3.{2,3}}"),
            (Names{"python2.5", "python2.6", "python2.7", "python3.2", "python3.3"}));
  EXPECT_EQ(expand_braces("index.html{,.backup}"), (Names{"index.html", "index.html.backup"}));
  EXPECT_EQ(expand_braces("plain.tar"), (Names{"plain.tar"}));
  EXPECT_EQ(expand_braces("{x}"), (Names{"{x}"}));  // neither list nor range: stays
  EXPECT_EQ(expand_braces(R"({1\,2,3})"), (Names{"1,2", "3"}));
}

TEST(ShardPattern, BadPatternsAreOneLineErrors) {
  EXPECT_EQ(error_of([] { expand_braces("data/{0..9.tar"); }), "shard pattern 'data/{0..9.tar' has unbalanced braces");
  EXPECT_EQ(error_of([] { expand_braces("a}b"); }), "shard pattern 'a}b' has unbalanced braces");
  EXPECT_NE(error_of([] { expand_braces("{0..99999}{0..99999}"); }).find("expands to more than"), std::string::npos);
  EXPECT_NE(error_of([] { expand_braces("{0..99999999999999999999}"); }).find("out of range"), std::string::npos);
}

TEST(ShardPattern, ResolvesGlobsInSortedOrderAndChecksFiles) {
  sd::test::TempDir dir;
  for (const char* name : {"b-01.tar", "a-00.tar", "b-00.tar", "notes.txt"}) std::ofstream(dir.path() / name) << "x";
  const std::string d = dir.path().string();
  EXPECT_EQ(resolve_shards(d + "/*.tar"),
            (std::vector<fs::path>{dir.path() / "a-00.tar", dir.path() / "b-00.tar", dir.path() / "b-01.tar"}));
  EXPECT_EQ(resolve_shards(d + "/{b,a}-00.tar"),
            (std::vector<fs::path>{dir.path() / "b-00.tar", dir.path() / "a-00.tar"}));
  EXPECT_EQ(resolve_shards(d + "/b-*.tar").size(), 2u);
  EXPECT_EQ(error_of([&] { resolve_shards(d + "/*.tgz"); }), "shard pattern '" + d + "/*.tgz' matches no file");
  EXPECT_EQ(error_of([&] { resolve_shards(d + "/a-{00..01}.tar"); }),
            d + "/a-01.tar: shard not found (from the pattern '" + d + "/a-{00..01}.tar')");
}

}  // namespace
}  // namespace sd::data

#include "data/captions.h"

#include <algorithm>
#include <set>

#include "test_util.h"

namespace sd::data {
namespace {

at::Generator gen(uint64_t n) { return stream_generator(1, Stream::kCaptionShuffle, n); }

std::vector<std::string> split(const std::string& caption) {
  std::vector<std::string> tags;
  size_t start = 0;
  for (size_t comma; (comma = caption.find(", ", start)) != std::string::npos; start = comma + 2)
    tags.push_back(caption.substr(start, comma - start));
  tags.push_back(caption.substr(start));
  return tags;
}

TEST(Captions, ShuffleKeepsTheFirstTokensAndPermutesTheRest) {
  const CaptionOptions options{0, true, 2};
  const std::string caption = " 1girl,solo , red hair,smile, outdoors ,sky";
  std::set<std::string> orders;
  for (uint64_t n = 0; n < 20; ++n) {
    at::Generator g = gen(n);
    const std::vector<std::string> tags = split(shuffle_tags(caption, options, g));
    ASSERT_EQ(tags.size(), 6u);
    EXPECT_EQ(tags[0], "1girl");  // kept in place, stripped of spaces
    EXPECT_EQ(tags[1], "solo");
    std::vector<std::string> rest(tags.begin() + 2, tags.end());
    std::sort(rest.begin(), rest.end());
    EXPECT_EQ(rest, (std::vector<std::string>{"outdoors", "red hair", "sky", "smile"}));
    orders.insert(tags[2] + tags[3] + tags[4] + tags[5]);
  }
  EXPECT_GT(orders.size(), 5u);
  at::Generator a = gen(3), b = gen(3);
  EXPECT_EQ(shuffle_tags(caption, options, a), shuffle_tags(caption, options, b));  // a function of the stream
  EXPECT_EQ(shuffle_tags(caption, CaptionOptions{}, a), caption);                   // no --shuffle_caption
  EXPECT_EQ(shuffle_tags("one tag", CaptionOptions{0, true, 5}, a), "one tag");
}

TEST(Captions, DropoutEmptiesTheCaptionAtItsRateAndPicksAmongSeveral) {
  int dropped = 0;
  std::set<int64_t> picked;
  for (int64_t position = 0; position < 1000; ++position) {
    const SampleStreams streams{4, 2, position};
    const std::optional<int64_t> pick = choose_caption(3, CaptionOptions{0.1, false, 0}, streams);
    dropped += !pick;
    if (pick) picked.insert(*pick);
    EXPECT_EQ(choose_caption(3, CaptionOptions{0.1, false, 0}, streams), pick);  // the same draw every time
  }
  EXPECT_GT(dropped, 70);
  EXPECT_LT(dropped, 130);
  EXPECT_EQ(picked, (std::set<int64_t>{0, 1, 2}));
  EXPECT_EQ(choose_caption(1, CaptionOptions{}, SampleStreams{4, 2, 0}), 0);
  EXPECT_EQ(choose_caption(1, CaptionOptions{1.0, false, 0}, SampleStreams{4, 2, 0}), std::nullopt);
}

TEST(Captions, FlagsOutOfRangeAreErrorsNamingThem) {
  EXPECT_EQ(sd::test::error_of([] {
              validate(CaptionOptions{1.5, false, 0});
            }),
            "--caption_dropout_probability must be in [0, 1], got 1.5");
  EXPECT_EQ(sd::test::error_of([] {
              validate(CaptionOptions{0, true, -1});
            }),
            "--keep_tokens must be at least 0, got -1");
}

}  // namespace
}  // namespace sd::data

#include "data/captions.h"

#include <ATen/ATen.h>

#include <vector>

#include "core/error.h"

namespace sd::data {

namespace {

std::string strip_spaces(const std::string& s) {
  const size_t first = s.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(' ') - first + 1);
}

std::vector<std::string> split_tags(const std::string& caption) {
  std::vector<std::string> tags;
  size_t start = 0;
  for (size_t comma = caption.find(','); comma != std::string::npos; comma = caption.find(',', start)) {
    tags.push_back(strip_spaces(caption.substr(start, comma - start)));
    start = comma + 1;
  }
  tags.push_back(strip_spaces(caption.substr(start)));
  return tags;
}

}  // namespace

void validate(const CaptionOptions& o) {
  SD_CHECK(o.dropout_probability >= 0 && o.dropout_probability <= 1,
           "--caption_dropout_probability must be in [0, 1], got {}", o.dropout_probability);
  SD_CHECK(o.keep_tokens >= 0, "--keep_tokens must be at least 0, got {}", o.keep_tokens);
}

std::optional<int64_t> choose_caption(int64_t count, const CaptionOptions& o, const SampleStreams& streams) {
  if (o.dropout_probability > 0 &&
      at::rand({1}, streams(Stream::kCaptionDropout), at::kDouble).item<double>() < o.dropout_probability)
    return std::nullopt;
  if (count == 1) return 0;
  return at::randint(count, {1}, streams(Stream::kPrompt)).item<int64_t>();
}

std::string shuffle_tags(const std::string& caption, const CaptionOptions& o, at::Generator& gen) {
  if (!o.shuffle) return caption;
  const std::vector<std::string> tags = split_tags(strip_spaces(caption));
  const auto kept = std::min<int64_t>(o.keep_tokens, static_cast<int64_t>(tags.size()));
  const at::Tensor order = at::randperm(static_cast<int64_t>(tags.size()) - kept, gen, at::kLong);
  std::vector<std::string> shuffled(tags.begin(), tags.begin() + kept);
  for (int64_t i = 0; i < order.size(0); ++i) shuffled.push_back(tags[kept + order[i].item<int64_t>()]);
  std::string out = shuffled[0];
  for (size_t i = 1; i < shuffled.size(); ++i) out += ", " + shuffled[i];
  return out;
}

}  // namespace sd::data

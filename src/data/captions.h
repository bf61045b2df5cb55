// What happens to a caption between the dataset and the tokenizer, drawn per use from the sample's random streams:
//   caption dropout (--caption_dropout_probability): the caption becomes "", so the model also learns the
//     unconditional prediction that classifier-free guidance needs (MosaicML trains with 0.1);
//   kohya's --shuffle_caption --keep_tokens N: the comma-separated tags are shuffled, the first N kept in place.
#pragma once
#include <ATen/core/Generator.h>

#include <cstdint>
#include <optional>
#include <string>

#include "data/random_streams.h"

namespace sd::data {

struct CaptionOptions {
  double dropout_probability = 0;
  bool shuffle = false;
  int keep_tokens = 0;
};

// Throws sd::Error naming the flag for a probability outside [0, 1] or a negative --keep_tokens.
void validate(const CaptionOptions& options);

// Which of a sample's `count` captions this use of it trains on, or nullopt when caption dropout empties it. The
// choice among several captions is drawn from the kPrompt stream (tokenize_captions' random.choice per use), the
// dropout from kCaptionDropout.
std::optional<int64_t> choose_caption(int64_t count, const CaptionOptions& options, const SampleStreams& streams);

// kohya's process_caption without dropout: the caption split at commas, each tag stripped of spaces, all but the
// first keep_tokens shuffled, joined with ", ". Returns `caption` unchanged without --shuffle_caption.
std::string shuffle_tags(const std::string& caption, const CaptionOptions& options, at::Generator& gen);

}  // namespace sd::data

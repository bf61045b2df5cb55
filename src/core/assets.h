// Data files linked into the binary (see assets.S): the real CLIP BPE vocabulary.
#pragma once
#include <string_view>

namespace sd::assets {

std::string_view clip_vocab_json();
std::string_view clip_merges_txt();

}  // namespace sd::assets

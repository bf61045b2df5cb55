#include "core/assets.h"

extern "C" {
extern const char sd_asset_vocab_json[], sd_asset_vocab_json_end[];
extern const char sd_asset_merges_txt[], sd_asset_merges_txt_end[];
}

namespace sd::assets {

std::string_view clip_vocab_json() {
  return {sd_asset_vocab_json, static_cast<size_t>(sd_asset_vocab_json_end - sd_asset_vocab_json)};
}

std::string_view clip_merges_txt() {
  return {sd_asset_merges_txt, static_cast<size_t>(sd_asset_merges_txt_end - sd_asset_merges_txt)};
}

}  // namespace sd::assets

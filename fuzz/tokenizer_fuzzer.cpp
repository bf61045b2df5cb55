// The CLIP tokenizer on an arbitrary tokenizer folder and prompt. The input holds five parts split at
// "\n--8<--\n": vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json and the prompt (seeds keep
// the vocabulary small, so that each input loads quickly).
#include "fuzz_util.h"
#include "text/clip_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = sd::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 5);
  const auto dir = sd::fuzz::write_input("", "probe").parent_path() / "tokenizer";
  std::filesystem::create_directories(dir);
  const char* names[] = {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"};
  for (int i = 0; i < 4; ++i) {
    std::filesystem::remove(dir / names[i]);
    if (!parts[i].empty() || i < 2) std::ofstream(dir / names[i], std::ios::binary) << parts[i];
  }
  return sd::fuzz::run_one([&] {
    const auto tokenizer = sd::text::ClipTokenizer::load(dir);
    tokenizer.encode_full(parts[4]);
    tokenizer.decode(tokenizer.encode(parts[4]));
  });
}

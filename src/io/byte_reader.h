// A bounds-checked little-endian cursor over bytes from a file (zip records, pickle streams): every read that would
// run past the end throws one sd::Error naming what was being read, so no parser indexes past its buffer.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"

namespace sd::io {

class ByteReader {
 public:
  // `what` names the bytes in error messages, e.g. "model.bin: data.pkl".
  ByteReader(std::string_view bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}

  size_t position() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }
  bool at_end() const { return pos_ == bytes_.size(); }
  const std::string& what() const { return what_; }

  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint16_t u16() { return little_endian<uint16_t>(); }
  uint32_t u32() { return little_endian<uint32_t>(); }
  uint64_t u64() { return little_endian<uint64_t>(); }
  int32_t i32() { return static_cast<int32_t>(u32()); }

  // The next n bytes (a view into the buffer).
  std::string_view take(uint64_t n) {
    SD_CHECK(n <= remaining(), "{}: truncated: {} bytes needed at offset {}, {} left", what_, n, pos_, remaining());
    std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  void skip(uint64_t n) { take(n); }

 private:
  template <typename T>
  T little_endian() {
    std::string_view raw = take(sizeof(T));
    T value = 0;
    for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<uint8_t>(raw[i])) << (8 * i);
    return value;
  }

  std::string_view bytes_;
  std::string what_;
  size_t pos_ = 0;
};

}  // namespace sd::io

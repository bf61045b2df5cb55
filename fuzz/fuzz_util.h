// Shared by the libFuzzer harnesses: each input is a whole untrusted file (or a few, split at a separator), and the
// one acceptable failure is sd::Error. Anything else escaping (a std:: or LibTorch exception, which the binary would
// print as "internal error") aborts, so libFuzzer reports it as a crash, as it does ASan's and UBSan's findings.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace sd::fuzz {

// A per-process folder under /dev/shm (else /tmp), removed when the fuzzer exits normally (its time is up).
struct InputFolder {
  std::filesystem::path path;
  InputFolder() {
    const std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    path = base / ("sdtrain-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(path);
  }
  ~InputFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

// A file holding `data` in the input folder: the readers take paths.
inline std::filesystem::path write_input(std::string_view data, const std::string& name = "input") {
  static const InputFolder dir;
  const std::filesystem::path path = dir.path / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(data.data(), static_cast<std::streamsize>(data.size()));
  return path;
}

// Splits at "\n--8<--\n", the separator the seed files use between the files of one input.
inline std::vector<std::string> split_parts(std::string_view data, size_t parts) {
  static const std::string_view kSeparator = "\n--8<--\n";
  std::vector<std::string> out;
  while (out.size() + 1 < parts) {
    const size_t at = data.find(kSeparator);
    if (at == std::string_view::npos) break;
    out.emplace_back(data.substr(0, at));
    data.remove_prefix(at + kSeparator.size());
  }
  out.emplace_back(data);
  out.resize(parts);
  return out;
}

// Runs one input: sd::Error is the expected outcome of bad input; any other exception is a finding.
template <typename F>
int run_one(F&& body) {
  try {
    body();
  } catch (const sd::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz finding: non-sd::Error exception escaped: %s\n", e.what());
    std::abort();
  }
  return 0;
}

}  // namespace sd::fuzz

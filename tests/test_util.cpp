#include "test_util.h"

#include "io/image.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <random>

namespace sd::test {

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          ("sdtrain-test-" + std::to_string(getpid()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void write_pattern_png(const std::filesystem::path& path, int width, int height, int stride) {
  io::RgbImage image{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  for (size_t k = 0; k < image.pixels.size(); ++k) image.pixels[k] = static_cast<uint8_t>((k * stride) % 251);
  std::filesystem::create_directories(path.parent_path());
  io::save_png(path, image);
}

CommandResult run_command(const std::string& command) {
  std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string output;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  int status = pclose(pipe);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return {code, output};
}

::testing::AssertionResult is_one_line_error(const CommandResult& result, const std::string& fragment) {
  auto failure = [&](const std::string& why) { return ::testing::AssertionFailure() << why << ":\n" << result.output; };
  if (result.exit_code == 0) return failure("exit code 0");
  if (std::count(result.output.begin(), result.output.end(), '\n') != 1) return failure("not exactly one line");
  if (result.output.rfind("sdtrain: error: ", 0) != 0) return failure("no 'sdtrain: error: ' prefix");
  if (result.output.find(fragment) == std::string::npos) return failure("no '" + fragment + "'");
  return ::testing::AssertionSuccess();
}

}  // namespace sd::test

// Helpers shared by the tests: fixture paths and the fixtures README's tolerance rule.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace sd::test {

inline std::filesystem::path fixtures() { return SDTRAIN_FIXTURES; }
inline std::filesystem::path golden(const std::string& name) { return fixtures() / "golden" / name; }
inline std::string sdtrain_binary() { return SDTRAIN_BINARY; }

// max|actual - expected| <= tol * max|expected|, the fixtures README's comparison rule.
inline ::testing::AssertionResult close_rel_max(const at::Tensor& actual, const at::Tensor& expected, double tol) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != expected " << expected.sizes();
  auto a = actual.detach().to(at::kDouble);
  auto e = expected.detach().to(at::kDouble);
  double err = (a - e).abs().max().item<double>();
  double ref = e.abs().max().item<double>();
  if (err <= tol * ref) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max|err| " << err << " > " << tol << " * max|ref| " << ref << " (ratio "
                                       << err / ref << ")";
}

// A width x height PNG of a striped pattern (pixel byte k = k * stride mod 251), as training images for tests.
void write_pattern_png(const std::filesystem::path& path, int width, int height, int stride);

// A fresh empty directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Runs a shell command, returns {exit code, stdout+stderr}.
struct CommandResult {
  int exit_code;
  std::string output;
};
CommandResult run_command(const std::string& command);

// How sdtrain reports bad input: a non-zero exit and exactly one line, "sdtrain: error: ...", containing `fragment`.
::testing::AssertionResult is_one_line_error(const CommandResult& result, const std::string& fragment);

}  // namespace sd::test

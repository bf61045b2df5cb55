// Helpers shared by the tests: fixture paths and the fixtures README's tolerance rule.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/cpu_features.h"

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

// Three images of the fixtures in `dir`, a Hugging Face imagefolder with captions (metadata.jsonl); returns `dir`.
std::filesystem::path write_image_folder(const std::filesystem::path& dir);

// What the kernel says of this CPU's bf16 (/proc/cpuinfo's flags, an account independent of core/cpu_features.h):
// whether LibTorch runs bf16 in oneDNN (AVX-512 BW, VL and DQ) and whether the CPU has bf16 instructions
// (AVX512_BF16 as well). nullopt where /proc/cpuinfo has no flags.
struct CpuinfoBf16 {
  bool in_onednn, instructions;
};
std::optional<CpuinfoBf16> proc_cpuinfo_bf16();
// The processor's "model name" in /proc/cpuinfo, or "".
std::string proc_cpuinfo_model_name();

// A tolerance for results computed in bf16: `native` where LibTorch runs bf16 through oneDNN (float32
// accumulation), 4x that where it falls back to loops that accumulate in bf16 (core/cpu_features.h).
double bf16_tolerance(double native);

// The UNet parameters (of the diffusers folder `unet_dir`) whose exact gradient is zero whatever the inputs: e.g. a
// per-channel bias feeding a GroupNorm with one channel per group (tiny-sd1's 32 groups over 32 channels). Every
// implementation's gradient for them is float32 rounding noise, which AdamW (dividing each element by its own
// magnitude) turns into lr-sized steps that no other op order reproduces, so runs can only be compared on the other
// parameters. Found from first principles: their gradient, computed in float64 on seeded random inputs, is zero to
// float64 rounding (below 1e-9 of the largest).
std::set<std::string> zero_gradient_parameters(const std::filesystem::path& unet_dir);

// A width x height PNG of a striped pattern (pixel byte k = k * stride mod 251), as training images for tests.
void write_pattern_png(const std::filesystem::path& path, int width, int height, int stride);

// `count` pattern images of varying sizes with a caption file each (kohya's layout: img<i>.png + img<i>.txt).
void write_captioned_images(const std::filesystem::path& dir, int count);

// A fresh empty directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A small tmpfs mounted at `at` for the life of the object, when this process may mount (root in most CI
// containers): a file system that fills up or turns read-only on demand. Check mounted() and skip otherwise.
class Tmpfs {
 public:
  Tmpfs(const std::filesystem::path& at, const std::string& options);
  ~Tmpfs();
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }  // why mounting failed
  bool remount_read_only();

 private:
  std::filesystem::path at_;
  bool mounted_ = false;
  std::string error_;
};

// A pid that no process has (one that just ended), for leftovers of a dead process.
int dead_pid();

// `sdtrain SUBCOMMAND --pretrained_model_name_or_path=<fixtures>/tiny-sd1 --threads=1 ARGS...`: a training
// command on the tiny fixture pipeline.
std::vector<std::string> tiny_training_command(const std::string& subcommand, const std::vector<std::string>& args);

// Runs a shell command, returns {exit code, stdout+stderr}.
struct CommandResult {
  int exit_code;
  std::string output;
};
CommandResult run_command(const std::string& command);

// The message of the sd::Error that `f` throws; "" when it throws none.
std::string error_of(const std::function<void()>& f);

// How sdtrain reports bad input: a non-zero exit and exactly one line, "sdtrain: error: ..." (one rank of several:
// "sdtrain[rank N]: error: ..."), containing `fragment`.
::testing::AssertionResult is_one_line_error(const CommandResult& result, const std::string& fragment);

// How rank `rank`'s error line begins in a run of several ranks: "sdtrain[rank 1]: error: ".
std::string rank_error(int rank);

// Sets (or, given nullopt, unsets) an environment variable while alive, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::optional<std::string>& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) before_ = old;
    value ? setenv(name_.c_str(), value->c_str(), 1) : unsetenv(name_.c_str());
  }
  ~ScopedEnv() { before_ ? setenv(name_.c_str(), before_->c_str(), 1) : unsetenv(name_.c_str()); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> before_;
};

// The vector widths this CPU runs sdtrain's own kernels (core/simd.h) at: AVX2's 256 bits always, AVX-512's 512
// where it has AVX-512F.
inline std::vector<int> vector_widths() {
  return sd::kernel_vector_bits() == 512 ? std::vector<int>{256, 512} : std::vector<int>{256};
}

// Runs the kernels at `bits` while alive, then at the width they had.
struct VectorWidth {
  const int before = sd::kernel_vector_bits();
  explicit VectorWidth(int bits) { sd::set_kernel_vector_bits(bits); }
  ~VectorWidth() { sd::set_kernel_vector_bits(before); }
};

}  // namespace sd::test

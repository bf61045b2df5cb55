// `sdtrain benchmark` on tiny-sd1: every task prints one JSON line per rank with the measured numbers, whose
// FLOPs come from the analytic count; the parameter summary line; and the errors for bad input.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/cpu_features.h"
#include "models/unet/unet_2d_condition.h"
#include "process_util.h"
#include "test_util.h"

namespace sd {
namespace {

using namespace std::chrono_literals;

// The flags of a quick tiny-sd1 run, then `args`.
std::vector<std::string> tiny_benchmark_flags(const std::vector<std::string>& args) {
  std::vector<std::string> flags = {"--model=" + (sd::test::fixtures() / "tiny-sd1").string(), "--resolution=64",
                                    "--steps=2", "--warmup=1", "--threads=1"};
  flags.insert(flags.end(), args.begin(), args.end());
  return flags;
}

std::vector<std::string> benchmark(const std::vector<std::string>& args) {
  std::vector<std::string> command = {sd::test::sdtrain_binary(), "benchmark"};
  for (const std::string& flag : tiny_benchmark_flags(args)) command.push_back(flag);
  return command;
}

// The JSON lines of a run's output (the rest is logging).
std::vector<nlohmann::json> json_lines(const std::string& output) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// The runs below are at 64²: tiny-sd1's VAE has three blocks, so it shrinks images 4x, to 16x16 latents.
int64_t tiny_forward_flops(int64_t batch) {
  return models::count_forward_flops(
      models::UNetConfig::load((sd::test::fixtures() / "tiny-sd1" / "unet" / "config.json").string()), batch, 16, 16);
}

#ifdef SDTRAIN_TCMALLOC
// Whether this kernel gives a process transparent huge pages that it asks for (THP mode "always" or "madvise").
bool kernel_offers_huge_pages() {
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(mode, line) && line.find("[never]") == std::string::npos;
}
#endif

// stdout carries only the JSON line, so that `sdtrain benchmark ... | jq` works; the rest goes to stderr. With an
// EMA, as long training runs keep one.
TEST(BenchmarkE2E, UNetTrainingReportsStepsFlopsMfuMemoryAndOpClasses) {
  std::vector<std::string> stdout_only = {"/bin/sh", "-c", "exec \"$@\" 2>/dev/null", "sh"};
  for (const std::string& arg : benchmark({"--task=unet", "--train_batch_size=2", "--mixed_precision=no", "--use_ema"}))
    stdout_only.push_back(arg);
  auto r = sd::test::run_process(stdout_only, 300s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  ASSERT_EQ(r.output.back(), '\n') << r.output;
  const auto lines = json_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  const auto& j = lines[0];
  EXPECT_EQ(j["step_seconds"].size(), 2u);
  EXPECT_EQ(j["use_ema"], true);
  EXPECT_GT(j["s_per_step"].get<double>(), 0);
  EXPECT_EQ(j["flops_per_step"].get<int64_t>(), 3 * tiny_forward_flops(2));
  EXPECT_GT(j["mfu"].get<double>(), 0);
  EXPECT_LT(j["mfu"].get<double>(), 1.5);
  EXPECT_GT(j["peak_rss_gib"].get<double>(), 0);
#ifdef SDTRAIN_TCMALLOC
  // tcmalloc's memory comes in huge pages (src/cli/huge_pages.h), whose 4 KiB faults cost seconds per GiB here.
  if (kernel_offers_huge_pages()) {
    EXPECT_GT(j["huge_pages_gib"].get<double>(), 0);
  }
#endif
  EXPECT_GT(j["gemm_peak_gflops"]["float32"].get<double>(), 0);
  for (const char* op : {"conv", "linear", "attention", "norm", "optimizer"})
    EXPECT_GT(j["op_seconds"][op].get<double>(), 0) << op;
  // The products taken together: the classes with counted FLOPs, their time per step and its rate against the peak.
  const auto& products = j["products"];
  ASSERT_EQ(products["op_classes"], nlohmann::json({"attention", "conv", "linear"})) << j.dump();
  double product_seconds = 0;
  for (const char* op : {"attention", "conv", "linear"}) product_seconds += j["op_seconds"][op].get<double>();
  EXPECT_NEAR(products["seconds_per_step"].get<double>(), product_seconds / 2, 1e-9 * product_seconds);
  EXPECT_NEAR(products["share_of_peak"].get<double>(),
              products["gflops_per_s"].get<double>() / j["gemm_peak_gflops"]["float32"].get<double>(), 1e-12);
  // Thousands of ops per step even for the tiny UNet, most frequent first.
  EXPECT_GT(j["ops_per_step"].get<double>(), 1000) << j.dump();
  const auto& frequent = j["top_ops_calls_per_step"];
  ASSERT_EQ(frequent.size(), 15u) << j.dump();
  EXPECT_GE(frequent[0][1].get<double>(), frequent[14][1].get<double>()) << j.dump();
}

// The line names the CPU (numbers from different kinds do not compare), and --mixed_precision bf16 computes in bf16
// exactly where bf16 is the faster: emulated bf16 on AVX-512 CPUs without bf16 instructions runs at a quarter of
// float32's speed, and half-rate bf16 dot products without AMX (Sapphire Rapids VMs) at a little over half.
TEST(BenchmarkE2E, NamesTheCpuAndComputesBf16OnlyWhereItIsFast) {
  auto r = sd::test::run_process(benchmark({"--task=textual-inversion", "--mixed_precision=bf16", "--no_profile"}),
                                 300s, {{"SDTRAIN_FORCE_BF16", "\x01unset"}});  // the CPU's own choice
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = json_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  const auto cpuinfo = sd::test::proc_cpuinfo_bf16();
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo flags here";
  const bool avx512 = cpuinfo->in_onednn, bf16 = cpuinfo->instructions, fast = sd::cpu_has_fast_bf16();
  EXPECT_EQ(lines[0]["cpu"]["model"], sd::test::proc_cpuinfo_model_name());
  EXPECT_EQ(lines[0]["cpu"]["kind"], fast     ? "AVX-512 with bf16 instructions"
                                     : bf16   ? "AVX-512 with slow bf16 instructions"
                                     : avx512 ? "AVX-512 without bf16 instructions"
                                              : "no AVX-512");
  EXPECT_EQ(lines[0]["compute_dtype"], fast ? "bf16" : "float32");
  EXPECT_EQ(r.output.find("computing in float32 instead") == std::string::npos, fast) << r.output;
  EXPECT_EQ(r.output.find("SDTRAIN_FORCE_BF16=1 would force bf16") != std::string::npos, avx512 && !fast) << r.output;
  EXPECT_EQ(r.output.find("of its float32 multiply-adds' flops and it has no AMX") != std::string::npos, bf16 && !fast)
      << r.output;
}

// LoRA: the frozen UNet's forward and activation backward (2x the forward), only the adapters counted as trained.
// The summary line names what the run trains besides the task's defaults.
TEST(BenchmarkE2E, LoraTrainingReportsItsRankAndFlops) {
  auto r =
      sd::test::run_process(benchmark({"--task=unet", "--lora_rank=4", "--mixed_precision=no", "--use_ema"}), 300s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("LoRA rank 4 alpha 4 on 88 layers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sdtrain: unet (LoRA rank 4, EMA) " + (sd::test::fixtures() / "tiny-sd1").string() +
                          " 64² batch 1 no (float32 compute)"),
            std::string::npos)
      << r.output;
  const auto lines = json_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0]["lora_rank"], 4);
  EXPECT_EQ(lines[0]["flops_per_step"].get<int64_t>(), 2 * tiny_forward_flops(1));
  EXPECT_GT(lines[0]["peak_rss_gib"].get<double>(), 0);
  // The summary gives the products' own rate beside the step's MFU. (A LoRA run's frozen convolutions multiply as
  // linear layers: no conv class.)
  const auto& products = lines[0]["products"];
  ASSERT_EQ(products["op_classes"], nlohmann::json({"attention", "linear"})) << r.output;
  EXPECT_NE(r.output.find("sdtrain: products (attention, linear): "), std::string::npos) << r.output;
  EXPECT_NE(
      r.output.find(fmt::format("% of the step at {:.0f} GFLOP/s = {:.0f}% of the float32 GEMM peak",
                                products["gflops_per_s"].get<double>(), 100 * products["share_of_peak"].get<double>())),
      std::string::npos)
      << r.output;
}

TEST(BenchmarkE2E, ShardedTrainingOnTwoRanksPrintsALinePerRank) {
  auto r = sd::test::run_process(sd::test::under_launch(2, benchmark({"--task=unet", "--sharding=shard_grad_op",
                                                                      "--mixed_precision=no", "--no_profile"})),
                                 300s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // MosaicML's parameter line, once (from rank 0).
  const std::string parameters = "Model has 4.737444 M parameters and 2.164452 M trainable";
  EXPECT_NE(r.output.find(parameters), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(parameters), r.output.rfind(parameters)) << r.output;
  const auto lines = json_lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (const auto& j : lines) {
    EXPECT_EQ(j["world_size"], 2);
    EXPECT_EQ(j["sharding"], "shard_grad_op");
    EXPECT_TRUE(j["op_seconds"].empty());
    EXPECT_TRUE(j["ops_per_step"].is_null());
  }
}

// bf16 linear layers and frozen GEMM convolutions run their products outside at::mm (core/onednn_matmul.h); the
// profiler still sees them, as linear.
TEST(BenchmarkE2E, Bf16TextualInversionShowsItsProductsAsLinear) {
  auto r = sd::test::run_process(benchmark({"--task=textual-inversion", "--mixed_precision=bf16"}), 300s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = json_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  const auto& seconds = lines[0]["op_seconds"];
  EXPECT_GT(seconds["linear"].get<double>(), 0.1 * seconds["elementwise"].get<double>()) << seconds.dump();
}

TEST(BenchmarkE2E, TextualInversionAndGeneration) {
  auto ti = sd::test::run_process(benchmark({"--task=textual-inversion", "--mixed_precision=no"}), 300s);
  ASSERT_EQ(ti.exit_code, 0) << ti.output;
  ASSERT_EQ(json_lines(ti.output).size(), 1u) << ti.output;
  EXPECT_EQ(json_lines(ti.output)[0]["flops_per_step"].get<int64_t>(), 2 * tiny_forward_flops(1));
  EXPECT_TRUE(json_lines(ti.output)[0]["decode_seconds"].is_null()) << "training decodes no images";
  auto gen =
      sd::test::run_process(benchmark({"--task=generate", "--num_inference_steps=3", "--mixed_precision=no"}), 300s);
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  const auto lines = json_lines(gen.output);
  ASSERT_EQ(lines.size(), 1u) << gen.output;
  EXPECT_EQ(lines[0]["step_seconds"].size(), 4u) << "tiny-sd1's PNDM runs one UNet step more than asked";
  EXPECT_EQ(lines[0]["flops_per_step"].get<int64_t>(), 2 * tiny_forward_flops(1)) << "guidance doubles the batch";
  EXPECT_GT(lines[0]["decode_seconds"].get<double>(), 0) << gen.output;
}

TEST(BenchmarkE2E, BadInput) {
  auto r = sd::test::run_command(sd::test::sdtrain_binary() + " benchmark --model=/nonexistent --steps=1");
  EXPECT_TRUE(sd::test::is_one_line_error(r, "/nonexistent")) << r.output;
  auto res = sd::test::run_command(sd::test::sdtrain_binary() + " benchmark --resolution=30 --steps=1");
  EXPECT_TRUE(sd::test::is_one_line_error(res, "--resolution 30 must be a positive multiple of 8")) << res.output;
  auto ema = sd::test::run_command(sd::test::sdtrain_binary() + " benchmark --task=textual-inversion --use_ema");
  EXPECT_TRUE(sd::test::is_one_line_error(ema, "--use_ema is for --task unet, not textual-inversion")) << ema.output;
  auto data = sd::test::run_command(sd::test::sdtrain_binary() + " benchmark --task=textual-inversion --data=images");
  EXPECT_TRUE(sd::test::is_one_line_error(data, "--data images is for --task unet, not textual-inversion"))
      << data.output;
  auto sharded =
      sd::test::run_command(sd::test::sdtrain_binary() + " benchmark --task=generate --sharding=shard_grad_op");
  EXPECT_TRUE(sd::test::is_one_line_error(
      sharded, "--sharding and --gradient_accumulation_steps are for training tasks, not --task generate"))
      << sharded.output;
}

// bench/ab, the before/after comparison every speed change in docs/benchmarks.md is measured with: it alternates
// the two binaries, prints each round, then the medians and their ratio; a bad argument or a failing run stops it.
TEST(BenchmarkE2E, AbAlternatesTwoBuildsAndComparesTheirMedians) {
  const std::string ab = (sd::test::fixtures().parent_path().parent_path() / "bench" / "ab").string();
  const std::string binary = sd::test::sdtrain_binary();
  std::vector<std::string> command = {ab, "--rounds", "2", binary, binary, "--"};
  for (const std::string& flag : tiny_benchmark_flags({"--task=textual-inversion"})) command.push_back(flag);
  auto r = sd::test::run_process(command, 300s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex round(
      R"(round (\d): before ([0-9.]+) s/step \(([0-9.]+) GiB\), after ([0-9.]+) s/step \([0-9.]+ GiB\))");
  std::vector<double> before, after;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, round)) continue;
    EXPECT_EQ(std::stoi(m[1]), static_cast<int>(before.size()) + 1) << line;
    EXPECT_GT(std::stod(m[3]), 0) << line;
    before.push_back(std::stod(m[2]));
    after.push_back(std::stod(m[4]));
  }
  ASSERT_EQ(before.size(), 2u) << r.output;
  std::smatch median;
  ASSERT_TRUE(std::regex_search(
      r.output, median,
      std::regex(R"(median: before ([0-9.]+) s/step, after ([0-9.]+) s/step, after/before ([0-9.]+))")))
      << r.output;
  EXPECT_NEAR(std::stod(median[1]), (before[0] + before[1]) / 2, 1e-4) << r.output;
  EXPECT_NEAR(std::stod(median[2]), (after[0] + after[1]) / 2, 1e-4) << r.output;
  EXPECT_NEAR(std::stod(median[3]), std::stod(median[2]) / std::stod(median[1]), 1e-3) << r.output;

  auto missing = sd::test::run_process({ab, binary, "/nonexistent/sdtrain", "--", "--task=unet"}, 60s);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("bench/ab: /nonexistent/sdtrain is not an executable sdtrain binary"),
            std::string::npos)
      << missing.output;
  auto rounds = sd::test::run_process({ab, "--rounds", "0", binary, binary, "--"}, 60s);
  EXPECT_EQ(rounds.exit_code, 2);
  EXPECT_NE(rounds.output.find("--rounds expects a positive whole number, got '0'"), std::string::npos)
      << rounds.output;
  auto failing = sd::test::run_process({ab, binary, binary, "--", "--task=nope"}, 60s);
  EXPECT_EQ(failing.exit_code, 1);
  EXPECT_NE(failing.output.find("benchmark failed"), std::string::npos) << failing.output;
  EXPECT_NE(failing.output.find("--task: nope not in {unet,textual-inversion,generate}"), std::string::npos)
      << failing.output;
}

}  // namespace
}  // namespace sd

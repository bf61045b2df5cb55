// Data-parallel scaling across "machines": network namespaces on links shaped with tc (tests/netns_machines.h).
// Runs `sdtrain benchmark --task unet` as 1, 2 and 3 ranks, one per machine with one thread each, started
// torchrun-style, without and with sharding, and prints one JSON line per configuration: step time, compute and
// exposed communication per step (from the benchmark's op profile), the bytes each rank sent per step (its
// interface's counters over the measured steps) against the ring allreduce's ideal, and what the scaling model
// (perf/scaling_model.h) predicts from the run's compute times and the link. Needs root. See docs/scaling.md.
// Usage: build/bench_netns_scaling [--gbit 1] [--delay_ms 0] [--machines 1,2,3] [--sharding no_shard,shard_grad_op]
//   [--preset tiny] [--resolution 128] [--batch 1] [--micro_batches 1] [--bucket_cap_mb 2] [--precision bf16]
//   [--steps 8] [--warmup 3] [--repeats 1] [--work DIR]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "models/unet/unet_config.h"
#include "models/unet/unet_2d_condition.h"
#include "netns_machines.h"
#include "perf/scaling_model.h"
#include "process_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Options {
  double gbit = 1, delay_ms = 0;
  std::vector<int> machines = {1, 2, 3};
  std::vector<std::string> sharding = {"no_shard", "shard_grad_op"};
  std::string preset = "tiny", precision = "bf16";
  int resolution = 128, batch = 1, micro_batches = 1, steps = 8, warmup = 3, repeats = 1;
  double bucket_cap_mb = 2;
  fs::path work = fs::temp_directory_path() / "sdtrain-bench-netns";
};

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--gbit") o.gbit = std::stod(value);
    if (flag == "--delay_ms") o.delay_ms = std::stod(value);
    if (flag == "--machines") {
      o.machines.clear();
      for (const auto& n : split(value)) o.machines.push_back(std::stoi(n));
    }
    if (flag == "--sharding") o.sharding = split(value);
    if (flag == "--preset") o.preset = value;
    if (flag == "--precision") o.precision = value;
    if (flag == "--resolution") o.resolution = std::stoi(value);
    if (flag == "--batch") o.batch = std::stoi(value);
    if (flag == "--micro_batches") o.micro_batches = std::stoi(value);
    if (flag == "--bucket_cap_mb") o.bucket_cap_mb = std::stod(value);
    if (flag == "--steps") o.steps = std::stoi(value);
    if (flag == "--warmup") o.warmup = std::stoi(value);
    if (flag == "--repeats") o.repeats = std::stoi(value);
    if (flag == "--work") o.work = value;
  }
  return o;
}

std::vector<json> json_lines(const std::string& output) {
  std::vector<json> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') lines.push_back(json::parse(line));
  return lines;
}

// `command` as ranks 0..ranks-1, rank r on machine r: each rank's JSON line, or none if a rank failed.
std::vector<json> run_ranks(const sd::test::Machines& machines, int ranks, const std::vector<std::string>& command) {
  static int port = 32000 + getpid() % 1000;
  ++port;  // a fresh port per world: the previous master's may linger in TIME_WAIT
  std::vector<std::unique_ptr<sd::test::Process>> started;
  for (int r = 0; r < ranks; ++r)
    started.push_back(std::make_unique<sd::test::Process>(machines.on(r, command), machines.rank_env(r, ranks, port)));
  std::vector<json> lines;
  for (auto& p : started) {
    const bool ended = p->wait(std::chrono::minutes(20));
    const auto mine = json_lines(p->output());
    if (!ended || p->exit_code() != 0 || mine.empty()) {
      std::fprintf(stderr, "bench: a rank failed (exit %d):\n%s\n", p->exit_code(), p->output().c_str());
      return {};
    }
    lines.push_back(mine.back());
  }
  return lines;
}

// Seconds of a `mib` MiB allreduce over all machines (median over ranks), 2 (N - 1) ring steps of mib / N each.
double allreduce_seconds(const std::string& sdtrain, const sd::test::Machines& machines, double mib) {
  std::vector<double> seconds;
  for (const json& line :
       run_ranks(machines, machines.count(), {sdtrain, "dist-check", "--threads=1", "--size_mb", std::to_string(mib)}))
    seconds.push_back(line.at("allreduce_s").get<double>());
  if (seconds.empty()) {
    std::fprintf(stderr, "bench_netns_scaling: sdtrain dist-check failed between the machines\n");
    std::exit(1);
  }
  return sd::bench::median(seconds);
}

// What the model calls the link: the wire's rate and the hosts' own per-byte cost (copies, reductions, syscalls of
// Gloo over TCP, measured on the unshaped link) in series, and a per-message latency (a one-float allreduce).
struct EffectiveLink {
  double host_gbit_per_s = 0, gbit_per_s = 0, latency_s = 0;
};

// Measures the hosts' cost on the unshaped links, then shapes them (`err` says why that failed) and measures the
// latency through the shaping.
EffectiveLink shape_and_measure_link(const std::string& sdtrain, sd::test::Machines& machines,
                                     const sd::test::LinkShape& shape, std::string& err) {
  const int n = machines.count();
  const double mib = 16, ring_steps = 2.0 * (n - 1);
  const double wire_bits_per_rank = ring_steps / n * mib * (1 << 20) * 8;
  EffectiveLink link;
  if (n == 1) {  // nothing to measure or to send
    err = machines.shape(shape);
    link.gbit_per_s = shape.gbit_per_s > 0 ? shape.gbit_per_s : 1;
    return link;
  }
  link.host_gbit_per_s = wire_bits_per_rank / allreduce_seconds(sdtrain, machines, mib) / 1e9;
  err = machines.shape(shape);
  link.gbit_per_s = shape.gbit_per_s > 0 ? 1 / (1 / shape.gbit_per_s + 1 / link.host_gbit_per_s) : link.host_gbit_per_s;
  // A single tiny message waits for a scheduler slot on a busy host: the median of a few.
  std::vector<double> tiny;
  for (int i = 0; i < 3; ++i) tiny.push_back(allreduce_seconds(sdtrain, machines, 4e-6));
  link.latency_s = sd::bench::median(tiny) / ring_steps;
  return link;
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

// One configuration's ranks, averaged: per step, the time (mean of the measured steps), the communication the
// step waited for, the optimizer, and the bytes a rank sent.
struct Measured {
  double step_s = 0, communication_s = 0, optimizer_s = 0, sent_bytes = 0;
  double compute_weight_bytes = 4;  // per parameter: bf16 compute only where the CPU runs it fast
  double compute_s() const { return step_s - communication_s; }
};

Measured average_ranks(const std::vector<json>& lines) {
  Measured m;
  for (const json& l : lines) {
    const auto steps = l.at("step_seconds").get<std::vector<double>>();
    const json& ops = l.at("op_seconds");
    const double n = static_cast<double>(steps.size());
    m.step_s += mean(steps);
    m.communication_s += ops.value("communication", 0.0) / n;
    m.optimizer_s += ops.value("optimizer", 0.0) / n;
    m.sent_bytes += l.at("network_bytes_per_step").at("sent").get<double>();
  }
  const double ranks = static_cast<double>(lines.size());
  return {m.step_s / ranks, m.communication_s / ranks, m.optimizer_s / ranks, m.sent_bytes / ranks,
          lines.at(0).at("compute_dtype") == "bf16" ? 2.0 : 4.0};
}

// The repeat with the median step time.
Measured median_repeat(std::vector<Measured> repeats) {
  std::sort(repeats.begin(), repeats.end(), [](const Measured& a, const Measured& b) { return a.step_s < b.step_s; });
  return repeats[repeats.size() / 2];
}

// The model of this configuration, its compute times taken from `compute` (a run's measurement).
sd::perf::StepModel step_model(const Options& o, const std::string& sharding, int machines, int64_t parameters,
                               const Measured& compute, const EffectiveLink& link) {
  sd::perf::StepModel m;
  m.machines = machines;
  m.micro_batches = o.micro_batches;
  m.update_s = compute.optimizer_s;
  m.micro_batch_s = (compute.compute_s() - compute.optimizer_s) / o.micro_batches;
  m.sharded = sharding == "shard_grad_op";
  m.parameters = parameters;
  m.bucket_cap_bytes = o.bucket_cap_mb * (1 << 20);
  m.compute_weight_bytes = compute.compute_weight_bytes;
  m.link = {link.gbit_per_s, link.latency_s};
  return m;
}

json prediction_json(const sd::perf::StepPrediction& p, double measured_step_s) {
  return {{"step_s", p.step_s},         {"exposed_communication_s", p.exposed_s},
          {"link_busy_s", p.link_s},    {"wire_bytes", p.wire_bytes},
          {"efficiency", p.efficiency}, {"step_error", p.step_s / measured_step_s - 1}};
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const std::string reason = sd::test::netns_skip_reason();
  if (!reason.empty()) {
    std::fprintf(stderr, "bench_netns_scaling: %s\n", reason.c_str());
    return 1;
  }
  const std::string sdtrain = sd::bench::sdtrain_beside_me();
  const fs::path model = o.work / o.preset;
  if (!sd::bench::ensure_preset(sdtrain, model, o.preset)) return 1;
  const int64_t parameters =
      sd::models::count_parameters(sd::models::UNetConfig::load((model / "unet" / "config.json").string()));

  sd::test::Machines machines(*std::max_element(o.machines.begin(), o.machines.end()));
  std::string err = machines.create();
  EffectiveLink link;
  if (err.empty()) link = shape_and_measure_link(sdtrain, machines, {o.gbit, o.delay_ms}, err);
  if (!err.empty()) {
    std::fprintf(stderr, "bench_netns_scaling: %s\n", err.c_str());
    return 1;
  }

  for (const std::string& sharding : o.sharding) {
    std::optional<Measured> one_machine;
    for (int n : o.machines) {
      const std::vector<std::string> command = {sdtrain,
                                                "benchmark",
                                                "--task=unet",
                                                "--model=" + model.string(),
                                                "--resolution=" + std::to_string(o.resolution),
                                                "--train_batch_size=" + std::to_string(o.batch),
                                                "--gradient_accumulation_steps=" + std::to_string(o.micro_batches),
                                                "--mixed_precision=" + o.precision,
                                                "--sharding=" + sharding,
                                                "--bucket_cap_mb=" + std::to_string(o.bucket_cap_mb),
                                                "--steps=" + std::to_string(o.steps),
                                                "--warmup=" + std::to_string(o.warmup),
                                                "--threads=1",
                                                "--dist_timeout=600"};
      std::vector<Measured> repeats;
      for (int r = 0; r < o.repeats; ++r) {
        const auto lines = run_ranks(machines, n, command);
        if (lines.empty()) return 1;
        repeats.push_back(average_ranks(lines));
      }
      const Measured m = median_repeat(repeats);
      if (n == 1) one_machine = m;
      const double gradient_bytes = 4.0 * static_cast<double>(parameters);
      json line = {
          {"bench", "netns_scaling"},
          {"machines", n},
          {"sharding", sharding},
          {"link",
           {{"shaped_gbit_per_s", o.gbit},
            {"delay_ms", o.delay_ms},
            {"host_gbit_per_s", link.host_gbit_per_s},
            {"effective_gbit_per_s", link.gbit_per_s},
            {"message_latency_s", link.latency_s}}},
          {"preset", o.preset},
          {"resolution", o.resolution},
          {"train_batch_size", o.batch},
          {"micro_batches", o.micro_batches},
          {"bucket_cap_mb", o.bucket_cap_mb},
          {"mixed_precision", o.precision},
          {"trained_parameters", parameters},
          {"repeats", o.repeats},
          {"step_s", m.step_s},
          {"compute_s", m.compute_s()},
          {"exposed_communication_s", m.communication_s},
          {"optimizer_s", m.optimizer_s},
          {"sent_bytes_per_rank", m.sent_bytes},
          {"ideal_allreduce_bytes_per_rank", 2.0 * (n - 1) / n * gradient_bytes},
          {"wire_over_ideal", n > 1 ? m.sent_bytes / (2.0 * (n - 1) / n * gradient_bytes) : 0},
          {"predicted",
           prediction_json(sd::perf::predict_step(step_model(o, sharding, n, parameters, m, link)), m.step_s)}};
      // On separate machines compute would not change with N; here the ranks share this host's cores.
      if (one_machine)
        line["predicted_from_one_machine_compute"] = prediction_json(
            sd::perf::predict_step(step_model(o, sharding, n, parameters, *one_machine, link)), m.step_s);
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

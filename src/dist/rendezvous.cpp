#include "dist/rendezvous.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <optional>

#include "core/error.h"

extern char** environ;

namespace sd::dist {
namespace {

using Env = std::map<std::string, std::string>;

std::optional<std::string> lookup(const Env& env, const std::string& key) {
  auto it = env.find(key);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

bool has(const Env& env, const std::string& key) { return lookup(env, key).has_value(); }

int parse_int(const std::string& key, const std::string& text, int min_value) {
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || value < min_value || value > 1 << 30)
    fail("environment variable {}='{}' must be an integer >= {}", key, text, min_value);
  return static_cast<int>(value);
}

int get_int(const Env& env, const std::string& key, int min_value) {
  auto v = lookup(env, key);
  SD_CHECK(v, "environment variable {} is not set", key);
  return parse_int(key, *v, min_value);
}

std::optional<int> get_optional_int(const Env& env, const std::string& key, int min_value) {
  auto v = lookup(env, key);
  if (!v) return std::nullopt;
  return parse_int(key, *v, min_value);
}

// Splits at commas that are not inside brackets.
std::vector<std::string> split_top_level(const std::string& text, const std::string& what) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    SD_CHECK(depth >= 0 && depth <= 1, "{}='{}': unbalanced or nested '[' ']'", what, text);
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  SD_CHECK(depth == 0, "{}='{}': unbalanced '[' ']'", what, text);
  parts.push_back(current);
  return parts;
}

// "01-03,07" -> 01 02 03 07, keeping the zero padding of each range's lower bound.
std::vector<std::string> expand_range_list(const std::string& ranges, const std::string& what,
                                           const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t comma = ranges.find(',', start);
    std::string item = ranges.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    SD_CHECK(!item.empty(), "{}='{}': empty item in brackets", what, list);
    size_t dash = item.find('-');
    std::string lo_text = item.substr(0, dash);
    std::string hi_text = dash == std::string::npos ? lo_text : item.substr(dash + 1);
    auto is_number = [](const std::string& s) {
      return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
    };
    SD_CHECK(is_number(lo_text) && is_number(hi_text), "{}='{}': '{}' is not a number or range like 01-04", what, list,
             item);
    long lo = std::stol(lo_text), hi = std::stol(hi_text);
    SD_CHECK(lo <= hi, "{}='{}': range '{}' goes backwards", what, list, item);
    SD_CHECK(hi - lo < 100000, "{}='{}': range '{}' is implausibly large", what, list, item);
    for (long i = lo; i <= hi; ++i) out.push_back(fmt::format("{:0{}d}", i, lo_text.size()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// One host expression with any number of bracket groups -> the product of its expansions.
std::vector<std::string> expand_host(const std::string& host, const std::string& what, const std::string& list) {
  std::vector<std::string> results{""};
  size_t pos = 0;
  while (pos < host.size()) {
    size_t open = host.find('[', pos);
    std::string literal = host.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    for (auto& r : results) r += literal;
    if (open == std::string::npos) break;
    size_t close = host.find(']', open);
    SD_CHECK(close != std::string::npos, "{}='{}': unbalanced '[' ']'", what, list);
    auto options = expand_range_list(host.substr(open + 1, close - open - 1), what, list);
    std::vector<std::string> next;
    for (const auto& r : results)
      for (const auto& o : options) next.push_back(r + o);
    results = std::move(next);
    pos = close + 1;
  }
  return results;
}

// Address of rank 0 and the error when ranks span machines and nothing names it.
std::string master_address(const Env& env, const DistEnv& d, const std::optional<std::string>& from_launcher,
                           const std::string& how_to_pass) {
  if (auto addr = lookup(env, "MASTER_ADDR")) return *addr;
  if (from_launcher) return *from_launcher;
  if (d.single_node()) return "127.0.0.1";
  fail(
      "ranks span machines ({} ranks, {} on this one) and the master address is unknown: export MASTER_ADDR=<host of "
      "rank 0> (and optionally MASTER_PORT) to every rank{}",
      d.world_size, d.local_world_size, how_to_pass);
}

void validate(const DistEnv& d, const std::string& names) {
  SD_CHECK(d.world_size >= 1, "{}: world size must be >= 1, got {}", names, d.world_size);
  SD_CHECK(d.rank >= 0 && d.rank < d.world_size, "{}: rank {} is outside 0..{}", names, d.rank, d.world_size - 1);
  SD_CHECK(d.local_world_size >= 1 && d.local_world_size <= d.world_size,
           "{}: local world size {} must be in 1..{} (the world size)", names, d.local_world_size, d.world_size);
  SD_CHECK(d.local_rank >= 0 && d.local_rank < d.local_world_size, "{}: local rank {} is outside 0..{}", names,
           d.local_rank, d.local_world_size - 1);
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what) {
  SD_CHECK(!list.empty(), "{} is empty", what);
  std::vector<std::string> hosts;
  for (const auto& part : split_top_level(list, what)) {
    SD_CHECK(!part.empty(), "{}='{}': empty host name", what, list);
    for (auto& h : expand_host(part, what, list)) hosts.push_back(std::move(h));
  }
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& list, const std::string& what) {
  std::vector<int> counts;
  for (const auto& part : split_top_level(list, what)) {
    size_t paren = part.find('(');
    std::string count_text = part.substr(0, paren);
    int count = parse_int(what, count_text, 0);
    int repeat = 1;
    if (paren != std::string::npos) {
      // "(x3)"
      SD_CHECK(part.size() > paren + 3 && part[paren + 1] == 'x' && part.back() == ')',
               "{}='{}': expected a form like 2(x3),1", what, list);
      repeat = parse_int(what, part.substr(paren + 2, part.size() - paren - 3), 1);
    }
    for (int i = 0; i < repeat; ++i) counts.push_back(count);
  }
  return counts;
}

DistEnv detect_dist_env(const Env& env) {
  DistEnv d;
  if (auto port = get_optional_int(env, "MASTER_PORT", 1)) {
    SD_CHECK(*port <= 65535, "environment variable MASTER_PORT='{}' must be a port number 1..65535", *port);
    d.master_port = *port;
  }

  if (has(env, "RANK") || has(env, "WORLD_SIZE")) {
    // torchrun, sdtrain launch, Kubeflow's PyTorchJob (one process per pod: no LOCAL_* there).
    d.rank = get_int(env, "RANK", 0);
    d.world_size = get_int(env, "WORLD_SIZE", 1);
    d.local_rank = get_optional_int(env, "LOCAL_RANK", 0).value_or(0);
    d.local_world_size = get_optional_int(env, "LOCAL_WORLD_SIZE", 1).value_or(1);
    d.launcher = has(env, "SDTRAIN_LAUNCH") ? "sdtrain-launch" : has(env, "TORCHELASTIC_RUN_ID") ? "torchrun" : "env";
    validate(d, "RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE");
    d.master_addr = master_address(env, d, std::nullopt, "");
    return d;
  }

  if (has(env, "OMPI_COMM_WORLD_RANK")) {
    d.rank = get_int(env, "OMPI_COMM_WORLD_RANK", 0);
    d.world_size = get_int(env, "OMPI_COMM_WORLD_SIZE", 1);
    d.local_rank = get_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    d.local_world_size = get_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    d.launcher = "openmpi";
    validate(d, "OMPI_COMM_WORLD_*");
    d.master_addr = master_address(env, d, std::nullopt, " (Open MPI: mpirun -x MASTER_ADDR=<host> ...)");
    return d;
  }

  if (has(env, "PMI_RANK")) {
    // MPICH / Intel MPI Hydra. The hostfile (-f hosts -n N -ppn K) places ranks 0..K-1 on its first host, but
    // Hydra does not tell the ranks which host that is, hence MASTER_ADDR across machines.
    d.rank = get_int(env, "PMI_RANK", 0);
    d.world_size = get_int(env, "PMI_SIZE", 1);
    d.local_rank = get_optional_int(env, "MPI_LOCALRANKID", 0).value_or(0);
    d.local_world_size = get_optional_int(env, "MPI_LOCALNRANKS", 1).value_or(1);
    d.launcher = "hydra";
    validate(d, "PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS");
    d.master_addr = master_address(
        env, d, std::nullopt, " (Hydra: mpirun -genv MASTER_ADDR <host> ..., Intel MPI also -genv I_MPI_HYDRA_IFACE)");
    return d;
  }

  if (has(env, "SLURM_PROCID") && has(env, "SLURM_NTASKS")) {
    d.rank = get_int(env, "SLURM_PROCID", 0);
    d.world_size = get_int(env, "SLURM_NTASKS", 1);
    d.local_rank = get_optional_int(env, "SLURM_LOCALID", 0).value_or(0);
    // Tasks on this node: the step's per-node list (in node order) at SLURM_NODEID, else the uniform count.
    std::optional<int> local;
    for (const char* key : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
      if (local) break;
      if (auto list = lookup(env, key)) {
        auto counts = expand_slurm_tasks_per_node(*list, key);
        int node = get_optional_int(env, "SLURM_NODEID", 0).value_or(0);
        SD_CHECK(node < static_cast<int>(counts.size()), "{}='{}' has no entry for SLURM_NODEID={}", key, *list, node);
        local = counts[node];
      }
    }
    if (!local) local = get_optional_int(env, "SLURM_NTASKS_PER_NODE", 1);
    d.local_world_size = local.value_or(1);
    d.launcher = "slurm";
    validate(d, "SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_*TASKS_PER_NODE");
    // srun places task 0 on the first node of the step.
    std::optional<std::string> first_host;
    for (const char* key : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto list = lookup(env, key)) {
        first_host = expand_slurm_nodelist(*list, key).front();
        break;
      }
    }
    d.master_addr = master_address(env, d, d.single_node() ? std::nullopt : first_host, "");
    return d;
  }

  d.master_addr = lookup(env, "MASTER_ADDR").value_or("127.0.0.1");
  return d;
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

DistEnv detect_dist_env() { return detect_dist_env(current_environment()); }

std::string describe(const DistEnv& d) {
  return fmt::format("rank {}/{} (local {}/{}) via {}, master {}:{}", d.rank, d.world_size, d.local_rank,
                     d.local_world_size, d.launcher, d.master_addr, d.master_port);
}

}  // namespace sd::dist

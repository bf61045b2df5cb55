// deploy/slurm's batch scripts under a real Slurm: munged, slurmctld and slurmd started here for this one machine
// (a generated slurm.conf, state in a temporary folder, everything stopped at the end), jobs submitted with sbatch,
// preempted with scancel --signal=TERM and requeued with scontrol requeue. Only a machine where the daemons cannot
// start (not root, or slurmd refusing to run) skips, with the reason.
#include <netdb.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "dist/store_listen.h"
#include "io/atomic_file.h"
#include "process_util.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

fs::path deploy_dir() { return test::fixtures().parent_path().parent_path() / "deploy"; }

std::string short_hostname() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string host = name;
  return host.substr(0, host.find('.'));
}

bool resolves(const std::string& host) {
  addrinfo* result = nullptr;
  const bool ok = getaddrinfo(host.c_str(), nullptr, nullptr, &result) == 0;
  if (result) freeaddrinfo(result);
  return ok;
}

std::string last_lines(const fs::path& file, size_t count) {
  if (!fs::exists(file)) return "(no " + file.string() + ")";
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string tail;
  for (size_t i = lines.size() > count ? lines.size() - count : 0; i < lines.size(); ++i) tail += lines[i] + "\n";
  return tail;
}

// A one-node cluster: munged with its own key and socket, slurmctld and slurmd on free ports. The node is this
// machine under its host name, so a job's SLURM_JOB_NODELIST names a host that resolves, as on a real cluster.
class SlurmCluster {
 public:
  // Empty when the cluster is up; otherwise why it could not start.
  std::string start(const fs::path& dir) {
    dir_ = dir;
    if (geteuid() != 0)
      return "slurmd must run as root to start jobs (running as uid " + std::to_string(geteuid()) + ")";
    for (const char* dirname : {"state", "spool", "log"}) fs::create_directories(dir / dirname);
    auto key = test::run_process({"mungekey", "--create", "--force", "--keyfile=" + (dir / "munge.key").string()}, 30s);
    if (key.exit_code != 0) return "mungekey failed: " + key.output;
    munged_ = std::make_unique<test::Process>(std::vector<std::string>{
        "munged", "--foreground", "--force", "--socket=" + socket().string(),
        "--key-file=" + (dir / "munge.key").string(), "--log-file=" + (dir / "log" / "munged.log").string(),
        "--pid-file=" + (dir / "munged.pid").string(), "--seed-file=" + (dir / "munged.seed").string()});
    if (!wait_until([&] { return fs::exists(socket()); }, 20s)) return "munged did not start: " + munged_->output();

    write_config();
    slurmctld_ = std::make_unique<test::Process>(std::vector<std::string>{"slurmctld", "-D", "-f", config().string()});
    slurmd_ = std::make_unique<test::Process>(std::vector<std::string>{"slurmd", "-D", "-f", config().string()});
    const bool idle = wait_until(
        [&] {
          auto r = test::run_process({"sinfo", "--noheader", "--format=%T"}, 10s, env());
          return r.exit_code == 0 && r.output.find("idle") != std::string::npos;
        },
        60s);
    if (!idle)
      return "the node never became idle; slurmctld log:\n" + last_lines(dir / "log" / "slurmctld.log", 10) +
             "slurmd log:\n" + last_lines(dir / "log" / "slurmd.log", 10) + slurmd_->output();
    return "";
  }

  ~SlurmCluster() {
    // Jobs first (their slurmstepd outlive slurmd), then the daemons (killed with their process groups).
    if (slurmctld_) {
      test::run_process({"scancel", "--full", "--user=root"}, 30s, env());
      wait_until([&] { return test::run_process({"squeue", "--noheader"}, 10s, env()).output.empty(); }, 60s);
    }
  }

  // What the client commands need: the generated config.
  std::map<std::string, std::string> env() const { return {{"SLURM_CONF", config().string()}}; }

  // Runs a Slurm client command (sbatch, scancel, ...) against this cluster.
  test::ProcessResult run(const std::vector<std::string>& argv, std::chrono::milliseconds deadline = 60s) const {
    return test::run_process(argv, deadline, env());
  }

  // The job's state from scontrol (PENDING, RUNNING, COMPLETED, FAILED, ...).
  std::string job_state(const std::string& job) const {
    const std::string out = run({"scontrol", "show", "job", job}, 10s).output;
    const size_t at = out.find("JobState=");
    if (at == std::string::npos) return "";
    const size_t begin = at + 9;
    return out.substr(begin, out.find_first_of(" \n", begin) - begin);
  }

  template <typename Predicate>
  static bool wait_until(Predicate done, std::chrono::milliseconds deadline) {
    const auto end = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < end) {
      if (done()) return true;
      std::this_thread::sleep_for(200ms);
    }
    return done();
  }

 private:
  fs::path config() const { return dir_ / "slurm.conf"; }
  fs::path socket() const { return dir_ / "munge.sock"; }

  void write_config() const {
    const std::string host = short_hostname();
    const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
    const long memory_mb = pages * (page_size / 1024) / 1024 * 8 / 10;  // below what slurmd finds, or it drains
    const unsigned cpus = std::max(2u, std::thread::hardware_concurrency());
    const fs::path d = dir_;
    std::ofstream conf(config());
    conf << "ClusterName=sdtraintest\n"
         << "SlurmctldHost=" << host << "(127.0.0.1)\n"
         << "SlurmUser=root\nSlurmdUser=root\n"
         << "AuthType=auth/munge\nCredType=cred/munge\n"
         // A requeued job waits for its credential to expire before it runs again (default 120 s).
         << "AuthInfo=socket=" << socket().string() << ",cred_expire=10\n"
         << "SlurmctldPort=" << dist::find_free_port() << "\nSlurmdPort=" << dist::find_free_port() << "\n"
         << "StateSaveLocation=" << (d / "state").string() << "\nSlurmdSpoolDir=" << (d / "spool").string() << "\n"
         << "SlurmctldPidFile=" << (d / "slurmctld.pid").string() << "\n"
         << "SlurmdPidFile=" << (d / "slurmd.pid").string() << "\n"
         << "SlurmctldLogFile=" << (d / "log" / "slurmctld.log").string() << "\n"
         << "SlurmdLogFile=" << (d / "log" / "slurmd.log").string()
         << "\n"
         // No cgroups in containers: track processes by parentage, no task binding, no accounting.
         << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
         << "AccountingStorageType=accounting_storage/none\nMpiDefault=none\nSwitchType=switch/none\n"
         << "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nReturnToService=2\nKillWait=30\n"
         << "NodeName=" << host << " NodeAddr=127.0.0.1 CPUs=" << cpus << " RealMemory=" << memory_mb
         << " State=UNKNOWN\n"
         << "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
  }

  fs::path dir_;
  std::unique_ptr<test::Process> munged_, slurmctld_, slurmd_;
};

class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* program : {"munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel"})
      ASSERT_TRUE(test::have_program(program))
          << program << " is not installed (scripts/setup-deps installs slurmctld, slurmd, slurm-client and munge)";
    const std::string why = cluster_.start(dir_.path() / "slurm");
    if (!why.empty()) GTEST_SKIP() << "no Slurm cluster on this machine: " << why;

    auto r = test::run_process({test::sdtrain_binary(), "init", "--preset", "tiny", "--out", model().string()}, 60s);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    test::write_captioned_images(data(), 4);
    fs::create_directories(bin());
    fs::create_symlink(test::sdtrain_binary(), bin() / "sdtrain");  // the scripts run `srun sdtrain ...`
  }

  fs::path model() const { return dir_.path() / "model"; }
  fs::path data() const { return dir_.path() / "data"; }
  fs::path bin() const { return dir_.path() / "bin"; }

  // sbatch arguments for deploy/slurm/<script>.sbatch writing to `out`: one node, 2 tasks of one CPU (command-line
  // options win over the script's #SBATCH lines), the script's variables, and `extra` flags for sdtrain (they come
  // last, so they win over the script's production values).
  std::vector<std::string> sbatch(const std::string& script, const fs::path& out, const std::string& extra) const {
    const std::string exports = "--export=ALL,PATH=" + bin().string() + ":" + std::getenv("PATH") +
                                ",MODEL=" + model().string() + ",DATA=" + data().string() + ",OUT=" + out.string() +
                                ",EXTRA_ARGS=" + extra +
                                // Each job its own rendezvous port: tests run in parallel on this machine.
                                ",MASTER_PORT=" + std::to_string(dist::find_free_port()) +
                                (resolves(short_hostname()) ? "" : ",MASTER_ADDR=127.0.0.1");
    return {"sbatch",
            "--parsable",
            "--nodes=1",
            "--ntasks=2",
            "--ntasks-per-node=2",
            "--cpus-per-task=1",
            "--output=" + out.string() + ".log",
            exports,
            (deploy_dir() / "slurm" / (script + ".sbatch")).string()};
  }

  // Submits and waits for the job to end (sbatch --wait); the job's output on failure.
  void run_job(const std::string& script, const fs::path& out, const std::string& extra) {
    std::vector<std::string> argv = sbatch(script, out, extra);
    argv.insert(argv.begin() + 1, "--wait");
    auto r = cluster_.run(argv, 300s);
    ASSERT_EQ(r.exit_code, 0) << r.output << read_log(out);
  }

  static std::string read_log(const fs::path& out) {
    const fs::path log = out.string() + ".log";
    return fs::exists(log) ? io::read_text_file(log) : "";
  }

  test::TempDir dir_;
  SlurmCluster cluster_;
};

const std::string kSmall = "--resolution=32 --train_batch_size=1 --threads=1 --dist_timeout=60";

TEST_F(Slurm, BatchScriptsTrainTextualInversionAndShardedUNet) {
  run_job("textual-inversion", dir_.path() / "ti", kSmall + " --max_train_steps=2");
  EXPECT_TRUE(fs::exists(dir_.path() / "ti" / "learned_embeds.safetensors")) << read_log(dir_.path() / "ti");
  EXPECT_TRUE(fs::exists(dir_.path() / "ti" / "model_index.json"));

  run_job("unet-training", dir_.path() / "unet", kSmall + " --max_train_steps=2 --global_batch_size=2");
  EXPECT_TRUE(fs::exists(dir_.path() / "unet" / "unet" / "diffusion_pytorch_model.safetensors"))
      << read_log(dir_.path() / "unet");
  // Two tasks of the job are the two ranks, sharded.
  EXPECT_NE(read_log(dir_.path() / "unet").find("2 rank(s)"), std::string::npos) << read_log(dir_.path() / "unet");
}

TEST_F(Slurm, TermEndsInACheckpointAndTheRequeuedJobResumesToTheUninterruptedResult) {
  const std::string flags = kSmall + " --max_train_steps=60 --global_batch_size=2 --checkpointing_steps=5";
  const fs::path reference = dir_.path() / "reference", preempted = dir_.path() / "preempted";
  run_job("unet-training", reference, flags);

  auto submitted = cluster_.run(sbatch("unet-training", preempted, flags));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const std::string job = submitted.output.substr(0, submitted.output.find_first_of(";\n"));
  ASSERT_TRUE(SlurmCluster::wait_until([&] { return fs::exists(preempted / "checkpoint-10"); }, 240s))
      << read_log(preempted);
  // What Slurm sends before a preemption (the scripts' --signal=TERM@...): every rank stops after its step.
  ASSERT_EQ(cluster_.run({"scancel", "--signal=TERM", job}).exit_code, 0);
  ASSERT_TRUE(SlurmCluster::wait_until([&] { return cluster_.job_state(job) == "FAILED"; }, 120s))
      << cluster_.job_state(job) << "\n"
      << read_log(preempted);
  ASSERT_NE(read_log(preempted).find("resume with --resume_from_checkpoint latest"), std::string::npos)
      << read_log(preempted);
  ASSERT_FALSE(fs::exists(preempted / "unet")) << "the job finished before it was preempted";

  // The scripts' --requeue: the same job runs again and resumes from the newest checkpoint.
  ASSERT_EQ(cluster_.run({"scontrol", "requeue", job}).exit_code, 0);
  ASSERT_TRUE(SlurmCluster::wait_until([&] { return cluster_.job_state(job) == "COMPLETED"; }, 300s))
      << cluster_.job_state(job) << "\n"
      << read_log(preempted);
  EXPECT_NE(read_log(preempted).find("resuming from"), std::string::npos) << read_log(preempted);
  for (const char* file : {"unet/diffusion_pytorch_model.safetensors", "unet/config.json"})
    EXPECT_TRUE(io::read_text_file(preempted / file) == io::read_text_file(reference / file))
        << file << " differs from the uninterrupted job's";
}

}  // namespace
}  // namespace sd

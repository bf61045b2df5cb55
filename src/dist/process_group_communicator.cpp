// Communicator over a c10d process group (Gloo on CPU): rendezvous through a TCPStore hosted by rank 0, plus a
// heartbeat per rank in that store, so that when a collective fails or times out (Gloo's errors name sockets,
// not ranks) every rank can say which rank was lost, hung or never joined. The sharded optimizer's ring collectives
// are sdtrain's own, over Gloo's point-to-point messages or, between ranks of one machine, shared memory.
//
// Debian's libtorch is built with Gloo, but its headers only declare ProcessGroupGloo under USE_C10D_GLOO.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "dist/communicator.h"
#include "dist/shared_memory_ring.h"
#include "dist/store_listen.h"
#include "dist/threads.h"

namespace sd::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string seconds_text(milliseconds t) {
  double s = t.count() / 1000.0;
  return s == std::floor(s) ? fmt::format("{:.0f} s", s) : fmt::format("{:g} s", s);
}

// SDTRAIN_DIST_DEBUG=1: timestamped lines about rendezvous, failures and diagnosis on stderr.
bool debug_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("SDTRAIN_DIST_DEBUG");
    return v && *v && std::string(v) != "0";
  }();
  return enabled;
}

template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  if (!debug_enabled()) return;
  static const auto start = Clock::now();
  double t = std::chrono::duration<double>(Clock::now() - start).count();
  std::string line =
      fmt::format("[sdtrain dist {:.3f}s] ", t) + fmt::format(format, std::forward<Args>(args)...) + "\n";
  std::fputs(line.c_str(), stderr);
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// The first line of an exception's message, without c10's backtrace.
std::string first_line(const std::exception& e) {
  std::string msg;
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e))
    msg = c10e->what_without_backtrace();
  else
    msg = e.what();
  auto nl = msg.find('\n');
  if (nl != std::string::npos) msg.resize(nl);
  // Gloo prefixes its messages with the source location: "[../gloo/transport/tcp/pair.cc:598] Connection closed".
  if (!msg.empty() && msg[0] == '[') {
    auto close = msg.find("] ");
    if (close != std::string::npos) msg = msg.substr(close + 2);
  }
  return msg;
}

bool contains_any(const std::string& s, std::initializer_list<const char*> needles) {
  for (const char* n : needles)
    if (s.find(n) != std::string::npos) return true;
  return false;
}

bool looks_like_timeout(const std::string& cause) { return contains_any(cause, {"Timed out", "timed out", "Timeout"}); }
bool looks_like_closed(const std::string& cause) {
  return contains_any(cause, {"closed", "reset by peer", "Broken pipe", "EOF", "Connection refused"});
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// c10d logs a failed connection through glog before throwing, which would add lines (and glog's "Logging before
// InitGoogleLogging" banner) to the one-line error we print. Raise glog's threshold while connecting; the symbol
// is looked up at run time so no glog link dependency is added.
class QuietC10Logs {
 public:
  QuietC10Logs() : level_(static_cast<int32_t*>(dlsym(RTLD_DEFAULT, "_ZN3fLI17FLAGS_minloglevelE"))) {
    if (level_) {
      saved_ = *level_;
      *level_ = 3;  // FATAL only
    }
  }
  ~QuietC10Logs() {
    if (level_) *level_ = saved_;
  }

 private:
  int32_t* level_;
  int32_t saved_ = 0;
};

// Why `host` does not resolve ("Name or service not known"), or nullopt when it does.
std::optional<std::string> resolution_failure(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found) freeaddrinfo(found);
  if (status == 0) return std::nullopt;
  return std::string(gai_strerror(status));
}

// Whether something at host:port accepts a TCP connection within two seconds: when the store client failed, that
// tells "nothing listens there yet" from "another program holds MASTER_PORT".
bool accepts_connections(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) return false;
  bool accepted = false;
  for (addrinfo* ai = found; ai && !accepted; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const timeval limit{2, 0};  // Linux bounds a blocking connect by the send timeout
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    accepted = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(found);
  return accepted;
}

// The local address this machine uses to reach `host`: Gloo binds there unless told an interface, so ranks on
// other machines get an address they can route to (the default device would take whatever the hostname resolves
// to, often a loopback alias).
std::optional<std::string> local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) return std::nullopt;
  std::optional<std::string> result;
  for (addrinfo* ai = found; ai && !result; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    // Connecting a UDP socket sends nothing; it only picks the route and thus the source address.
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {};
      const void* addr = local.ss_family == AF_INET
                             ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, buf, sizeof buf)) result = std::string(buf);
    }
    close(fd);
  }
  freeaddrinfo(found);
  return result;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// The one place that names a backend. A CUDA build adds:
//   if (backend == "nccl") return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, nccl_options);
c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(
    const std::string& backend, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, milliseconds timeout,
    std::vector<std::shared_ptr<::gloo::transport::Device>> devices) {
  if (backend == "gloo") {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices = std::move(devices);
    // Two worker threads let one gradient bucket's allreduce run while the next is issued.
    options->threads = 2;
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  }
  fail("distributed backend '{}' is not available in this CPU build (available: gloo)", backend);
}

// Keys in the rendezvous store. Heartbeat values are "<beats> <collectives issued>".
std::string join_key(int r) { return "sdtrain/join/" + std::to_string(r); }
std::string heartbeat_key(int r) { return "sdtrain/hb/" + std::to_string(r); }
std::string exit_key(int r) { return "sdtrain/exit/" + std::to_string(r); }
std::string arm_key(int r, const char* client) { return fmt::format("sdtrain/arm/{}/{}", r, client); }
std::string machine_key(int r) { return "sdtrain/machine/" + std::to_string(r); }
std::string shm_opened_key(int r) { return "sdtrain/shm/opened/" + std::to_string(r); }
const char* const kShmNameKey = "sdtrain/shm/name";
const char* const kFaultKey = "sdtrain/fault";
const char* const kShutdownKey = "sdtrain/shutdown";
const char* const kJoinCountKey = "sdtrain/join_count";

// LibTorch 1.13's TCPStore client puts no deadline on its socket until its first wait() or get(): until then
// check(), add() and the rest wait forever on a master that is frozen (SIGSTOP, a stopped or swapped-out machine)
// rather than dead, since the master's kernel still accepts the connection. A wait on a key this client has just set
// returns at once and leaves the socket's send and receive deadlines at `deadline` for every later operation (Gloo's
// own waits re-arm it with theirs). After an operation timed out, the client is out of step with the server and must
// not be used again.
void arm_store_deadline(c10d::Store& store, const std::string& key, milliseconds deadline) {
  store.set(key, bytes("1"));
  store.wait({key}, deadline);
}

// What a failed store operation says about rank 0, which hosts the store.
std::string master_store_trouble(const std::string& cause, const std::string& addr, int port, milliseconds deadline) {
  if (looks_like_timeout(cause))
    return fmt::format(
        "rank 0 lost (the master store at {}:{} did not answer within {}: rank 0 frozen or its machine "
        "overloaded)",
        addr, port, seconds_text(deadline));
  return fmt::format("rank 0 lost (connection to the master store at {}:{} closed)", addr, port);
}

class ProcessGroupCommunicator;

class PendingWork : public PendingCollective {
 public:
  PendingWork(ProcessGroupCommunicator* comm, c10::intrusive_ptr<c10d::Work> work, int64_t seq, at::Tensor keep)
      : comm_(comm), work_(std::move(work)), seq_(seq), keep_(std::move(keep)) {}
  void wait() override;

 private:
  ProcessGroupCommunicator* comm_;
  c10::intrusive_ptr<c10d::Work> work_;
  int64_t seq_;
  at::Tensor keep_;  // the buffer must outlive the collective
  bool done_ = false;
};

// A ring collective runs on the communicator's ring thread; waiting on it rethrows its failure.
class PendingRing : public PendingCollective {
 public:
  explicit PendingRing(std::future<void> done) : done_(std::move(done)) {}
  void wait() override {
    if (done_.valid()) done_.get();
  }

 private:
  std::future<void> done_;
};

// How a ring message lands: copied into place, or added into it (the reduce-scatter's float32 sums).
enum class Arrival { copy, add };

// dst += src elementwise, on the calling thread: the ring thread must not start LibTorch's intra-op pool.
void add_into(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

class ProcessGroupCommunicator : public Communicator {
 public:
  ProcessGroupCommunicator(const DistEnv& env, const CommOptions& opts) : env_(env), opts_(opts) {
    interval_ = std::clamp(milliseconds(opts.timeout.count() / 20), milliseconds(200), milliseconds(1000));
    window_ = std::max(interval_ * 5, milliseconds(1000));
    debug("rank {}: connecting to the store at {}:{}", env_.rank, env_.master_addr, env_.master_port);
    connect_store();
    join();
    debug("rank {}: all {} ranks joined", env_.rank, env_.world_size);
    monitor_ = std::thread([this] { monitor_loop(); });
    try {
      create_process_group();
      connect_shared_memory();
      arm_main_store_deadline();
    } catch (...) {
      shutdown(true);
      throw;
    }
    debug("rank {}: process group ready (data plane on {})", env_.rank, address_);
  }

  ~ProcessGroupCommunicator() override { shutdown(std::uncaught_exceptions() > 0); }

  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }
  std::string backend_name() const override { return opts_.backend; }
  std::string ring_transport() const override { return shm_ ? "shared memory" : "tcp"; }

  void allreduce_sum(std::vector<at::Tensor>& tensors) override {
    // One collective per dtype over a flat buffer: c10d's list form means "one tensor per device".
    std::map<at::ScalarType, std::vector<size_t>> by_dtype;
    for (size_t i = 0; i < tensors.size(); ++i) by_dtype[tensors[i].scalar_type()].push_back(i);
    for (auto& [dtype, idx] : by_dtype) {
      if (idx.size() == 1 && tensors[idx[0]].is_contiguous()) {
        allreduce_sum_async(tensors[idx[0]])->wait();
        continue;
      }
      std::vector<at::Tensor> flat_parts;
      for (size_t i : idx) flat_parts.push_back(tensors[i].reshape({-1}));
      at::Tensor flat = at::cat(flat_parts);
      allreduce_sum_async(flat)->wait();
      int64_t offset = 0;
      for (size_t i : idx) {
        int64_t n = tensors[i].numel();
        tensors[i].copy_(flat.narrow(0, offset, n).view(tensors[i].sizes()));
        offset += n;
      }
    }
  }

  std::unique_ptr<PendingCollective> allreduce_sum_async(at::Tensor tensor) override {
    SD_CHECK(tensor.is_contiguous(), "allreduce_sum_async needs a contiguous tensor");
    int64_t seq = begin_collective("allreduce");
    // Between ranks of one machine float32 sums (the gradients) take the shared-memory ring: a reduce-scatter and
    // an all-gather, the bytes of Gloo's ring allreduce without its socket copies.
    if (shm_ && tensor.scalar_type() == at::kFloat) {
      const at::Tensor flat = tensor.view({-1});
      return run_on_ring_thread([this, flat, seq] {
        ring_reduce_scatter(flat, seq);
        ring_all_gather(flat, seq);
      });
    }
    std::vector<at::Tensor> list{tensor};
    auto work = issue(seq, [&] { return pg_->allreduce(list); });
    return std::make_unique<PendingWork>(this, std::move(work), seq, tensor);
  }

  std::unique_ptr<PendingCollective> reduce_scatter_sum_async(at::Tensor flat) override {
    check_ring_buffer(flat, "reduce_scatter_sum_async");
    SD_CHECK(flat.scalar_type() == at::kFloat, "reduce_scatter_sum_async sums float32 tensors only");
    const int64_t seq = begin_collective("reduce_scatter");
    return run_on_ring_thread([this, flat, seq] { ring_reduce_scatter(flat, seq); });
  }

  std::unique_ptr<PendingCollective> all_gather_async(at::Tensor flat) override {
    check_ring_buffer(flat, "all_gather_async");
    const int64_t seq = begin_collective("all_gather");
    return run_on_ring_thread([this, flat, seq] { ring_all_gather(flat, seq); });
  }

  void broadcast(at::Tensor& tensor, int root) override {
    SD_CHECK(root >= 0 && root < env_.world_size, "broadcast root {} is outside 0..{}", root, env_.world_size - 1);
    at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
    std::vector<at::Tensor> list{buffer};
    int64_t seq = begin_collective("broadcast");
    c10d::BroadcastOptions o;
    o.rootRank = root;
    wait_work(issue(seq, [&] { return pg_->broadcast(list, o); }), seq);
    if (!buffer.is_same(tensor)) tensor.copy_(buffer);
  }

  void barrier() override {
    int64_t seq = begin_collective("barrier");
    wait_work(issue(seq, [&] { return pg_->barrier(); }), seq);
  }

  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override {
    auto n = static_cast<int64_t>(values.size());
    at::Tensor input = at::empty({n}, at::kLong);
    std::copy(values.begin(), values.end(), input.data_ptr<int64_t>());
    std::vector<at::Tensor> inputs{input};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < env_.world_size; ++r) outputs[0].push_back(at::empty({n}, at::kLong));
    int64_t seq = begin_collective("all_gather");
    wait_work(issue(seq, [&] { return pg_->allgather(outputs, inputs); }), seq);
    std::vector<int64_t> result;
    for (auto& t : outputs[0]) result.insert(result.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
    return result;
  }

  // Waits for one collective; on failure or timeout finds out which rank is at fault and throws.
  void wait_work(const c10::intrusive_ptr<c10d::Work>& work, int64_t seq) {
    const auto start = Clock::now();
    try {
      // Gloo enforces opts_.timeout itself; the extra margin only guards against a wait that never returns.
      work->wait(opts_.timeout + window_);
    } catch (const std::exception& e) {
      std::string cause = first_line(e);
      debug("rank {}: {} failed: {}", env_.rank, op_name(seq), cause);
      // Gloo closes its connections when its own timeout fires, so a closure that ends a wait of about the whole
      // timeout is most likely another waiting rank giving up at the same moment, not a peer that died.
      const bool waited_out = Clock::now() - start >= opts_.timeout / 2;
      fail_collective(seq, cause, looks_like_timeout(cause) || cause.find("Operation timed out") != std::string::npos,
                      looks_like_closed(cause) && !waited_out);
    }
  }

 private:
  int64_t begin_collective(const char* op) {
    std::unique_lock<std::mutex> lock(ops_mutex_);
    // After a failure every further collective reports the same first diagnosis, waiting for it while another
    // thread (the ring thread, say) is still diagnosing (which takes at most the heartbeat window and a few reads).
    if (failed_) {
      failure_cv_.wait_for(lock, window_ * 2 + std::chrono::seconds(10), [this] { return !failure_.empty(); });
      throw Error(failure_.empty() ? "the process group failed earlier" : failure_);
    }
    int64_t seq = ++issued_;
    // Only the names of collectives that may still be waited on are needed; a small ring keeps memory flat.
    op_names_[seq % op_names_.size()] = op;
    return seq;
  }

  std::string op_name(int64_t seq) {
    std::lock_guard<std::mutex> lock(ops_mutex_);
    const char* name =
        issued_ - seq < static_cast<int64_t>(op_names_.size()) ? op_names_[seq % op_names_.size()] : nullptr;
    return fmt::format("{} #{}", name ? name : "collective", seq);
  }

  template <typename F>
  c10::intrusive_ptr<c10d::Work> issue(int64_t seq, F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      fail_collective(seq, first_line(e), false, looks_like_closed(first_line(e)));
    }
  }

  [[noreturn]] void fail_collective(int64_t seq, const std::string& cause, bool timed_out, bool peer_closed) {
    std::string message = diagnose(op_name(seq), seq, cause, timed_out, peer_closed);
    debug("rank {}: diagnosis: {}", env_.rank, message);
    {
      std::lock_guard<std::mutex> lock(ops_mutex_);
      if (failure_.empty()) failure_ = message;
    }
    failure_cv_.notify_all();
    throw Error(message);
  }

  void check_ring_buffer(const at::Tensor& flat, const char* what) const {
    SD_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.numel() % env_.world_size == 0,
             "{} needs a contiguous 1-D tensor whose size is a multiple of the world size ({}), got {} elements", what,
             env_.world_size, flat.numel());
  }

  // Ring collectives run one at a time, in the order they were issued (the same on every rank), on a thread of
  // their own, so backward can go on while a bucket travels.
  std::unique_ptr<PendingCollective> run_on_ring_thread(std::function<void()> job) {
    auto task = std::make_shared<std::packaged_task<void()>>(std::move(job));
    std::future<void> done = task->get_future();
    {
      std::lock_guard<std::mutex> lock(ring_mutex_);
      if (!ring_thread_.joinable()) ring_thread_ = std::thread([this] { ring_loop(); });
      ring_jobs_.push_back([task] { (*task)(); });
    }
    ring_cv_.notify_one();
    return std::make_unique<PendingRing>(std::move(done));
  }

  void ring_loop() {
    std::unique_lock<std::mutex> lock(ring_mutex_);
    while (true) {
      ring_cv_.wait(lock, [this] { return stop_ring_ || !ring_jobs_.empty(); });
      if (ring_jobs_.empty()) return;
      std::function<void()> job = std::move(ring_jobs_.front());
      ring_jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

  // After a failure queued ring jobs are dropped and a job stuck in a broken exchange is left to process exit,
  // as Gloo's own threads are.
  void stop_ring_thread() {
    {
      std::lock_guard<std::mutex> lock(ring_mutex_);
      stop_ring_ = true;
      if (failed_) ring_jobs_.clear();
    }
    ring_cv_.notify_all();
    if (!ring_thread_.joinable()) return;
    if (failed_)
      ring_thread_.detach();
    else
      ring_thread_.join();
  }

  // Sends `out` to the next rank and lands the previous rank's message in `in` (the chunk that rank sends).
  void ring_exchange(const at::Tensor& out, const at::Tensor& in, Arrival arrival, int64_t seq) {
    if (shm_) return shared_memory_exchange(out, in, arrival, seq);
    at::Tensor landing = arrival == Arrival::copy ? in : at::empty_like(in);
    tcp_exchange(out, landing, seq);
    if (arrival == Arrival::add) add_into(in.data_ptr<float>(), landing.data_ptr<float>(), in.numel());
  }

  // The sum is taken straight from the previous rank's mailbox, piece by piece, without a landing copy.
  void shared_memory_exchange(const at::Tensor& out, const at::Tensor& in, Arrival arrival, int64_t seq) {
    auto* destination = static_cast<unsigned char*>(in.data_ptr());
    auto land = [&](const void* piece, size_t offset, size_t bytes) {
      if (arrival == Arrival::copy)
        std::memcpy(destination + offset, piece, bytes);
      else
        add_into(reinterpret_cast<float*>(destination + offset), static_cast<const float*>(piece),
                 static_cast<int64_t>(bytes / sizeof(float)));
    };
    try {
      shm_->exchange(out.data_ptr(), out.nbytes(), in.nbytes(), land, opts_.timeout);
    } catch (const std::exception& e) {
      const std::string cause = first_line(e);
      fail_collective(seq, cause, looks_like_timeout(cause), looks_like_closed(cause));
    }
  }

  // Over Gloo's TCP transport: both the send and the receive must finish.
  void tcp_exchange(const at::Tensor& out, const at::Tensor& in, int64_t seq) {
    const int world = env_.world_size;
    const int next = (env_.rank + 1) % world, prev = (env_.rank + world - 1) % world;
    std::vector<at::Tensor> send_list{out}, recv_list{in};
    const int tag = static_cast<int>(seq & 0x3fffffff);
    auto sent = issue(seq, [&] { return pg_->send(send_list, next, tag); });
    auto received = issue(seq, [&] { return pg_->recv(recv_list, prev, tag); });
    wait_work(received, seq);
    wait_work(sent, seq);
  }

  // Chunk c (modulo the world) of a flat tensor: world near-equal parts, equal when the size is a multiple of it.
  at::Tensor ring_chunk(const at::Tensor& flat, int c) const {
    const int world = env_.world_size;
    c = (c % world + world) % world;
    const int64_t begin = flat.numel() * c / world, end = flat.numel() * (c + 1) / world;
    return flat.narrow(0, begin, end - begin);
  }

  // Chunk c starts at rank c+1 and travels the ring, each rank adding its own chunk c, until it reaches rank c
  // after world-1 hops: at step s rank r sends chunk r-1-s and receives (and adds into) chunk r-2-s.
  void ring_reduce_scatter(const at::Tensor& flat, int64_t seq) {
    const int r = env_.rank;
    for (int s = 0; s + 1 < env_.world_size; ++s)
      ring_exchange(ring_chunk(flat, r - 1 - s), ring_chunk(flat, r - 2 - s), Arrival::add, seq);
  }

  // Chunk r starts at rank r; at step s rank r forwards chunk r-s and receives chunk r-1-s in place.
  void ring_all_gather(const at::Tensor& flat, int64_t seq) {
    const int r = env_.rank;
    for (int s = 0; s + 1 < env_.world_size; ++s)
      ring_exchange(ring_chunk(flat, r - s), ring_chunk(flat, r - 1 - s), Arrival::copy, seq);
  }

  void connect_store() {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(env_.master_port);
    o.isServer = env_.rank == 0;
    o.numWorkers = env_.world_size;
    o.waitWorkers = false;  // joining is done below, so a missing rank can be named
    o.timeout = opts_.timeout;
    const auto started = Clock::now();
    try {
      QuietC10Logs quiet;
      auto narrowing = env_.rank == 0 ? narrow_store_listening() : nullptr;
      store_ = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, o);
      if (narrowing && !narrowing->narrowed())
        log::warn("the rendezvous store could not be bound to {} and listens on every interface of rank 0's machine",
                  env_.master_addr);
      arm_store_deadline(*store_, arm_key(env_.rank, "main"), opts_.timeout);
    } catch (const std::exception& e) {
      explain_store_failure(first_line(e), Clock::now() - started >= opts_.timeout / 2);
    }
  }

  // Why the store could not be hosted or reached, in the user's terms rather than LibTorch's.
  [[noreturn]] void explain_store_failure(const std::string& cause, bool waited_out) {
    // LibTorch's own message for a name that does not resolve is a socket timeout, however fast it failed.
    if (const auto unresolved = resolution_failure(env_.master_addr))
      fail("rank {} could not {}: MASTER_ADDR={} does not resolve on this machine ({})", env_.rank,
           env_.rank == 0 ? "host the rendezvous store" : "reach the master", env_.master_addr, *unresolved);
    if (env_.rank == 0)
      fail(
          "rank 0 could not host the rendezvous store on {}:{}: {} (another job on MASTER_PORT? set MASTER_PORT "
          "to a free port)",
          env_.master_addr, env_.master_port, cause);
    if (accepts_connections(env_.master_addr, env_.master_port))
      fail(
          "rank {}: the program listening on {}:{} is not sdtrain's rendezvous store ({}): another program holds "
          "MASTER_PORT on the master; choose a free port for every rank",
          env_.rank, env_.master_addr, env_.master_port,
          waited_out ? "it did not answer as one within " + seconds_text(opts_.timeout)
                     : "it answered as something else: " + cause);
    fail(
        "rank {} could not reach the master at {}:{}{}: check MASTER_ADDR/MASTER_PORT, that rank 0 is running and "
        "that this machine can reach it ({})",
        env_.rank, env_.master_addr, env_.master_port,
        waited_out ? " within " + seconds_text(opts_.timeout) : std::string(), cause);
  }

  // From here on the store is read only to diagnose and to say goodbye: a master that does not answer within the
  // heartbeat window counts as lost, so no reading of it can outlast --dist_timeout by more than that.
  void arm_main_store_deadline() {
    try {
      arm_store_deadline(*store_, arm_key(env_.rank, "main"), window_);
    } catch (const std::exception& e) {
      fail("{} while the ranks were connecting [seen by rank {}]",
           master_store_trouble(first_line(e), env_.master_addr, env_.master_port, window_), env_.rank);
    }
  }

  // The store listens only where the ranks connect (loopback on one machine), else everywhere with a warning.
  std::unique_ptr<StoreBindNarrowing> narrow_store_listening() {
    std::string why;
    auto address = store_listen_address(env_, local_interface_addresses(), &why);
    if (!address) {
      log::warn("the rendezvous store listens on every interface of rank 0's machine, unauthenticated: {}", why);
      return nullptr;
    }
    debug("rank 0: the store listens on {} port {}", *address, env_.master_port);
    return std::make_unique<StoreBindNarrowing>(*address, env_.master_port);
  }

  void join() {
    try {
      join_store();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(
          "rank {} lost the connection to the master store at {}:{} while the ranks were joining (did rank 0 exit? "
          "see its message): {}",
          env_.rank, env_.master_addr, env_.master_port, first_line(e));
    }
  }

  void join_store() {
    const std::string info = fmt::format("{} {} {}", env_.world_size, hostname(), getpid());
    int64_t count = store_->add(kJoinCountKey, 1);
    store_->set(join_key(env_.rank), bytes(info));
    SD_CHECK(count <= env_.world_size,
             "more than {} processes joined the rendezvous at {}:{}: two processes claim the same rank, or a "
             "previous job still uses MASTER_PORT",
             env_.world_size, env_.master_addr, env_.master_port);
    auto deadline = Clock::now() + opts_.timeout;
    std::vector<int> missing;
    for (int r = 0; r < env_.world_size; ++r) missing.push_back(r);
    while (true) {
      std::vector<int> still;
      for (int r : missing) {
        if (!store_->check({join_key(r)})) {
          still.push_back(r);
          continue;
        }
        std::string other = text(store_->get(join_key(r)));
        int other_world = std::atoi(other.c_str());
        SD_CHECK(other_world == env_.world_size,
                 "rank {} was started with world size {} but rank {} with {}: every rank must see the same world "
                 "size",
                 r, other_world, env_.rank, env_.world_size);
      }
      missing = std::move(still);
      if (missing.empty()) return;
      if (Clock::now() > deadline)
        fail(
            "{} did not join within {}: check that {} started with MASTER_ADDR={} MASTER_PORT={} and world size {}, "
            "and can reach that address (firewall, --dist_iface)",
            rank_list(missing), seconds_text(opts_.timeout), missing.size() == 1 ? "it was" : "they were",
            env_.master_addr, env_.master_port, env_.world_size);
      std::this_thread::sleep_for(milliseconds(50));
    }
  }

  void create_process_group() {
    std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
    std::string ifaces = opts_.iface;
    const char* env_iface = std::getenv("GLOO_SOCKET_IFNAME");
    if (ifaces.empty() && env_iface) ifaces = env_iface;
    if (!ifaces.empty()) {
      for (const auto& name : split_commas(ifaces)) {
        try {
          devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
        } catch (const std::exception& e) {
          fail("rank {}: network interface '{}' (--dist_iface / GLOO_SOCKET_IFNAME) is unusable: {}", env_.rank, name,
               first_line(e));
        }
      }
      address_ = ifaces;
    } else if (auto addr = local_address_towards(env_.master_addr, env_.master_port)) {
      devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(*addr));
      address_ = *addr;
    } else {
      devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      address_ = "default";
    }
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("sdtrain/pg", store_);
    int64_t seq = begin_collective("connection setup");
    try {
      pg_ = make_process_group(opts_.backend, prefixed, env_.rank, env_.world_size, opts_.timeout, std::move(devices));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      std::string cause = first_line(e);
      std::string diagnosis = diagnose(op_name(seq), seq, cause, looks_like_timeout(cause), looks_like_closed(cause));
      fail("{} (rank {}'s data-plane address: {}; choose the interface with --dist_iface or GLOO_SOCKET_IFNAME)",
           diagnosis, env_.rank, address_);
    }
  }

  // Ranks that all run on one machine send the ring collectives' messages through shared memory (see
  // shared_memory_ring.h). Every rank learns whether every rank could map the segment, so all use one transport.
  void connect_shared_memory() {
    const int world = env_.world_size;
    std::string why;
    std::unique_ptr<SharedMemoryRing> ring;
    bool all_opened = true;
    try {
      // A rank told --dist_transport tcp still says where it is, as a place no other rank shares: the others then
      // fall back to TCP with it instead of waiting for it until the timeout.
      const bool tcp = opts_.transport == "tcp";
      const std::string here = tcp ? fmt::format("tcp (rank {})", env_.rank) : machine_identity(env_.rank);
      store_->set(machine_key(env_.rank), bytes(here));
      if (tcp) return;
      for (int r = 0; r < world; ++r)
        if (text(store_->get(machine_key(r))) != here) {
          debug("rank {}: rank {} runs on another machine or asked for TCP: ring collectives over TCP", env_.rank, r);
          return;
        }
      if (env_.rank == 0) {
        ring = SharedMemoryRing::create(world, &why);
        store_->set(kShmNameKey, bytes(ring ? ring->name() : ""));
      } else {
        const std::string name = text(store_->get(kShmNameKey));
        if (name.empty())
          why = "rank 0 could not create it";
        else
          ring = SharedMemoryRing::open(name, env_.rank, world, &why);
      }
      store_->set(shm_opened_key(env_.rank), bytes(ring ? "1" : "0"));
      for (int r = 0; r < world; ++r) all_opened = all_opened && text(store_->get(shm_opened_key(r))) == "1";
    } catch (const std::exception& e) {
      fail("rank {} lost the master store at {}:{} while the ranks were connecting: {}", env_.rank, env_.master_addr,
           env_.master_port, first_line(e));
    }
    if (!ring) log::warn("rank {}: ring collectives over TCP: shared memory unusable: {}", env_.rank, why);
    if (ring) ring->unlink_name();  // every rank has opened it or given up
    if (all_opened) shm_ = std::move(ring);
    debug("rank {}: ring collectives over {}", env_.rank, ring_transport());
  }

  // Heartbeat into the store; watchdog that ends this process when another rank reported a fault (or the master
  // vanished) and this rank's main thread has not noticed within the timeout, e.g. because it is stuck outside any
  // collective. Without it such a rank would hang forever under launchers that do not kill the rest.
  void monitor_loop() {
    c10::intrusive_ptr<c10d::TCPStore> client;
    std::optional<Clock::time_point> trouble_since;
    std::string trouble;
    bool store_trouble = false;  // the master store not answering: over when it answers again
    bool master_done = false;
    int64_t beats = 0;
    std::unique_lock<std::mutex> lock(monitor_mutex_);
    while (!stop_monitor_) {
      lock.unlock();
      try {
        if (!client) client = connect_monitor_client();
        client->set(heartbeat_key(env_.rank), bytes(fmt::format("{} {}", ++beats, issued_.load())));
        const bool fault = client->check({kFaultKey});
        if (store_trouble) trouble_since.reset();
        store_trouble = false;
        if (!trouble_since && fault) {
          trouble_since = Clock::now();
          trouble = text(client->get(kFaultKey));
        }
        if (!master_done && client->check({kShutdownKey})) master_done = true;
      } catch (const std::exception& e) {
        const std::string cause = first_line(e);
        // A client whose operation timed out is out of step with the server: reconnect to see whether the master
        // answers again. A closed connection means rank 0 is gone; reconnecting would only add c10d's log lines.
        if (looks_like_timeout(cause)) client.reset();
        if (!trouble_since && !master_done) {
          trouble_since = Clock::now();
          store_trouble = true;
          trouble = master_store_trouble(cause, env_.master_addr, env_.master_port, window_);
        }
      }
      if (trouble_since && !failed_ && Clock::now() - *trouble_since > opts_.timeout + 2 * window_) {
        std::fprintf(stderr, "%serror: %s; rank %d made no progress within %s after that and exits\n",
                     log::rank_prefix().c_str(), trouble.c_str(), env_.rank, seconds_text(opts_.timeout).c_str());
        std::fflush(stderr);
        _exit(1);
      }
      lock.lock();
      monitor_cv_.wait_for(lock, interval_, [this] { return stop_monitor_; });
    }
  }

  // The heartbeat's own connection: connecting and every operation end within the heartbeat window, so the
  // watchdog (and shutdown, which joins it) never waits on a frozen master for longer.
  c10::intrusive_ptr<c10d::TCPStore> connect_monitor_client() {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(env_.master_port);
    o.waitWorkers = false;
    o.timeout = window_;
    auto client = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, o);
    arm_store_deadline(*client, arm_key(env_.rank, "monitor"), window_);
    return client;
  }

  // Which rank is to blame for a failed collective: ranks that announced their exit, ranks whose heartbeat
  // stopped (dead or frozen), ranks alive but behind in collectives (stuck elsewhere). The first rank to finish
  // this publishes its conclusion, and every rank reports that same line. `peer_closed`: the cause is a connection
  // a peer closed (so a silent rank died rather than froze).
  std::string diagnose(const std::string& op, int64_t seq, const std::string& cause, bool timed_out, bool peer_closed) {
    failed_ = true;
    const int world = env_.world_size;
    std::vector<std::string> first_hb(world), last_hb(world), exits(world);
    std::vector<int64_t> issued(world, -1);
    auto read_all = [&](bool first) {
      for (int r = 0; r < world; ++r) {
        if (r == env_.rank) continue;
        std::string hb = store_->check({heartbeat_key(r)}) ? text(store_->get(heartbeat_key(r))) : "";
        (first ? first_hb : last_hb)[r] = hb;
        auto space = hb.find(' ');
        if (space != std::string::npos) issued[r] = std::atoll(hb.c_str() + space + 1);
        if (store_->check({exit_key(r)})) exits[r] = text(store_->get(exit_key(r)));
      }
    };
    auto published_fault = [&]() -> std::optional<std::string> {
      if (store_->check({kFaultKey})) return text(store_->get(kFaultKey));
      return std::nullopt;
    };
    std::string message;
    debug("rank {}: diagnosing {} ({})", env_.rank, op, cause);
    try {
      read_all(true);
      if (auto f = published_fault()) return *f;
      auto announced_error = [&] {
        return std::any_of(exits.begin(), exits.end(),
                           [](const std::string& e) { return !e.empty() && e != "finished"; });
      };
      // A stopped heartbeat only shows over time; a rank that announced its failing exit needs no wait.
      auto deadline = Clock::now() + window_;
      while (Clock::now() < deadline && !announced_error()) {
        std::this_thread::sleep_for(interval_ / 2);
        if (auto f = published_fault()) return *f;
        for (int r = 0; r < world; ++r)
          if (r != env_.rank && exits[r].empty() && store_->check({exit_key(r)}))
            exits[r] = text(store_->get(exit_key(r)));
      }
      // Whoever concluded first also announced its exit only after publishing: prefer its conclusion.
      if (auto f = published_fault()) return *f;
      read_all(false);
      std::vector<int> exited_ok, exited_err, silent, behind;
      for (int r = 0; r < world; ++r) {
        if (r == env_.rank) continue;
        if (!exits[r].empty())
          (exits[r] == "finished" ? exited_ok : exited_err).push_back(r);
        else if (first_hb[r] == last_hb[r])
          silent.push_back(r);
        else if (issued[r] >= 0 && issued[r] < seq)
          behind.push_back(r);
      }
      if (!exited_err.empty()) {
        message = fmt::format("{} exited with an error during {} (see {} own message)", rank_list(exited_err), op,
                              exited_err.size() == 1 ? "its" : "their");
      } else if (!silent.empty()) {
        std::string how = peer_closed ? "connection closed" : fmt::format("no heartbeat for {}", seconds_text(window_));
        message = fmt::format("{} lost ({}) during {}", rank_list(silent), how, op);
      } else if (!exited_ok.empty()) {
        message = fmt::format(
            "{} already finished and exited before {}: the ranks ran different numbers of "
            "collectives",
            rank_list(exited_ok), op);
      } else if (!behind.empty()) {
        // Ranks waiting for a stuck rank fall behind too (a broadcast root waits for its receivers): blame the
        // rank(s) furthest behind, at the collective they never reached.
        int64_t least = issued[behind.front()];
        for (int r : behind) least = std::min(least, issued[r]);
        std::vector<int> stuck;
        for (int r : behind)
          if (issued[r] == least) stuck.push_back(r);
        message = fmt::format(
            "{} did not reach {} within {} (alive but not calling it: stuck, or running a different "
            "sequence of collectives)",
            rank_list(stuck), op_name(least + 1), seconds_text(opts_.timeout));
      } else {
        message =
            fmt::format("{} failed on rank {} and no other rank looks lost or late: {}{}", op, env_.rank, cause,
                        timed_out ? " (data-plane network blocked? check --dist_iface / GLOO_SOCKET_IFNAME)" : "");
      }
      message += fmt::format(" [seen by rank {}]", env_.rank);
      // The first conclusion wins, so that all ranks print the same line.
      return text(store_->compareSet(kFaultKey, {}, bytes(message)));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      if (env_.rank != 0)
        return fmt::format("{} during {} [seen by rank {}]",
                           master_store_trouble(first_line(e), env_.master_addr, env_.master_port, window_), op,
                           env_.rank);
      return fmt::format("{} failed on rank 0: {} (and the store failed too: {})", op, cause, first_line(e));
    }
  }

  void shutdown(bool with_error) {
    if (shut_down_) return;
    shut_down_ = true;
    stop_ring_thread();
    bool error = with_error || failed_;
    try {
      store_->set(exit_key(env_.rank), bytes(error ? "exited with an error" : "finished"));
    } catch (...) {
    }
    {
      std::lock_guard<std::mutex> lock(monitor_mutex_);
      stop_monitor_ = true;
    }
    monitor_cv_.notify_all();
    if (monitor_.joinable()) monitor_.join();
    if (failed_) {
      // Gloo's destructor joins worker threads that may still sit in a broken collective, and the ring thread,
      // left behind, may still read the shared memory: let process exit reclaim them instead of hanging here.
      (void)pg_.release();
      (void)shm_.release();
    } else {
      pg_.reset();
    }
    if (env_.rank == 0) {
      // Keep the store up until every rank said goodbye, so late ranks can still diagnose and see a clean end.
      // Ranks that died without a goodbye are recognised by a heartbeat that stopped changing.
      try {
        store_->set(kShutdownKey, bytes("1"));
        auto deadline = Clock::now() + (error ? window_ * 2 : opts_.timeout);
        std::vector<std::string> last_hb(env_.world_size);
        std::vector<Clock::time_point> changed(env_.world_size, Clock::now());
        while (Clock::now() < deadline) {
          bool waiting = false;
          for (int r = 1; r < env_.world_size; ++r) {
            if (store_->check({exit_key(r)})) continue;
            std::string hb = store_->check({heartbeat_key(r)}) ? text(store_->get(heartbeat_key(r))) : "";
            if (hb != last_hb[r]) {
              last_hb[r] = hb;
              changed[r] = Clock::now();
            }
            if (Clock::now() - changed[r] < 3 * interval_) waiting = true;
          }
          if (!waiting) break;
          std::this_thread::sleep_for(milliseconds(20));
        }
      } catch (...) {
      }
    }
    if (failed_) (void)store_.release();
  }

  friend class PendingWork;

  DistEnv env_;
  CommOptions opts_;
  milliseconds interval_{1000}, window_{5000};
  std::string address_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::unique_ptr<SharedMemoryRing> shm_;  // ring messages when every rank is on this machine
  std::mutex ops_mutex_;
  std::array<const char*, 4096> op_names_{};
  std::atomic<int64_t> issued_{0};
  std::atomic<bool> failed_{false};
  std::string failure_;                 // the first diagnosis, guarded by ops_mutex_
  std::condition_variable failure_cv_;  // signalled when failure_ is set
  bool shut_down_ = false;
  std::thread monitor_;
  std::mutex monitor_mutex_;
  std::condition_variable monitor_cv_;
  bool stop_monitor_ = false;
  std::thread ring_thread_;
  std::mutex ring_mutex_;
  std::condition_variable ring_cv_;
  std::deque<std::function<void()>> ring_jobs_;
  bool stop_ring_ = false;
};

void PendingWork::wait() {
  if (done_) return;
  done_ = true;
  comm_->wait_work(work_, seq_);
}

}  // namespace

std::shared_ptr<Communicator> make_communicator(const DistEnv& env, const CommOptions& opts) {
  if (env.world_size == 1) return std::make_shared<LocalCommunicator>();
  auto comm = std::make_shared<ProcessGroupCommunicator>(env, opts);
  // The ranks have met: from here on this process's own lines name its rank (core/log.h), whichever command runs.
  log::set_rank(comm->rank(), comm->world_size());
  return comm;
}

}  // namespace sd::dist

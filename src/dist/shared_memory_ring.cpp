#include "dist/shared_memory_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "core/error.h"

namespace sd::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMagic = 0x7364747261696e31;  // "sdtrain1"
constexpr size_t kHeaderBytes = 4096;
constexpr int kMaxWorld = 256;

struct Header {
  uint64_t magic;
  int32_t world;
  uint32_t piece_bytes;
  std::atomic<int32_t> pids[kMaxWorld];  // each rank's process, to tell a dead peer from a slow one
};
static_assert(sizeof(Header) <= kHeaderBytes);

// Counters are compared modulo 2^32, so that they may wrap in a very long run.
bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

void futex_wait(const uint32_t* word, uint32_t seen, std::chrono::milliseconds at_most) {
  timespec ts{at_most.count() / 1000, (at_most.count() % 1000) * 1000000};
  syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0); }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

bool process_gone(pid_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

std::string random_name() {
  std::random_device device;
  return fmt::format("/sdtrain-{}-{:08x}{:08x}", getpid(), device(), device());
}

// Maps the whole segment of `fd`; nullptr (and `why`) on failure. The descriptor is closed either way.
void* map_segment(int fd, size_t size, std::string* why) {
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (base != MAP_FAILED) return base;
  *why = fmt::format("mmap: {}", std::strerror(error));
  return nullptr;
}

}  // namespace

struct SharedMemoryRing::Mailbox {
  alignas(64) std::atomic<uint32_t> posted;  // the last message written here (by the mailbox's rank)
  alignas(64) std::atomic<uint32_t> taken;   // the last message read from here (by the next rank)
  alignas(64) unsigned char data[kPieceBytes];
};

size_t SharedMemoryRing::segment_bytes(int world) { return kHeaderBytes + sizeof(Mailbox) * 2 * world; }

SharedMemoryRing::SharedMemoryRing(std::string name, int rank, int world, void* base, size_t size)
    : name_(std::move(name)), rank_(rank), world_(world), base_(base), size_(size) {
  static_cast<Header*>(base_)->pids[rank_].store(getpid());
}

SharedMemoryRing::~SharedMemoryRing() {
  if (rank_ == 0) unlink_name();
  munmap(base_, size_);
}

std::unique_ptr<SharedMemoryRing> SharedMemoryRing::create(int world, std::string* why) {
  SD_CHECK(world >= 2 && world <= kMaxWorld, "a shared-memory ring needs 2..{} ranks, got {}", kMaxWorld, world);
  const std::string name = random_name();
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    *why = fmt::format("shm_open {}: {}", name, std::strerror(errno));
    return nullptr;
  }
  // Reserve every page now: a tmpfs too small for the segment (a container's 64 MiB /dev/shm) fails here instead
  // of killing the process with SIGBUS at the first write past its end.
  const size_t size = segment_bytes(world);
  if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(size))) {
    *why = fmt::format("reserving {} MiB in /dev/shm: {}", size >> 20, std::strerror(error));
    close(fd);
    shm_unlink(name.c_str());
    return nullptr;
  }
  void* base = map_segment(fd, size, why);
  if (!base) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  auto* header = static_cast<Header*>(base);
  header->world = world;
  header->piece_bytes = kPieceBytes;
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return std::unique_ptr<SharedMemoryRing>(new SharedMemoryRing(name, 0, world, base, size));
}

std::unique_ptr<SharedMemoryRing> SharedMemoryRing::open(const std::string& name, int rank, int world,
                                                         std::string* why) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    *why = fmt::format("shm_open {}: {}", name, std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  const size_t size = segment_bytes(world);
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != size) {
    *why = fmt::format("{} holds {} bytes, expected {}", name, static_cast<long long>(st.st_size), size);
    close(fd);
    return nullptr;
  }
  void* base = map_segment(fd, size, why);
  if (!base) return nullptr;
  const auto* header = static_cast<const Header*>(base);
  if (header->magic != kMagic || header->world != world || header->piece_bytes != kPieceBytes) {
    *why = fmt::format("{} is not a segment of this job (another sdtrain version?)", name);
    munmap(base, size);
    return nullptr;
  }
  return std::unique_ptr<SharedMemoryRing>(new SharedMemoryRing(name, rank, world, base, size));
}

void SharedMemoryRing::unlink_name() {
  if (unlinked_) return;
  unlinked_ = true;
  shm_unlink(name_.c_str());
}

SharedMemoryRing::Mailbox& SharedMemoryRing::mailbox(int rank, int slot) {
  auto* first = reinterpret_cast<Mailbox*>(static_cast<unsigned char*>(base_) + kHeaderBytes);
  return first[2 * rank + slot];
}

// Spins briefly (the peer is usually a few microseconds away), then sleeps on the futex in short naps that check
// the deadline and whether the peer's process still exists.
void SharedMemoryRing::wait_for(const uint32_t* word, uint32_t target, int peer, Clock::time_point deadline) {
  auto load = [&] { return reinterpret_cast<const std::atomic<uint32_t>*>(word)->load(std::memory_order_acquire); };
  for (int i = 0; i < 4000; ++i) {
    if (reached(load(), target)) return;
    cpu_relax();
  }
  const pid_t pid = static_cast<Header*>(base_)->pids[peer].load();
  while (true) {
    const uint32_t seen = load();
    if (reached(seen, target)) return;
    if (process_gone(pid)) fail("connection closed: rank {}'s process (pid {}) exited", peer, pid);
    if (Clock::now() > deadline) fail("Timed out waiting for rank {} over shared memory", peer);
    futex_wait(word, seen, std::chrono::milliseconds(50));
  }
}

// Pieces go out and come in alternately, so that neither neighbour waits for the other to finish a whole message.
void SharedMemoryRing::exchange(const void* out, size_t out_bytes, size_t in_bytes, const Receive& receive,
                                std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (size_t sent = 0, received = 0; sent < out_bytes || received < in_bytes;) {
    if (sent < out_bytes) sent += send_piece(static_cast<const unsigned char*>(out) + sent, out_bytes - sent, deadline);
    if (received < in_bytes) received += receive_piece(receive, received, in_bytes - received, deadline);
  }
}

// Into this rank's mailbox, once the next rank has read what it held (the message before last).
size_t SharedMemoryRing::send_piece(const unsigned char* data, size_t left, Clock::time_point deadline) {
  const size_t bytes = std::min(kPieceBytes, left);
  const uint32_t message = ++sent_;
  Mailbox& mine = mailbox(rank_, message % 2);
  wait_for(reinterpret_cast<uint32_t*>(&mine.taken), message - 2, (rank_ + 1) % world_, deadline);
  std::memcpy(mine.data, data, bytes);
  mine.posted.store(message, std::memory_order_release);
  futex_wake(reinterpret_cast<uint32_t*>(&mine.posted));
  return bytes;
}

// The previous rank's next message, handed to `receive` and then marked as read.
size_t SharedMemoryRing::receive_piece(const Receive& receive, size_t offset, size_t left, Clock::time_point deadline) {
  const size_t bytes = std::min(kPieceBytes, left);
  const uint32_t message = ++received_;
  const int prev = (rank_ + world_ - 1) % world_;
  Mailbox& theirs = mailbox(prev, message % 2);
  wait_for(reinterpret_cast<uint32_t*>(&theirs.posted), message, prev, deadline);
  receive(theirs.data, offset, bytes);
  theirs.taken.store(message, std::memory_order_release);
  futex_wake(reinterpret_cast<uint32_t*>(&theirs.taken));
  return bytes;
}

}  // namespace sd::dist

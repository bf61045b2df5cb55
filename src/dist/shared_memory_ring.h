// The ring collectives' messages between ranks of one machine, through a POSIX shared-memory segment instead of
// loopback TCP. Gloo in LibTorch 1.13 has only its TCP transport: there every byte a rank sends to a rank beside it
// goes through the kernel twice (into a socket buffer, out of it), in 64 KiB segments, on the cores the ranks
// compute on. Here a message is one memcpy into the sender's mailbox and one pass of the receiver over it (a copy,
// or the reduce-scatter's sum straight from the mailbox).
//
// Segment layout: a header, then per rank two mailboxes (double-buffered, so a rank can fill the next piece while
// its neighbour still reads the last) with their counters. Rank r writes only into its own mailboxes and the
// `taken` counter of its previous rank's; waits sleep on a futex, so a waiting rank leaves its core to compute.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace sd::dist {

class SharedMemoryRing {
 public:
  // Bytes per mailbox: a message larger than this travels in pieces.
  static constexpr size_t kPieceBytes = size_t(4) << 20;

  // Rank 0 creates the segment under a fresh name (returned by name()); the other ranks open it by that name.
  // Both return nullptr with `why` set if the segment cannot be made or opened (no /dev/shm, too small).
  static std::unique_ptr<SharedMemoryRing> create(int world, std::string* why);
  static std::unique_ptr<SharedMemoryRing> open(const std::string& name, int rank, int world, std::string* why);
  ~SharedMemoryRing();
  SharedMemoryRing(const SharedMemoryRing&) = delete;
  SharedMemoryRing& operator=(const SharedMemoryRing&) = delete;

  const std::string& name() const { return name_; }
  // Once every rank has opened it, the name can go: the mapping stays until the last rank unmaps it, and nothing
  // is left in /dev/shm if a rank dies.
  void unlink_name();

  // Called with each arriving piece: `bytes` at `offset` into the message, readable until the call returns.
  using Receive = std::function<void(const void* piece, size_t offset, size_t bytes)>;
  // Sends `out_bytes` of `out` to the next rank of the ring and passes the `in_bytes` the previous rank sends to
  // `receive`. Every rank must call it in the same order, each receiving as many bytes as its previous rank sends.
  // A peer that does not answer within `timeout` or whose process is gone throws sd::Error whose text says which
  // (for the caller's diagnosis).
  void exchange(const void* out, size_t out_bytes, size_t in_bytes, const Receive& receive,
                std::chrono::milliseconds timeout);

 private:
  SharedMemoryRing(std::string name, int rank, int world, void* base, size_t size);
  struct Mailbox;
  static size_t segment_bytes(int world);
  Mailbox& mailbox(int rank, int slot);
  size_t send_piece(const unsigned char* data, size_t left, std::chrono::steady_clock::time_point deadline);
  size_t receive_piece(const Receive& receive, size_t offset, size_t left,
                       std::chrono::steady_clock::time_point deadline);
  void wait_for(const uint32_t* word, uint32_t target, int peer, std::chrono::steady_clock::time_point deadline);

  std::string name_;
  int rank_, world_;
  void* base_;
  size_t size_;
  uint32_t sent_ = 0;      // messages (pieces) this rank has written into its mailboxes
  uint32_t received_ = 0;  // messages it has read from the previous rank's, which has sent as many or more
  bool unlinked_ = false;
};

}  // namespace sd::dist

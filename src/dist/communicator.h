// The narrow, backend-neutral interface training code uses to talk to the other ranks (collectives on CPU
// tensors), a single-process fake, and the factory that picks Gloo (or NCCL in a CUDA build) from a DistEnv.
#pragma once
#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/rendezvous.h"

namespace sd::dist {

struct CommOptions {
  // Every wait (joining, each collective) gives up after this long, naming the rank at fault.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Network interface(s) for the data plane, comma-separated ("eth1"). Empty: GLOO_SOCKET_IFNAME, else the
  // interface this machine uses to reach the master.
  std::string iface;
  // Process-group backend; "gloo" on CPU. A CUDA build adds "nccl" in make_process_group (one case).
  std::string backend = "gloo";
  // The reduce-scatter, the all-gather and float32 allreduces: "auto" sends them through shared memory when every
  // rank runs on this machine, else over the backend's network transport; "tcp" always over the network.
  std::string transport = "auto";
};

// A collective issued without waiting (gradient buckets during backward). wait() throws sd::Error naming the
// rank at fault if the collective failed.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

// Every rank must issue the same collectives in the same order with tensors of the same shapes and dtypes.
// Failures (a rank lost, hung or never joined) throw sd::Error with one line naming the rank and what happened.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place: each tensor becomes the sum over ranks. Tensors may differ in shape and dtype.
  virtual void allreduce_sum(std::vector<at::Tensor>& tensors) = 0;
  // In place: sum over ranks, then divided by world_size (floating-point tensors only).
  void allreduce_mean(std::vector<at::Tensor>& tensors);
  // One contiguous tensor, summed in place, without waiting.
  virtual std::unique_ptr<PendingCollective> allreduce_sum_async(at::Tensor tensor) = 0;
  // In place on a flat tensor whose numel is a multiple of world_size, seen as world_size equal chunks: on rank r,
  // chunk r becomes the sum over ranks of chunk r (float32 only); the other chunks are left as scratch. Each rank
  // sends and receives (world - 1) chunks, the least any reduce-scatter can (a ring over point-to-point messages,
  // since Gloo in LibTorch 1.13 has no reduce_scatter).
  virtual std::unique_ptr<PendingCollective> reduce_scatter_sum_async(at::Tensor flat) = 0;
  // In place, the inverse layout: chunk r of rank r is copied into chunk r of every rank (any dtype); a ring too.
  virtual std::unique_ptr<PendingCollective> all_gather_async(at::Tensor flat) = 0;
  // In place: every rank gets root's values.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
  // Small consensus data: returns every rank's `values` concatenated in rank order (all ranks pass the same
  // length), e.g. all_gather({stop_requested}) to agree on stopping.
  virtual std::vector<int64_t> all_gather(const std::vector<int64_t>& values) = 0;
  virtual std::string backend_name() const = 0;
  // What the ring collectives (and with shared memory the float32 allreduces) travel over: "shared memory", "tcp",
  // or "none" in a world of one.
  virtual std::string ring_transport() const = 0;
};

// World of one: collectives are identities. For single-process runs and tests.
class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void allreduce_sum(std::vector<at::Tensor>& tensors) override;
  std::unique_ptr<PendingCollective> allreduce_sum_async(at::Tensor tensor) override;
  std::unique_ptr<PendingCollective> reduce_scatter_sum_async(at::Tensor flat) override;
  std::unique_ptr<PendingCollective> all_gather_async(at::Tensor flat) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void barrier() override {}
  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override { return values; }
  std::string backend_name() const override { return "local"; }
  std::string ring_transport() const override { return "none"; }
};

// Local when env.world_size == 1, else the c10d process group of opts.backend (rendezvous through a TCPStore
// that rank 0 hosts at env.master_addr:master_port). Blocks until every rank joined, or throws within
// opts.timeout naming the missing ranks.
std::shared_ptr<Communicator> make_communicator(const DistEnv& env, const CommOptions& opts = {});

// Seconds given as a flag value -> milliseconds, rejecting non-positive values with the flag's name.
std::chrono::milliseconds timeout_from_seconds(double seconds, const std::string& flag = "--dist_timeout");

}  // namespace sd::dist

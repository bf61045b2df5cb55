#include "dist/communicator.h"

#include <cmath>

#include "core/error.h"

namespace sd::dist {

void Communicator::allreduce_mean(std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors)
    SD_CHECK(at::isFloatingType(t.scalar_type()), "allreduce_mean needs floating-point tensors, got {}",
             std::string(c10::toString(t.scalar_type())));
  allreduce_sum(tensors);
  if (world_size() == 1) return;
  for (auto& t : tensors) t.div_(world_size());
}

namespace {
class DonePending : public PendingCollective {
 public:
  void wait() override {}
};
}  // namespace

void LocalCommunicator::allreduce_sum(std::vector<at::Tensor>& tensors) {}

std::unique_ptr<PendingCollective> LocalCommunicator::allreduce_sum_async(at::Tensor tensor) {
  return std::make_unique<DonePending>();
}

std::unique_ptr<PendingCollective> LocalCommunicator::reduce_scatter_sum_async(at::Tensor flat) {
  return std::make_unique<DonePending>();
}

std::unique_ptr<PendingCollective> LocalCommunicator::all_gather_async(at::Tensor flat) {
  return std::make_unique<DonePending>();
}

void LocalCommunicator::broadcast(at::Tensor& tensor, int root) {
  SD_CHECK(root == 0, "broadcast root {} does not exist in a world of 1", root);
}

std::chrono::milliseconds timeout_from_seconds(double seconds, const std::string& flag) {
  // Up to ~115 days: far beyond any wait worth making, well inside what the millisecond clocks below can hold.
  SD_CHECK(std::isfinite(seconds) && seconds > 0 && seconds < 1e7,
           "{} must be a number of seconds above 0 and below 10000000, got {}", flag, seconds);
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

}  // namespace sd::dist

#include "dist/gradient_sync.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/error.h"

namespace sd::dist {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

// Runs after a parameter's AccumulateGrad node, i.e. once .grad holds this backward's final value.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  variable_list operator()(const variable_list& outputs, const variable_list& inputs) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

GradientSync::GradientSync(std::shared_ptr<Communicator> comm, std::vector<at::Tensor> params, GradientSyncOptions opts)
    : comm_(std::move(comm)), params_(std::move(params)) {
  SD_CHECK(opts.bucket_cap_bytes > 0, "gradient bucket size must be positive, got {}", opts.bucket_cap_bytes);
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    SD_CHECK(p.defined() && p.requires_grad() && p.is_leaf(),
             "GradientSync: parameter {} must be a leaf tensor that requires grad", i);
    SD_CHECK(at::isFloatingType(p.scalar_type()), "GradientSync: parameter {} has non-floating dtype {}", i,
             std::string(c10::toString(p.scalar_type())));
  }
  bucket_of_.resize(params_.size());
  grad_ready_.assign(params_.size(), false);

  // Reverse order: backward reaches the last layers first, so their bucket fills first.
  int64_t bucket_bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    bool new_bucket = buckets_.empty() || bucket_bytes + bytes > opts.bucket_cap_bytes ||
                      params_[buckets_.back().params.front()].scalar_type() != p.scalar_type();
    if (new_bucket) {
      buckets_.emplace_back();
      bucket_bytes = 0;
    }
    Bucket& b = buckets_.back();
    b.offsets.push_back(bucket_bytes / static_cast<int64_t>(p.element_size()));
    b.params.push_back(k);
    bucket_bytes += bytes;
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (auto& b : buckets_) {
    const auto& last = params_[b.params.back()];
    int64_t numel = b.offsets.back() + last.numel();
    b.flat = at::zeros({numel}, last.options().requires_grad(false));
  }

  if (comm_->world_size() == 1) return;  // the mean over one rank is the gradient itself
  for (size_t i = 0; i < params_.size(); ++i) {
    std::shared_ptr<Node> acc = torch::autograd::impl::grad_accumulator(params_[i]);
    SD_CHECK(acc, "GradientSync: parameter {} has no gradient accumulator", i);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>([this, i] { on_grad_ready(i); })));
    accumulators_.push_back(acc);
  }
}

GradientSync::~GradientSync() {
  for (size_t i = 0; i < accumulators_.size(); ++i)
    std::static_pointer_cast<Node>(accumulators_[i])->del_post_hook(hook_keys_[i]);
}

std::vector<std::vector<size_t>> GradientSync::bucket_layout() const {
  std::vector<std::vector<size_t>> layout;
  for (const auto& b : buckets_) layout.push_back(b.params);
  return layout;
}

void GradientSync::prepare_for_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  sent_during_backward_ = 0;
}

void GradientSync::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  if (grad_ready_[i]) {
    hook_error_ = fmt::format(
        "GradientSync: parameter {} received a gradient twice after prepare_for_backward() (call it only before the "
        "last backward of a step)",
        i);
    return;
  }
  grad_ready_[i] = true;
  Bucket& b = buckets_[bucket_of_[i]];
  ++b.ready;
  send_ready_buckets_locked();
}

// Buckets go out strictly in index order, so every rank issues the same collectives in the same order even if
// its backward finished gradients in a different order.
void GradientSync::send_ready_buckets_locked() {
  while (next_to_send_ < buckets_.size() && buckets_[next_to_send_].ready == buckets_[next_to_send_].params.size()) {
    send_bucket_locked(buckets_[next_to_send_]);
    ++next_to_send_;
    ++sent_during_backward_;
  }
}

void GradientSync::send_bucket_locked(Bucket& b) {
  for (size_t j = 0; j < b.params.size(); ++j) {
    const auto& p = params_[b.params[j]];
    at::Tensor slice = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
    const at::Tensor& g = p.grad();
    if (g.defined())
      slice.copy_(g);
    else
      slice.zero_();
  }
  b.sent = true;
  b.pending = comm_->allreduce_sum_async(b.flat);
}

void GradientSync::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto reset = [&] {
    for (auto& b : buckets_) {
      b.ready = 0;
      b.sent = false;
      b.pending.reset();
    }
    grad_ready_.assign(params_.size(), false);
    next_to_send_ = 0;
    armed_ = false;
  };
  if (!hook_error_.empty()) {
    std::string error = std::move(hook_error_);
    hook_error_.clear();
    reset();
    throw Error(error);
  }
  if (comm_->world_size() == 1) {
    reset();
    return;
  }
  if (!armed_) sent_during_backward_ = 0;
  armed_ = false;
  for (; next_to_send_ < buckets_.size(); ++next_to_send_) send_bucket_locked(buckets_[next_to_send_]);
  const int world = comm_->world_size();
  try {
    for (auto& b : buckets_) {
      b.pending->wait();
      b.flat.div_(world);
      for (size_t j = 0; j < b.params.size(); ++j) {
        auto& p = params_[b.params[j]];
        at::Tensor mean = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
        if (p.grad().defined())
          p.mutable_grad().copy_(mean);
        else
          p.mutable_grad() = mean.clone();
      }
    }
  } catch (...) {
    reset();
    throw;
  }
  reset();
}

}  // namespace sd::dist

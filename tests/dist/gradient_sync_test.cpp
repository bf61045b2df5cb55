// GradientSync against a plain allreduce_mean of all gradients, with ranks as threads (real Gloo on loopback).
#include <gtest/gtest.h>
#include <torch/nn.h>

#include <mutex>

#include "core/error.h"
#include "dist/gradient_sync.h"
#include "dist/in_process_world.h"
#include "test_util.h"

namespace sd::dist {
namespace {

using testing::run_world;

// A small MLP whose parameters span several buckets at a tiny bucket cap. `unused` never takes part in forward,
// so it has no gradient (on the ranks where `use_extra` is false).
struct Net : torch::nn::Module {
  Net() {
    // Same initial weights on every rank; the global generator is shared by the rank threads, hence the lock.
    static std::mutex init_mutex;
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(1234);
    a = register_module("a", torch::nn::Linear(8, 32));
    b = register_module("b", torch::nn::Linear(32, 32));
    c = register_module("c", torch::nn::Linear(32, 4));
    extra = register_parameter("extra", torch::randn({4}));
  }
  at::Tensor forward(const at::Tensor& x, bool use_extra) {
    auto h = torch::tanh(a->forward(x));
    h = torch::relu(b->forward(h));
    auto y = c->forward(h);
    if (use_extra) y = y * extra;
    return y.pow(2).mean();
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
  at::Tensor extra;
};

std::vector<at::Tensor> grads_of(Net& net) {
  std::vector<at::Tensor> g;
  for (auto& p : net.parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  return g;
}

at::Tensor input_for(int rank, int micro) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 10 * rank + micro);
  return at::randn({6, 8}, gen);
}

struct RankResult {
  std::vector<at::Tensor> synced, reference;
  size_t buckets = 0;
  int64_t sent_during_backward = 0;
};

// One optimizer step of `micro_batches` backwards; compares GradientSync with allreduce_mean of the same grads.
std::vector<RankResult> run_step(int world, int micro_batches, int64_t bucket_cap, bool extra_on_rank0_only) {
  std::vector<RankResult> results(world);
  auto errors = run_world(world, [&](int r, Communicator& comm) {
    Net net;
    GradientSync sync(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), net.parameters(),
                      GradientSyncOptions{bucket_cap});
    const bool use_extra = !extra_on_rank0_only || r == 0;
    // Reference: the same backwards without arming the hooks, then one plain allreduce_mean.
    for (int m = 0; m < micro_batches; ++m) net.forward(input_for(r, m), use_extra).backward();
    auto reference = grads_of(net);
    comm.allreduce_mean(reference);
    net.zero_grad(true);  // set_to_none: "no gradient" must be handled, not just zeros
    for (int m = 0; m < micro_batches; ++m) {
      if (m == micro_batches - 1) sync.prepare_for_backward();
      net.forward(input_for(r, m), use_extra).backward();
    }
    sync.finish();
    results[r].synced = grads_of(net);
    results[r].reference = reference;
    results[r].buckets = sync.num_buckets();
    results[r].sent_during_backward = sync.buckets_sent_during_backward();
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return results;
}

TEST(GradientSync, EqualsPlainAllreduceMeanExactlyWithTwoRanks) {
  // Two ranks: a+b is commutative, so bucketing cannot change a single bit.
  auto results = run_step(2, 1, /*bucket_cap=*/2048, false);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results[r].synced.size(), results[r].reference.size());
    for (size_t i = 0; i < results[r].synced.size(); ++i)
      EXPECT_TRUE(at::equal(results[r].synced[i], results[r].reference[i])) << "rank " << r << " param " << i;
    EXPECT_EQ(results[r].buckets, 3u);  // [extra, c.b, c.w, b.b], [b.w] (over the cap alone), [a.b, a.w]
    // Overlap really happened: buckets went out from autograd hooks, before finish().
    EXPECT_GT(results[r].sent_during_backward, 0);
  }
  // And the grads are not trivially equal to the local ones: ranks saw different data.
  for (size_t i = 0; i < results[0].synced.size(); ++i)
    EXPECT_TRUE(at::equal(results[0].synced[i], results[1].synced[i]));
}

TEST(GradientSync, GradientAccumulationAndMissingGradients) {
  // Three micro-batches accumulate locally, only the last backward syncs. `extra` gets a gradient on rank 0 only:
  // rank 1 contributes zeros and still receives the mean.
  auto results = run_step(2, 3, 1024, true);
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < results[r].synced.size(); ++i)
      EXPECT_TRUE(at::equal(results[r].synced[i], results[r].reference[i])) << "rank " << r << " param " << i;
  // The bucket holding the unused parameter cannot fill during backward on rank 1, so at least it waits.
  EXPECT_GT(results[1].buckets, 1u);
}

TEST(GradientSync, ThreeRanksWithinReductionOrderNoise) {
  // With three ranks Gloo's ring sums each element in an order that depends on its position in the buffer, so
  // different bucket layouts can differ in the last bit: float32 reduction-order noise, a few ulp of the sum.
  auto results = run_step(3, 1, 4096, false);
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < results[r].synced.size(); ++i)
      EXPECT_TRUE(sd::test::close_rel_max(results[r].synced[i], results[r].reference[i], 1e-6))
          << "rank " << r << " param " << i;
  // Every rank ends with the same bits.
  for (int r = 1; r < 3; ++r)
    for (size_t i = 0; i < results[0].synced.size(); ++i)
      EXPECT_TRUE(at::equal(results[0].synced[i], results[r].synced[i]));
}

TEST(GradientSync, OneBucketWhenEverythingFits) {
  auto results = run_step(2, 1, 25LL << 20, false);
  EXPECT_EQ(results[0].buckets, 1u);
  for (size_t i = 0; i < results[0].synced.size(); ++i)
    EXPECT_TRUE(at::equal(results[0].synced[i], results[0].reference[i]));
}

TEST(GradientSync, BucketsFollowReverseParameterOrderAndCap) {
  Net net;
  auto params = net.parameters();  // a.w [32,8], a.b [32], b.w [32,32], b.b [32], c.w [4,32], c.b [4], extra [4]
  GradientSync sync(std::make_shared<LocalCommunicator>(), params, GradientSyncOptions{1024});
  auto layout = sync.bucket_layout();
  // Each bucket <= 1024 bytes unless it holds one bigger parameter; together they cover every parameter once,
  // in reverse order.
  std::vector<size_t> order;
  for (const auto& bucket : layout) {
    int64_t bytes = 0;
    for (size_t i : bucket) bytes += params[i].numel() * 4;
    EXPECT_TRUE(bytes <= 1024 || bucket.size() == 1) << bytes;
    order.insert(order.end(), bucket.begin(), bucket.end());
  }
  std::vector<size_t> expected;
  for (size_t i = params.size(); i-- > 0;) expected.push_back(i);
  EXPECT_EQ(order, expected);
}

TEST(GradientSync, SingleRankLeavesGradientsAlone) {
  Net net;
  GradientSync sync(std::make_shared<LocalCommunicator>(), net.parameters());
  sync.prepare_for_backward();
  net.forward(input_for(0, 0), true).backward();
  auto before = grads_of(net);
  sync.finish();
  auto after = grads_of(net);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i]));
}

TEST(GradientSync, TwoBackwardsAfterPrepareIsAnError) {
  auto errors = run_world(2, [&](int r, Communicator& comm) {
    Net net;
    GradientSync sync(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), net.parameters(),
                      GradientSyncOptions{1 << 20});
    sync.prepare_for_backward();
    // Both backwards run before any bucket can complete only if the graph is retained; the second one reports.
    auto loss = net.forward(input_for(r, 0), true);
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
    sync.finish();
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("received a gradient twice"), std::string::npos) << errors[r];
}

TEST(GradientSync, RejectsParametersWithoutGrad) {
  at::Tensor frozen = at::zeros({3});
  EXPECT_THROW(GradientSync(std::make_shared<LocalCommunicator>(), {frozen}), Error);
  at::Tensor p = at::zeros({3}).requires_grad_();
  EXPECT_THROW(GradientSync(std::make_shared<LocalCommunicator>(), {p}, GradientSyncOptions{0}), Error);
}

}  // namespace
}  // namespace sd::dist

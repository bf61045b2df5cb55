// GradientReducer against a plain allreduce of all gradients, with ranks as threads (real Gloo on loopback), and
// the bucket layout and ring collectives it stands on.
#include "dist/gradient_reducer.h"

#include <gtest/gtest.h>
#include <torch/nn.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "dist/in_process_world.h"
#include "dist/shared_memory_ring.h"
#include "test_util.h"

namespace sd::dist {
namespace {

using testing::run_world;

// A small MLP whose parameters span several buckets at a tiny bucket cap. `extra` takes part in forward only when
// asked, so some ranks or micro-batches produce no gradient for it.
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
    auto h = torch::tanh(a->forward(x.to(a->weight.scalar_type())));
    h = torch::relu(b->forward(h));
    auto y = c->forward(h);
    if (use_extra) y = y * extra;
    return y.pow(2).mean();
  }
  std::vector<int64_t> numels() {
    std::vector<int64_t> n;
    for (auto& p : parameters()) n.push_back(p.numel());
    return n;
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
  at::Tensor extra;
};

at::Tensor input_for(int rank, int micro) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 10 * rank + micro);
  return at::randn({6, 8}, gen);
}

// Every rank's gradients summed over ranks and micro-batches, flattened into the layout's buckets: what the
// reducer must produce (rank r's owned slice of it when sharded).
std::vector<at::Tensor> expected_buckets(const BucketLayout& layout, Net& net, int world, int micro_batches,
                                         bool extra_on_rank0_only) {
  std::vector<at::Tensor> flat;
  for (const Bucket& b : layout.buckets()) flat.push_back(at::zeros({b.padded_numel}, at::kFloat));
  auto params = net.parameters();
  for (int r = 0; r < world; ++r) {
    for (int m = 0; m < micro_batches; ++m) {
      net.zero_grad(true);
      net.forward(input_for(r, m), !extra_on_rank0_only || r == 0).backward();
      for (size_t i = 0; i < params.size(); ++i) {
        if (!params[i].grad().defined()) continue;
        const BucketSlot& s = layout.slot_of(i);
        flat[layout.bucket_of(i)].narrow(0, s.offset, s.numel).add_(params[i].grad().reshape({-1}));
      }
    }
  }
  net.zero_grad(true);
  return flat;
}

// Gloo's worker thread drops its reference to an allreduced tensor just after waking the waiter, hence a deadline.
bool only_the_caller_holds(const at::Tensor& t) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (t.use_count() > 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return t.use_count() == 1;
}

struct RankResult {
  std::vector<at::Tensor> reduced, expected;
  int64_t sent_during_backward = 0;
  int64_t peak_buffered_bytes = 0, largest_bucket_bytes = 0;
  bool reducer_kept_a_gradient = false;
};

std::vector<RankResult> run_step(int world, int micro_batches, int64_t cap, bool sharded, bool extra_on_rank0_only) {
  std::vector<RankResult> results(world);
  auto errors = run_world(world, [&](int r, Communicator& comm) {
    Net net;
    BucketLayout layout(net.numels(), cap, world, sharded);
    auto all = expected_buckets(layout, net, world, micro_batches, extra_on_rank0_only);
    for (size_t b = 0; b < all.size(); ++b)
      results[r].expected.push_back(all[b].narrow(0, layout.owned_begin(b, r), layout.owned_numel(b, r)));
    GradientReducer reducer(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), net.parameters(), layout);
    for (int m = 0; m < micro_batches; ++m) {
      reducer.begin_micro_batch(m == 0, m + 1 == micro_batches);
      net.forward(input_for(r, m), !extra_on_rank0_only || r == 0).backward();
      reducer.end_micro_batch();
    }
    for (const FlatPieces& pieces : reducer.finish()) {
      std::vector<at::Tensor> values;
      for (const FlatPiece& piece : pieces) {
        results[r].reducer_kept_a_gradient |= !only_the_caller_holds(piece.values);
        values.push_back(piece.values.to(at::kFloat));
      }
      results[r].reduced.push_back(at::cat(values));
    }
    results[r].sent_during_backward = reducer.buckets_sent_during_backward();
    results[r].peak_buffered_bytes = reducer.peak_buffered_bytes();
    for (const Bucket& b : layout.buckets())
      results[r].largest_bucket_bytes = std::max(results[r].largest_bucket_bytes, b.padded_numel * 4);
    for (auto& p : net.parameters()) EXPECT_FALSE(p.grad().defined()) << "the buckets hold the gradients";
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return results;
}

// Summing the same float32 numbers in another order (ring positions, micro-batches folded one by one) moves the
// last bits only.
void expect_close(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].reduced.size(), results[r].expected.size());
    for (size_t b = 0; b < results[r].reduced.size(); ++b)
      EXPECT_TRUE(sd::test::close_rel_max(results[r].reduced[b], results[r].expected[b], 1e-6))
          << "rank " << r << " bucket " << b;
  }
}

TEST(GradientReducer, AllReducesBucketsDuringBackward) {
  auto results = run_step(2, 1, /*cap=*/512, /*sharded=*/false, false);
  expect_close(results);
  // Overlap really happened: buckets went out from autograd hooks, before the backward ended.
  EXPECT_GT(results[0].sent_during_backward, 0);
}

TEST(GradientReducer, AccumulatesMicroBatchesAndCountsMissingGradientsAsZeros) {
  expect_close(run_step(2, 3, 256, false, /*extra_on_rank0_only=*/true));
}

TEST(GradientReducer, ShardedRanksGetTheirSliceOfEveryBucket) {
  for (int world : {2, 3}) expect_close(run_step(world, 2, 300, /*sharded=*/true, true));
}

// Gradient memory exists only from a step's backward to its optimizer step, so it never adds to the activations of
// the next forward; sharded, a micro-batch's buffers are a few buckets (filling, travelling), not the model.
TEST(GradientReducer, KeepsNoGradientBetweenStepsAndFewBucketsWhenSharded) {
  for (bool sharded : {false, true}) {
    const auto results = run_step(2, 2, /*cap=*/64, sharded, false);
    expect_close(results);
    for (const RankResult& r : results) {
      EXPECT_FALSE(r.reducer_kept_a_gradient) << "sharded " << sharded;
      if (sharded) {
        EXPECT_LE(r.peak_buffered_bytes, 3 * r.largest_bucket_bytes);
      }
    }
  }
}

TEST(GradientReducer, SingleRank) {
  expect_close(run_step(1, 2, 256, false, false));
  expect_close(run_step(1, 2, 256, true, false));
}

// One rank's only micro-batch sums nothing, so the reducer copies nothing: each parameter's piece is autograd's own
// gradient (bf16 here, bit for bit, at its slot's offset; a parameter the loss left out gets zeros). As soon as
// something is summed, the gradients go into float32 buckets.
TEST(GradientReducer, OneRanksOnlyMicroBatchKeepsAutogradsGradients) {
  for (const bool sharded : {false, true}) {
    for (const int micro_batches : {1, 2}) {
      Net net;
      net.to(at::kBFloat16);
      const std::vector<at::Tensor> params = net.parameters();
      BucketLayout layout(net.numels(), 256, 1, sharded);
      const auto expected = expected_buckets(layout, net, 1, micro_batches, false);
      GradientReducer reducer(std::make_shared<LocalCommunicator>(), params, layout);
      for (int m = 0; m < micro_batches; ++m) {
        reducer.begin_micro_batch(m == 0, m + 1 == micro_batches);
        net.forward(input_for(0, m), true).backward();
        reducer.end_micro_batch();
      }
      const std::vector<FlatPieces> reduced = reducer.finish();
      ASSERT_EQ(reduced.size(), expected.size());
      for (size_t b = 0; b < reduced.size(); ++b) {
        const std::string where = fmt::format("sharded {} micro-batches {} bucket {}", sharded, micro_batches, b);
        const std::vector<BucketSlot>& slots = layout.buckets()[b].slots;
        if (micro_batches == 1) {
          ASSERT_EQ(reduced[b].size(), slots.size()) << where;
          for (size_t k = 0; k < slots.size(); ++k) {
            EXPECT_EQ(reduced[b][k].offset, slots[k].offset) << where;
            EXPECT_EQ(reduced[b][k].values.scalar_type(), at::kBFloat16) << where;
            EXPECT_TRUE(
                at::equal(reduced[b][k].values.to(at::kFloat), expected[b].narrow(0, slots[k].offset, slots[k].numel)))
                << where;
          }
        } else {
          ASSERT_EQ(reduced[b].size(), 1u) << where;
          EXPECT_EQ(reduced[b][0].values.scalar_type(), at::kFloat) << where;
          EXPECT_TRUE(sd::test::close_rel_max(reduced[b][0].values, expected[b], 1e-6)) << where;
        }
      }
      for (const at::Tensor& p : params) EXPECT_FALSE(p.grad().defined()) << "the reducer took the gradients";
    }
  }
}

TEST(GradientReducer, ALoneRanksParameterLeftOutOfTheLossGetsZeros) {
  Net net;
  const std::vector<at::Tensor> params = net.parameters();
  BucketLayout layout(net.numels(), 256, 1, false);
  GradientReducer reducer(std::make_shared<LocalCommunicator>(), params, layout);
  reducer.begin_micro_batch(true, true);
  net.forward(input_for(0, 0), /*use_extra=*/false).backward();
  reducer.end_micro_batch();
  const std::vector<FlatPieces> reduced = reducer.finish();
  for (size_t i = 0; i < params.size(); ++i) {
    const BucketSlot& slot = layout.slot_of(i);
    const at::Tensor g = narrow_pieces(reduced[layout.bucket_of(i)], slot.offset, slot.numel);
    EXPECT_EQ(params[i].is_same(net.extra), at::equal(g, at::zeros_like(g))) << "parameter " << i;
  }
}

TEST(GradientReducer, RejectsParametersWithoutGrad) {
  at::Tensor frozen = at::zeros({3});
  BucketLayout layout({3}, 16, 1, false);
  EXPECT_THROW(GradientReducer(std::make_shared<LocalCommunicator>(), {frozen}, layout), Error);
}

TEST(BucketLayout, ReverseParameterOrderUnderTheCap) {
  // numels 256, 32, 1024, 32, 128, 4, 4 at a cap of 256 elements.
  BucketLayout layout({256, 32, 1024, 32, 128, 4, 4}, 256, 1, false);
  std::vector<size_t> order;
  for (const Bucket& b : layout.buckets()) {
    EXPECT_TRUE(b.numel <= 256 || b.slots.size() == 1) << b.numel;
    for (const BucketSlot& s : b.slots) order.push_back(s.param);
  }
  EXPECT_EQ(order, (std::vector<size_t>{6, 5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(layout.buckets().size(), 4u);  // [6,5,4,3] [2] [1] [0]
}

TEST(BucketLayout, ShardsArePaddedEqualSlicesCoveringEveryElementOnce) {
  BucketLayout layout({10, 7, 5}, 100, 3, true);
  ASSERT_EQ(layout.buckets().size(), 1u);
  EXPECT_EQ(layout.buckets()[0].numel, 22);
  EXPECT_EQ(layout.buckets()[0].padded_numel, 24);
  std::vector<int> seen(22, 0);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(layout.owned_numel(0, r), 8);
    for (const OwnedPiece& p : layout.owned_pieces(0, r))
      for (int64_t e = p.begin; e < p.end; ++e) seen[layout.slot_of(p.param).offset + e]++;
  }
  for (int v : seen) EXPECT_EQ(v, 1);
}

// Over shared memory (ranks of one machine, the default) and over TCP, from a few elements to messages of several
// shared-memory pieces, in float32 and bf16, several collectives in a row (so mailboxes are reused), and the float32
// allreduce that rides the same ring over shared memory, on a size no multiple of the world size.
TEST(RingCollectives, ReduceScatterAndAllGatherInPlace) {
  const int64_t piece_floats = static_cast<int64_t>(SharedMemoryRing::kPieceBytes / sizeof(float));
  for (const std::string transport : {"auto", "tcp"})
    for (int world : {2, 3})
      for (int64_t chunk : {int64_t(4), 2 * piece_floats + 1000}) {
        SCOPED_TRACE(transport + ", world " + std::to_string(world) + ", chunk " + std::to_string(chunk));
        const int64_t n = chunk * world;
        const at::Tensor pattern = at::arange(n, at::kFloat).remainder_(1000);
        std::vector<std::string> transports(world);
        std::vector<at::Tensor> scattered(world), gathered(world), gathered_bf16(world), summed(world);
        auto errors = run_world(
            world,
            [&](int r, Communicator& comm) {
              transports[r] = comm.ring_transport();
              for (int repeat = 0; repeat < 2; ++repeat) {
                at::Tensor flat = pattern * (r + 1 + repeat);
                comm.reduce_scatter_sum_async(flat)->wait();
                scattered[r] = flat.narrow(0, chunk * r, chunk).clone();
              }
              at::Tensor mine = at::full({n}, -1.0f);
              mine.narrow(0, chunk * r, chunk).fill_(static_cast<float>(r));
              comm.all_gather_async(mine)->wait();
              gathered[r] = mine;
              at::Tensor mine_bf16 = at::full({n}, -1.0f, at::kBFloat16);
              mine_bf16.narrow(0, chunk * r, chunk).copy_(pattern.narrow(0, chunk * r, chunk));
              comm.all_gather_async(mine_bf16)->wait();
              gathered_bf16[r] = mine_bf16;
              summed[r] = pattern.narrow(0, 0, n - 1) * (r + 1);
              comm.allreduce_sum_async(summed[r])->wait();
            },
            std::chrono::seconds(20), transport);
        // Each rank's last reduce-scatter: pattern * sum over ranks of (r + 2).
        const float ranks_sum = world * (world + 1) / 2.0f + world;
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(errors[r], "");
          EXPECT_EQ(transports[r], transport == "tcp" ? "tcp" : "shared memory");
          EXPECT_TRUE(at::equal(scattered[r], pattern.narrow(0, chunk * r, chunk) * ranks_sum)) << r;
          for (int c = 0; c < world; ++c)
            EXPECT_TRUE(at::all(gathered[r].narrow(0, chunk * c, chunk) == c).item<bool>()) << r << " " << c;
          EXPECT_TRUE(at::equal(gathered_bf16[r], pattern.to(at::kBFloat16))) << r;
          EXPECT_TRUE(at::equal(summed[r], pattern.narrow(0, 0, n - 1) * (ranks_sum - world))) << r;
        }
      }
}

}  // namespace
}  // namespace sd::dist

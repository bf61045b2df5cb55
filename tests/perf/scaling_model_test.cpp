// The scaling model's step timeline on cases worked out by hand: bytes of a ring, what backward hides, what the
// sharded all-gather adds, and the search for enough micro-batches.
#include "perf/scaling_model.h"

#include <gtest/gtest.h>

namespace sd::perf {
namespace {

// 1 M parameters (4 MB of float32 gradients) in 4 buckets, a 1 s micro-batch, a link moving 1 MB in 8 ms.
StepModel base(int machines) {
  StepModel m;
  m.machines = machines;
  m.micro_batch_s = 1;
  m.parameters = 1'000'000;
  m.bucket_cap_bytes = 1e6;
  m.link.gbit_per_s = 1;
  return m;
}

TEST(ScalingModel, OneMachineNeverWaits) {
  StepModel m = base(1);
  m.update_s = 0.5;
  const StepPrediction p = predict_step(m);
  EXPECT_DOUBLE_EQ(p.step_s, 1.5);
  EXPECT_DOUBLE_EQ(p.efficiency, 1);
  EXPECT_EQ(p.wire_bytes, 0);
  EXPECT_EQ(p.messages, 0);
}

TEST(ScalingModel, RingBytesAreTwoNMinusOneOverNOfTheGradients) {
  for (int n : {2, 3, 8}) {
    StepModel m = base(n);
    const StepPrediction plain = predict_step(m);
    EXPECT_NEAR(plain.wire_bytes, 2.0 * (n - 1) / n * 4e6, 1) << n;
    EXPECT_EQ(plain.messages, (4 + 1) * 2 * (n - 1)) << n;  // 4 buckets and the loss
    // Reduce-scatter plus an all-gather of float32 weights move exactly what one allreduce moves.
    m.sharded = true;
    m.compute_weight_bytes = 4;
    EXPECT_NEAR(predict_step(m).wire_bytes, plain.wire_bytes, 1) << n;
  }
}

TEST(ScalingModel, BackwardHidesAllButTheLastBucket) {
  // 2 machines: a 1 MB bucket's allreduce sends 2 x 0.5 MB = 8 ms, far less than the 1/6 s between buckets.
  const StepPrediction p = predict_step(base(2));
  EXPECT_NEAR(p.link_s, 4 * 0.008, 1e-9);
  EXPECT_NEAR(p.exposed_s, 0.008, 1e-9);
  EXPECT_NEAR(p.step_s, 1.008, 1e-9);
}

TEST(ScalingModel, ASlowLinkExposesWhatBackwardCannotCover) {
  // 100x slower: 0.8 s per bucket. The first bucket is ready 1/6 s into the 2/3 s backward, the link then works
  // through all four: done at 1/3 + 1/6 + 3.2 s.
  StepModel m = base(2);
  m.link.gbit_per_s = 0.01;
  const StepPrediction p = predict_step(m);
  EXPECT_NEAR(p.step_s, 1.0 / 3 + 1.0 / 6 + 3.2, 1e-9);
  EXPECT_NEAR(p.exposed_s, p.step_s - 1, 1e-9);
}

TEST(ScalingModel, LatencyCostsEveryRingStep) {
  StepModel m = base(3);
  m.link.latency_s = 0.01;
  const StepPrediction with = predict_step(m);
  m.link.latency_s = 0;
  // The last bucket's allreduce (4 ring steps) is exposed, then the loss's (4 more), each step 10 ms longer.
  EXPECT_NEAR(with.step_s - predict_step(m).step_s, 8 * 0.01, 1e-9);
}

TEST(ScalingModel, ShardedAllGatherAfterTheUpdateIsExposed) {
  StepModel m = base(2);
  m.sharded = true;
  m.update_s = 0.1;
  // Reduce-scatter of the last bucket: 0.5 MB = 4 ms; then the update, then bf16 weights: 4 x 0.25 MB = 8 ms.
  const StepPrediction p = predict_step(m);
  EXPECT_NEAR(p.step_s, 1 + 0.004 + 0.1 + 0.008, 1e-9);
  EXPECT_NEAR(p.wire_bytes, 0.5 * 4e6 + 0.5 * 2e6, 1);
}

TEST(ScalingModel, MoreMicroBatchesAmortiseTheExposedCommunication) {
  // 8 machines on a link 50x slower: 2.3 s exposed per step, so 21 micro-batches of 1 s reach 90%.
  StepModel m = base(8);
  m.link.gbit_per_s = 0.02;
  const double one = predict_step(m).efficiency;
  m.micro_batches = 8;
  EXPECT_GT(predict_step(m).efficiency, one);
  const int needed = micro_batches_for_efficiency(m, 0.9);
  EXPECT_EQ(needed, 21);
  m.micro_batches = needed;
  EXPECT_GE(predict_step(m).efficiency, 0.9);
  m.micro_batches = needed - 1;
  EXPECT_LT(predict_step(m).efficiency, 0.9);
  EXPECT_EQ(micro_batches_for_efficiency(m, 1.0, 64), 0);
}

}  // namespace
}  // namespace sd::perf

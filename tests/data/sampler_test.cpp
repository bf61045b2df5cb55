#include "data/sampler.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "test_util.h"

namespace sd::data {
namespace {

std::vector<int64_t> step_samples(const DistributedSampler& s, const BatchLayout& l, int64_t step) {
  std::vector<int64_t> all;
  for (int64_t m = 0; m < l.accumulation; ++m)
    for (int64_t r = 0; r < l.world; ++r) {
      auto part = s.micro_batch(step, m, r);
      all.insert(all.end(), part.begin(), part.end());
    }
  std::sort(all.begin(), all.end());
  return all;
}

TEST(DistributedSampler, SameSamplesPerStepWhateverTheWorldSize) {
  BatchLayout one{2, 3, 1}, three{2, 1, 3};
  DistributedSampler a(50, one, 7), b(50, three, 7);
  EXPECT_EQ(a.steps_per_epoch(), 9);  // 50 / 6, rounded up
  for (int64_t step = 0; step < 20; ++step) EXPECT_EQ(step_samples(a, one, step), step_samples(b, three, step));
}

// As diffusers counts an epoch (a DataLoader without drop_last): 6 images in batches of 4 are 2 steps. The short
// last batch is filled from the start of the epoch's order, so every step has the same size.
TEST(DistributedSampler, TheLastIncompleteBatchOfAnEpochIsFilledFromItsStart) {
  EXPECT_EQ(steps_per_epoch(6, BatchLayout{4, 1, 1}), 2);
  EXPECT_EQ(steps_per_epoch(8, BatchLayout{4, 1, 1}), 2);
  EXPECT_EQ(steps_per_epoch(9, BatchLayout{2, 2, 2}), 2);
  const BatchLayout layout{2, 3, 1};
  const DistributedSampler s(50, layout, 7);
  const std::vector<int64_t> order = s.epoch_order(0);
  std::vector<int64_t> expected = {order[48], order[49], order[0], order[1], order[2], order[3]};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(step_samples(s, layout, 8), expected);
  const std::vector<int64_t> next_epoch = s.epoch_order(1);
  EXPECT_EQ(s.micro_batch(9, 0, 0), std::vector<int64_t>(next_epoch.begin(), next_epoch.begin() + 2));
}

TEST(DistributedSampler, EpochIsAPermutationAndEpochsDiffer) {
  DistributedSampler s(30, BatchLayout{3, 1, 2}, 1);
  std::set<int64_t> seen;
  for (int64_t step = 0; step < s.steps_per_epoch(); ++step)
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t i : s.micro_batch(step, 0, r)) EXPECT_TRUE(seen.insert(i).second) << i;
  EXPECT_EQ(seen.size(), 30u);
  EXPECT_NE(s.epoch_order(0), s.epoch_order(1));
  EXPECT_EQ(s.epoch_order(1), DistributedSampler(30, BatchLayout{3, 1, 2}, 1).epoch_order(1));
  EXPECT_NE(s.epoch_order(0), DistributedSampler(30, BatchLayout{3, 1, 2}, 2).epoch_order(0));
}

// As an epoch's last batch: a global batch larger than the data is filled from the epoch's start, over and over.
TEST(DistributedSampler, DatasetSmallerThanOneGlobalBatch) {
  const BatchLayout layout{2, 2, 2};
  const DistributedSampler s(3, layout, 0);
  EXPECT_EQ(s.steps_per_epoch(), 1);
  const std::vector<int64_t> o = s.epoch_order(0);
  EXPECT_EQ(s.micro_batch(0, 0, 0), (std::vector<int64_t>{o[0], o[1]}));
  EXPECT_EQ(s.micro_batch(0, 0, 1), (std::vector<int64_t>{o[2], o[0]}));
  EXPECT_EQ(s.micro_batch(0, 1, 1), (std::vector<int64_t>{o[0], o[1]}));
  EXPECT_EQ(s.micro_batch(1, 0, 0), (std::vector<int64_t>{s.epoch_order(1)[0], s.epoch_order(1)[1]}));
  // With buckets a micro-batch comes whole from one bucket: two buckets of one sample hold none of two.
  EXPECT_EQ(sd::test::error_of([] {
              DistributedSampler(2, BatchLayout{2, 1, 1}, 0, {0, 1});
            }),
            "no bucket holds a whole micro-batch of 2 samples of the 2: lower --train_batch_size, or widen the buckets "
            "(--bucket_reso_steps, --min_bucket_reso, --max_bucket_reso)");
}

// 40 samples in three buckets of 17, 13 and 10 samples.
std::vector<int32_t> three_buckets() {
  std::vector<int32_t> bucket_of;
  for (int i = 0; i < 40; ++i) bucket_of.push_back(i < 17 ? 0 : i < 30 ? 2 : 1);
  return bucket_of;
}

TEST(DistributedSampler, WithBucketsEveryMicroBatchHoldsOneBucket) {
  const std::vector<int32_t> bucket_of = three_buckets();
  const BatchLayout layout{3, 2, 2};
  const DistributedSampler s(40, layout, 5, bucket_of);
  // Whole micro-batches of 3 per bucket: 5 + 4 + 3 = 12 of them, 36 samples; 3 global batches of 12.
  EXPECT_EQ(s.samples_per_epoch(), 36);
  EXPECT_EQ(s.steps_per_epoch(), 3);
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 2 * s.steps_per_epoch(); ++step)
    for (int64_t m = 0; m < layout.accumulation; ++m)
      for (int64_t r = 0; r < layout.world; ++r) {
        const std::vector<int64_t> micro = s.micro_batch(step, m, r);
        for (int64_t i : micro) EXPECT_EQ(bucket_of[i], bucket_of[micro[0]]) << "step " << step;
        if (step < s.steps_per_epoch()) seen.insert(micro.begin(), micro.end());
      }
  EXPECT_EQ(seen.size(), 36u);  // an epoch uses no sample twice
  EXPECT_NE(s.epoch_order(0), s.epoch_order(1));
  // The buckets take turns rather than coming one after another.
  std::vector<int32_t> order_of_buckets;
  for (size_t i = 0; i < s.epoch_order(0).size(); i += 3) order_of_buckets.push_back(bucket_of[s.epoch_order(0)[i]]);
  EXPECT_FALSE(std::is_sorted(order_of_buckets.begin(), order_of_buckets.end()));
}

TEST(DistributedSampler, WithBucketsTheSameSamplesMakeAStepWhateverTheWorldSize) {
  const BatchLayout one{2, 4, 1}, four{2, 1, 4};
  const DistributedSampler a(40, one, 9, three_buckets()), b(40, four, 9, three_buckets());
  for (int64_t step = 0; step < 8; ++step) EXPECT_EQ(step_samples(a, one, step), step_samples(b, four, step));
}

TEST(BatchPlanner, NamesTheBucketOfEachMicroBatch) {
  const uint64_t seed = 3;
  const std::vector<int32_t> bucket_of = three_buckets();
  const BatchPlanner planner(40, BatchLayout{4, 1, 1}, 0, seed, bucket_of);
  EXPECT_EQ(planner.samples_per_epoch(), 36);  // 4 + 3 + 2 micro-batches of 4
  for (int64_t step = 0; step < 9; ++step) {
    const BatchRequest request = planner.plan(step, 0);
    for (int64_t i : request.indices) EXPECT_EQ(bucket_of[i], request.bucket);
  }
  EXPECT_EQ(BatchPlanner(40, BatchLayout{4, 1, 1}, 0, seed).plan(0, 0).bucket, -1);
}

TEST(RandomSubset, SeededAndTheSameEachTime) {
  EXPECT_EQ(random_subset(10, 4, 1), random_subset(10, 4, 1));
  EXPECT_EQ(random_subset(10, 4, 1).size(), 4u);
  EXPECT_NE(random_subset(10, 4, 1), random_subset(10, 4, 2));
  EXPECT_EQ(random_subset(3, 5, 1), (std::vector<int64_t>{0, 1, 2}));
}

}  // namespace
}  // namespace sd::data

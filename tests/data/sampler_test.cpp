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
  EXPECT_EQ(a.steps_per_epoch(), 8);
  for (int64_t step = 0; step < 20; ++step) EXPECT_EQ(step_samples(a, one, step), step_samples(b, three, step));
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

TEST(DistributedSampler, DatasetSmallerThanOneGlobalBatch) {
  EXPECT_THROW(DistributedSampler(3, BatchLayout{2, 1, 2}, 0), Error);
}

}  // namespace
}  // namespace sd::data

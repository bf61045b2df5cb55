#include "core/parallel.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <vector>

namespace sd {
namespace {

// Restores LibTorch's thread count when a test changes it.
struct ThreadCount {
  explicit ThreadCount(int n) : saved(at::get_num_threads()) { at::set_num_threads(n); }
  ~ThreadCount() { at::set_num_threads(saved); }
  int saved;
};

TEST(ParallelFor, SplitsTheRangeOverEveryThreadAndCoversEachIndexOnce) {
  ThreadCount two(2);
  std::vector<int> visits(1000, 0);
  std::set<int> threads;
  std::mutex mutex;
  parallel_for(0, 1000, 1, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(at::get_thread_num());
    for (int64_t i = begin; i < end; ++i) ++visits[i];
  });
  EXPECT_EQ(threads, (std::set<int>{0, 1})) << "the loop ran on one thread: is parallel.cpp compiled with OpenMP?";
  EXPECT_EQ(std::count(visits.begin(), visits.end(), 1), 1000);
}

TEST(ParallelFor, ARangeWithinOneGrainRunsAsOneChunk) {
  ThreadCount two(2);
  std::vector<std::pair<int64_t, int64_t>> chunks;
  std::mutex mutex;
  parallel_for(5, 105, 100, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mutex);
    chunks.emplace_back(begin, end);
  });
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{5, 105}}));
}

TEST(ParallelFor, EveryThreadRunsInTheCallersGradMode) {
  ThreadCount two(2);
  for (const bool enabled : {false, true}) {
    at::AutoGradMode mode(enabled);
    std::atomic<int> chunks_in_other_mode{0};
    parallel_for(0, 2, 1, [&](int64_t, int64_t) {
      if (at::GradMode::is_enabled() != enabled) ++chunks_in_other_mode;
    });
    EXPECT_EQ(chunks_in_other_mode, 0) << "grad mode " << enabled;
  }
}

TEST(OneThreadScope, RunsLoopsOnTheCallingThreadAloneAndRestoresTheCount) {
  ThreadCount two(2);
  {
    OneThreadScope one;
    EXPECT_EQ(at::get_num_threads(), 1);
    std::set<int> threads;
    std::mutex mutex;
    parallel_for(0, 1000, 1, [&](int64_t, int64_t) {
      std::lock_guard<std::mutex> lock(mutex);
      threads.insert(at::get_thread_num());
    });
    EXPECT_EQ(threads, (std::set<int>{0}));
  }
  EXPECT_EQ(at::get_num_threads(), 2);
}

}  // namespace
}  // namespace sd

// Prepares items ahead of use on background threads and hands them out in the order they were requested, so the
// training step does not wait on decoding and augmentation (the time it still waits is measured). Its threads are
// plain std::threads, separate from LibTorch's compute pool. A failure while preparing an item is rethrown when that
// item is taken.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace sd::data {

template <typename Item>
class Prefetcher {
 public:
  explicit Prefetcher(int threads) {
    for (int i = 0; i < std::max(1, threads); ++i) workers_.emplace_back([this] { work(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      jobs_.clear();
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Queues `make` to run on a worker; its item is handed out after every item requested before it.
  void request(std::function<Item()> make) {
    auto job = std::make_shared<std::packaged_task<Item()>>(std::move(make));
    ready_.push_back(job->get_future());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back([job] { (*job)(); });
    }
    cv_.notify_one();
  }

  size_t pending() const { return ready_.size(); }

  // The oldest requested item, waiting for it if needed; `waited_s` accumulates the seconds spent waiting.
  Item next(double& waited_s) {
    const auto start = std::chrono::steady_clock::now();
    std::future<Item> f = std::move(ready_.front());
    ready_.pop_front();
    Item item = f.get();
    waited_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return item;
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::deque<std::future<Item>> ready_;  // touched by the requesting thread only
  bool stopping_ = false;
};

}  // namespace sd::data

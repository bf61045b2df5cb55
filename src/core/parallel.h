// A parallel loop for sdtrain's own kernels (AdamW, the EMA, tiled attention), and a scope that keeps work on one
// thread. LibTorch's at::parallel_for is a header template around `#pragma omp parallel`, so in a file compiled
// without OpenMP it quietly runs on one thread: AdamW and the EMA did until 2026-11-26 (perf: the whole optimizer pass
// on the main thread while the other waited). This one is compiled with OpenMP once, in parallel.cpp, so no caller
// can forget the flag.
#pragma once
#include <cstdint>
#include <functional>

namespace sd {

// Runs fn(chunk_begin, chunk_end) over [begin, end) in at most one chunk per LibTorch thread, each of at least `grain`
// elements when there is more than one (at::parallel_for's contract); inside fn, at::get_thread_num() names the
// thread, and LibTorch ops run in the caller's grad mode. Runs inline when called from inside another parallel region.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Runs the LibTorch and oneDNN ops started in its lifetime on the calling thread alone (OpenMP's thread count, which
// is the calling thread's own, is 1 until it ends), for work too small to split (core/onednn_matmul.cpp).
class OneThreadScope {
 public:
  OneThreadScope();
  ~OneThreadScope();
  OneThreadScope(const OneThreadScope&) = delete;
  OneThreadScope& operator=(const OneThreadScope&) = delete;

 private:
  int threads_;
};

}  // namespace sd

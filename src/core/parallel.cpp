#include "core/parallel.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#ifdef _OPENMP
#include <omp.h>
#endif

// The fuzz build compiles this without OpenMP on purpose (clang's runtime must not meet LibTorch's libgomp); every
// other build must have it, or the loop runs on one thread.
#if AT_PARALLEL_OPENMP && !defined(_OPENMP) && !defined(SD_SERIAL_PARALLEL_FOR)
#error "core/parallel.cpp must be compiled with OpenMP (-fopenmp), else at::parallel_for runs on one thread"
#endif

namespace sd {

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  // Grad mode is per thread and OpenMP's threads keep their own: a LibTorch op inside fn runs as its caller's would.
  const bool grad_enabled = at::GradMode::is_enabled();
  at::parallel_for(begin, end, grain, [&](int64_t chunk_begin, int64_t chunk_end) {
    at::AutoGradMode same_grad_mode(grad_enabled);
    fn(chunk_begin, chunk_end);
  });
}

#ifdef _OPENMP
OneThreadScope::OneThreadScope() : threads_(omp_get_max_threads()) { omp_set_num_threads(1); }
OneThreadScope::~OneThreadScope() { omp_set_num_threads(threads_); }
#else
OneThreadScope::OneThreadScope() : threads_(1) {}
OneThreadScope::~OneThreadScope() = default;
#endif

}  // namespace sd

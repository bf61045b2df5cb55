#include "core/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>

namespace sd {

void set_compute_threads(int threads) {
  // Naming the GEMM library links core/onednn_sgemm.cpp (and its sgemm_) into every program that sets threads.
  static const char* const gemm = float32_gemm_library();
  (void)gemm;
  at::set_num_threads(std::max(1, threads));
  // Looked up at run time: the BLAS behind libblas.so.3 is whichever Debian alternative is installed.
  using SetThreads = void (*)(int);
  if (auto set_blas_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set_blas_threads(1);
}

}  // namespace sd

// Threads for kiln's own kernels. kiln uses OpenMP, the runtime oneDNN (Debian's libdnnl) is built
// with, so kiln's kernels and oneDNN's share one team of worker threads instead of oversubscribing
// the cores with two pools. libgomp's workers spin for a while (GOMP_SPINCOUNT, 300k iterations by
// default) before they sleep on a futex: back-to-back layers find them awake, an idle process does
// not burn the cores. OMP_WAIT_POLICY / GOMP_SPINCOUNT still override that, as documented by GCC.
//
// The thread count is set once per process (kiln --threads N, BuilderConfig/EngineConfig threads)
// and applies to every kernel, kiln's and oneDNN's alike.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kiln {

// The threads a parallel kernel uses (1 without OpenMP).
int max_threads();
// Sets the thread count for kernels started afterwards (<= 0: the machine's default).
void set_num_threads(int n);

// Caps the calling thread's kernels (kiln's and oneDNN's) at `n` threads while it lives, then
// restores the count. oneDNN sizes a primitive's thread partition when it is created and runs a
// one-thread partition inline, without a parallel region: tactics for layers too small to gain from
// threads create and run their primitives inside one of these (the tuner times them against the
// threaded ones).
class ThreadCapScope {
 public:
  explicit ThreadCapScope(int n) : saved_(max_threads()) {
#if defined(_OPENMP)
    if (n < saved_) omp_set_num_threads(n);
#else
    (void)n;
#endif
  }
  ~ThreadCapScope() {
#if defined(_OPENMP)
    if (max_threads() != saved_) omp_set_num_threads(saved_);
#endif
  }
  ThreadCapScope(const ThreadCapScope&) = delete;
  ThreadCapScope& operator=(const ThreadCapScope&) = delete;

 private:
  int saved_;
};

// Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items, one chunk
// per thread (static schedule: no atomics, deterministic partition). Runs inline when there is one
// thread, when n is small, or when called from inside another parallel region.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  int64_t nt = 1;
#if defined(_OPENMP)
  if (!omp_in_parallel())
    nt = std::min<int64_t>(max_threads(), (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1));
#endif
  if (nt <= 1) {
    fn(int64_t{0}, n);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel num_threads(static_cast <int>(nt))
  {
    int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    int64_t begin = n * t / T, end = n * (t + 1) / T;
    if (begin < end) fn(begin, end);
  }
#endif
}

}  // namespace kiln

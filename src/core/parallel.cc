#include "core/parallel.h"

#include <atomic>

#include "core/process_threads.h"

namespace kiln {

int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

namespace {
// The process-wide count (process_threads.h): the last set_num_threads() of any thread, and a
// generation each thread compares with the one it last applied.
std::atomic<int> g_threads{0};
std::atomic<int> g_generation{0};
thread_local int t_generation = 0;

#if defined(_OPENMP)
int default_threads() {
  static const int n = omp_get_max_threads();  // first called before any omp_set_num_threads
  return n;
}
// Read at load time, before any set_num_threads can change the calling thread's count.
const int kDefaultThreadsAtStart = default_threads();
#endif
}  // namespace

void set_num_threads(int n) {
#if defined(_OPENMP)
  omp_set_num_threads(n > 0 ? n : default_threads());
  g_threads.store(n);
  t_generation = g_generation.fetch_add(1) + 1;
#else
  (void)n;
#endif
}

void sync_process_threads() {
#if defined(_OPENMP)
  const int g = g_generation.load(std::memory_order_acquire);
  if (g == t_generation) return;
  t_generation = g;
  const int n = g_threads.load();
  omp_set_num_threads(n > 0 ? n : default_threads());
#endif
}

}  // namespace kiln

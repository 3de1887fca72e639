#include "core/parallel.h"

namespace kiln {

int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_num_threads(int n) {
#if defined(_OPENMP)
  static const int default_threads = omp_get_max_threads();
  omp_set_num_threads(n > 0 ? n : default_threads);
#else
  (void)n;
#endif
}

}  // namespace kiln

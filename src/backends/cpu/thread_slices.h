// Per-thread slices of a layer's workspace: a tactic whose threads each need scratch declares
// threads x slice bytes in workspace_bytes(threads), and each thread of a parallel_for takes the
// slice of its index in the team, instead of allocating inside run().
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/parallel.h"
#include "core/status.h"

namespace kiln::backends::cpu {

// The calling thread's index in parallel_for's team (0 when it runs inline).
inline size_t thread_index() {
#if defined(_OPENMP)
  return static_cast<size_t>(omp_get_thread_num());
#else
  return 0;
#endif
}

// This thread's slice of `slice_bytes` in a block of `threads` slices starting at `base`.
inline void* thread_slice(void* base, size_t slice_bytes, int threads) {
  const size_t t = thread_index();
  KILN_CHECK(t < static_cast<size_t>(threads > 0 ? threads : 1));
  return static_cast<uint8_t*>(base) + t * slice_bytes;
}

}  // namespace kiln::backends::cpu

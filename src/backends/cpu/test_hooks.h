// Test-only knobs of kiln's own CPU kernels: unit tests set them to force paths that only large
// production shapes take on their own. Nothing on the build or run path sets them (they replace the
// KILN_STREAM_BYTES / KILN_CONV1X1_TRANSPOSED / KILN_GEMM_KC/MC/NC environment variables), and
// kernels read them when a layer is prepared or a GEMM is run.
#pragma once

#include <cstdint>

namespace kiln::backends::cpu {

struct KernelTestHooks {
  int64_t stream_bytes = -1;    // >= 0: outputs above this many bytes use non-temporal stores (1x1 conv)
  int conv1x1_transposed = -1;  // 0 or 1: force the 1x1 conv's direct or transposed form
  int64_t gemm_kc = -1, gemm_mc = -1, gemm_nc = -1;  // >= 0: kiln's GEMM cache blocks (gemm_kernels.cc)
  // >= 0: Winograd layers with transformed weights above this many bytes take the chunked order, with
  // chunks of winograd_chunk_tiles tiles when > 0 (winograd_nchwc.cc)
  int64_t winograd_chunked_bytes = -1, winograd_chunk_tiles = -1;
};
KernelTestHooks& kernel_test_hooks();  // one per process; tests restore the defaults when done

}  // namespace kiln::backends::cpu

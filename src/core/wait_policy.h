// How libgomp's idle workers wait, and whether the cores were shared while kiln ran.
//
// libgomp's workers spin at every barrier and between parallel regions (GOMP_SPINCOUNT iterations,
// 300,000 by default: milliseconds) before they sleep on a futex. On an otherwise idle machine that
// is what makes back-to-back layers fast: sleeping workers (OMP_WAIT_POLICY=passive) cost 1.3-2x on
// small networks here, because each of a network's hundreds of parallel regions then waits for a
// worker to wake on an idle core. When other runnable threads share the cores, spinning is what
// loses: a worker spins on its core while the thread it waits for is descheduled, 2-2.5x slower than
// passive with three busy processes on two cores (bench/results/2026-12-02-s12-waitpolicy.txt).
// libgomp reads its policy once, when it is loaded, so kiln keeps libgomp's default (as ONNX Runtime
// keeps spinning by default) and says so: kiln bench reports the policy and the time its threads waited
// for a core, and warns when that shows the cores were shared.
#pragma once

#include <string>

namespace kiln {

// "libgomp's default (spin 300000 iterations, then sleep)", "OMP_WAIT_POLICY=passive", ...
std::string wait_policy_description();

// Seconds the process's threads have spent runnable but waiting for a core, summed over its threads
// (the scheduler's run_delay, /proc/self/task/*/schedstat; 0 where the kernel does not keep it).
double runqueue_wait_s();

// The share of `threads` threads' time over `seconds` that `waited_s` of run-queue wait is (0 when
// there is no time): kiln bench's and the tuner's measure of shared cores.
inline double runqueue_wait_share(double waited_s, double seconds, int threads) {
  const double thread_s = seconds * (threads > 0 ? threads : 1);
  return thread_s > 0 ? waited_s / thread_s : 0;
}

// Above this share of a measurement's thread time spent waiting for a core, kiln bench calls the
// cores shared (measured here on 2 cores, 2 threads: idle under 0.01; one other busy process 0.3).
inline constexpr double kSharedCoresWaitShare = 0.05;

}  // namespace kiln

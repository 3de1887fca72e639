#include "core/wait_policy.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace kiln {

std::string wait_policy_description() {
  std::string out;
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}) {
    if (const char* v = std::getenv(name)) {
      if (!out.empty()) out += ' ';
      out += std::string(name) + '=' + v;
    }
  }
  return out.empty() ? "libgomp's default (spin 300000 iterations, then sleep)" : out;
}

double runqueue_wait_s() {
  // schedstat: "<ns on the cpu> <ns waiting on a run queue> <timeslices>"
  double total_ns = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream f(task.path() / "schedstat");
    double on_cpu = 0, waiting = 0;
    if (f >> on_cpu >> waiting) total_ns += waiting;
  }
  return total_ns * 1e-9;
}

}  // namespace kiln

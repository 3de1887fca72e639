#include "tune/timer.h"

#include <chrono>

namespace kiln::tune {

Result<double> SteadyClockTimer::time_ms(const std::function<Status()>& run) {
  auto t0 = std::chrono::steady_clock::now();
  Status s = run();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) return s;
  return ms;
}

Timer* default_timer(DeviceKind device) {
  static SteadyClockTimer cpu;
  return device == DeviceKind::kCPU ? &cpu : nullptr;
}

}  // namespace kiln::tune

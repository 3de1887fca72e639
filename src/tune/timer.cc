#include "tune/timer.h"

#include <chrono>

#include "backends/device_runtime.h"

namespace kiln::tune {

Result<double> SteadyClockTimer::time_ms(const std::function<Status()>& run) {
  auto t0 = std::chrono::steady_clock::now();
  Status s = run();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) return s;
  return ms;
}

Result<double> DeviceEventTimer::time_ms(const std::function<Status()>& run) { return rt_.time_ms(run, nullptr); }

Timer* default_timer(DeviceKind device) {
  static SteadyClockTimer cpu;
  if (device == DeviceKind::kCPU) return &cpu;
  if (const backends::DeviceRuntime* rt = backends::device_runtime(device)) {
    static DeviceEventTimer cuda(*rt);
    return &cuda;
  }
  return nullptr;
}

}  // namespace kiln::tune

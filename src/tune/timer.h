// How the auto-tuner measures one run of a prepared layer, per device. The CPU's timer reads the
// host's steady clock around the call (a CPU kernel's run returns when its work is done); a CUDA
// timer (DeviceEventTimer) records events on the run's stream around the call and waits for the second,
// since the call returns once the work is queued. The tuner takes the timers of the devices it tunes for.
#pragma once

#include <functional>

#include "core/status.h"
#include "core/target.h"

namespace kiln::backends {
class DeviceRuntime;
}

namespace kiln::tune {

class Timer {
 public:
  virtual ~Timer() = default;
  virtual DeviceKind device() const = 0;
  // Runs `run` once; how long it took in milliseconds, or its error.
  virtual Result<double> time_ms(const std::function<Status()>& run) = 0;
};

// The CPU's timer: std::chrono::steady_clock around the call.
class SteadyClockTimer final : public Timer {
 public:
  DeviceKind device() const override { return DeviceKind::kCPU; }
  Result<double> time_ms(const std::function<Status()>& run) override;
};

// An accelerator's timer: events recorded on the default stream around the queued work
// (backends::DeviceRuntime::time_ms); the tuner runs device candidates on that stream.
class DeviceEventTimer final : public Timer {
 public:
  explicit DeviceEventTimer(const backends::DeviceRuntime& rt) : rt_(rt) {}
  DeviceKind device() const override { return DeviceKind::kCUDA; }
  Result<double> time_ms(const std::function<Status()>& run) override;

 private:
  const backends::DeviceRuntime& rt_;
};

// The timer this build has for `device` (shared, stateless), or nullptr when it has none.
Timer* default_timer(DeviceKind device);

}  // namespace kiln::tune

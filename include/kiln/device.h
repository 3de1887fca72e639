// kiln public API: where a layer runs. A header of its own (std only) because kiln's internal build
// target (src/core/target.h) uses the same type.
#pragma once

namespace kiln {

/// Where a layer runs and how its memory is addressed. Only the CPU exists today; CUDA slots in here.
enum class DeviceKind { kCPU, kCUDA };
struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;
  bool operator==(const Device&) const = default;
};

}  // namespace kiln

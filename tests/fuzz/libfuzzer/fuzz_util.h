// Shared by the libFuzzer targets: the input as a file (readers that take a path get a memfd, so
// no disk is touched and nothing is left behind), and the sanitizer-friendly allocation bound.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/checked_size.h"

// Each target is its own libFuzzer binary; fuzz_all.cc builds them into one binary as well (the
// target picked by $KILN_FUZZ_TARGET), for copying to a bigger machine to fuzz there.
#ifdef KILN_FUZZ_ALL
#define KILN_FUZZ_TARGET(name) int kiln_fuzz_##name(const uint8_t* data, size_t size)
#else
#define KILN_FUZZ_TARGET(name) extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
#endif

namespace kiln::fuzz {

// A memfd holding the input; path() is /proc/self/fd/N, a regular file for every reader.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) : fd_(::memfd_create("kiln-fuzz", MFD_CLOEXEC)) {
    size_t done = 0;
    while (fd_ >= 0 && done < size) {
      ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// Tensors a fuzzed file declares are bounded far below ASan's allocation limit (max_allocation_size_mb
// in scripts/fuzz.sh): a big declared tensor must be refused by kiln's own check, with a message.
inline void bound_allocations() {
  static bool done = [] {
    set_max_tensor_bytes(size_t{64} << 20);
    return true;
  }();
  (void)done;
}

}  // namespace kiln::fuzz

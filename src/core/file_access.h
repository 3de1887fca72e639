// Opening files that come from other people (models, their external data, inputs, engines, timing
// caches) without trusting them.
//
// - Never blocking: every open is O_NONBLOCK, then fstat decides. A FIFO nobody writes to would
//   block a plain open() forever; a FIFO, a device, a socket or a directory is a named error.
// - Confined: external data named by a model is opened relative to the model's folder and must
//   resolve inside it after following symlinks. The check is made on what was opened, never on a
//   path checked first and opened later (no race): openat2(RESOLVE_BENEATH) where the kernel has
//   it (Linux >= 5.6), else an openat() whose result is checked through /proc/self/fd against the
//   folder's own resolved path. `..` is fine while it stays inside; an absolute location is outside.
//   A hard link inside the folder is inside by definition: it is an entry of the folder, the kernel
//   cannot tell which name is "the original", and making one needs write access to the folder
//   (whoever has that can put any bytes there anyway).
#pragma once

#include <string>

#include "core/status.h"

namespace kiln {

// A file descriptor closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_ = -1;
};

struct OpenedFile {
  UniqueFd fd;
  size_t size = 0;  // from fstat
};

// Opens `path` read-only, non-blocking, and checks that it is a regular file. `what` names it in
// errors ("input file 'x.npy'"; empty: "'PATH'"). A missing file is kNotFound, a directory, FIFO,
// device or socket is `code`.
Result<OpenedFile> open_regular_file(const std::string& path, const std::string& what = "",
                                     ErrorCode code = ErrorCode::kInvalidArgument);

// Opens `location` (relative) inside the folder `dir`, as described above; `allow_outside` lifts the
// confinement (the --allow-external-data-outside option). Errors: kNotFound for a missing file,
// `code` for a location outside the folder or not a regular file.
Result<OpenedFile> open_inside(const std::string& dir, const std::string& location, bool allow_outside,
                               const std::string& what, ErrorCode code = ErrorCode::kInvalidModel);

// Reads exactly n bytes at `offset` (pread, EINTR retried); a short read is an error.
Status read_at(int fd, void* dst, size_t n, uint64_t offset, const std::string& what);

// Tests: force the /proc/self/fd check even where openat2 exists (true), or back to automatic.
void force_proc_fd_confinement_for_testing(bool on);

}  // namespace kiln

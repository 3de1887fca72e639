#include "core/file_access.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace kiln {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

std::atomic<bool> g_force_proc{false};

constexpr int kOpenFlags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// fstat and the type check shared by both opens.
Result<OpenedFile> checked(UniqueFd fd, const std::string& what, ErrorCode code) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return IOError(what, ": cannot stat it (", std::strerror(errno), ")");
  if (!S_ISREG(st.st_mode)) return Status(code, str_cat(what, " is ", kind_of(st.st_mode), ", not a regular file"));
  // Regular files ignore O_NONBLOCK, but clear it so later reads behave the ordinary way everywhere.
  int fl = ::fcntl(fd.get(), F_GETFL);
  if (fl >= 0) ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK);
  OpenedFile f;
  f.fd = std::move(fd);
  f.size = static_cast<size_t>(st.st_size);
  return f;
}

Status open_error(int err, const std::string& what, ErrorCode code) {
  if (err == ENOENT) return NotFound(what, " does not exist");
  if (err == ENOTDIR) return NotFound(what, " does not exist (a component of its path is not a folder)");
  if (err == EACCES || err == EPERM) return IOError(what, " cannot be opened (", std::strerror(err), ")");
  if (err == ELOOP) return Status(code, str_cat(what, " cannot be opened: too many levels of symbolic links"));
  return IOError(what, " cannot be opened (", std::strerror(err), ")");
}

// The path the kernel has for an open descriptor ("/a/b/c"), or "" when /proc is not there.
std::string fd_path(int fd) {
  std::string link = "/proc/self/fd/" + std::to_string(fd);
  char buf[4096];
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof buf) return "";
  return std::string(buf, static_cast<size_t>(n));
}

bool is_inside(const std::string& folder, const std::string& file) {
  if (folder == "/") return !file.empty() && file[0] == '/';
  return file.size() > folder.size() && file.compare(0, folder.size(), folder) == 0 && file[folder.size()] == '/';
}

}  // namespace

Result<OpenedFile> open_regular_file(const std::string& path, const std::string& what_in, ErrorCode code) {
  std::string what = what_in.empty() ? "'" + path + "'" : what_in;
  int fd;
  do {
    fd = ::open(path.c_str(), kOpenFlags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return open_error(errno, what, code);
  return checked(UniqueFd(fd), what, code);
}

Result<OpenedFile> open_inside(const std::string& dir, const std::string& location, bool allow_outside,
                               const std::string& what, ErrorCode code) {
  if (location.empty()) return Status(code, str_cat(what, " has an empty location"));
  if (location.find('\0') != std::string::npos) return Status(code, str_cat(what, " has a NUL byte in its location"));
  std::string folder = dir.empty() ? "." : dir;
  UniqueFd dfd(::open(folder.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) return open_error(errno, "the folder '" + folder + "' of " + what, code);
  auto outside = [&] {
    return Status(code, str_cat(what, ": location '", location, "' resolves outside the model's folder '", folder,
                                "' (symbolic links are followed; pass --allow-external-data-outside, or set "
                                "ImportOptions::allow_external_data_outside, to allow it)"));
  };
  int fd = -1;
  if (allow_outside) {
    fd = ::openat(dfd.get(), location.c_str(), kOpenFlags);
    if (fd < 0) return open_error(errno, what, code);
    return checked(UniqueFd(fd), what, code);
  }
  if (!g_force_proc.load(std::memory_order_relaxed)) {
    struct open_how how {};
    how.flags = static_cast<uint64_t>(kOpenFlags);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    do {
      fd = static_cast<int>(::syscall(SYS_openat2, dfd.get(), location.c_str(), &how, sizeof how));
    } while (fd < 0 && (errno == EINTR || errno == EAGAIN));
    if (fd >= 0) return checked(UniqueFd(fd), what, code);
    if (errno == EXDEV) return outside();
    if (errno != ENOSYS && errno != EPERM && errno != E2BIG && errno != EINVAL) return open_error(errno, what, code);
    // No openat2 here (old kernel, or a seccomp filter): the /proc check below.
  }
  if (location[0] == '/') return outside();
  do {
    fd = ::openat(dfd.get(), location.c_str(), kOpenFlags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return open_error(errno, what, code);
  UniqueFd f(fd);
  std::string folder_real = fd_path(dfd.get()), file_real = fd_path(f.get());
  if (folder_real.empty() || file_real.empty())
    return Status(code, str_cat(what, ": cannot check that location '", location,
                                "' stays inside the model's folder (no openat2 and no /proc); pass "
                                "--allow-external-data-outside to read it unchecked"));
  if (!is_inside(folder_real, file_real)) return outside();
  return checked(std::move(f), what, code);
}

Status read_at(int fd, void* dst, size_t n, uint64_t offset, const std::string& what) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return IOError(what, ": read failed (", std::strerror(errno), ")");
    if (r == 0) return IOError(what, ": the file ended early (truncated while being read?)");
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

void force_proc_fd_confinement_for_testing(bool on) { g_force_proc.store(on, std::memory_order_relaxed); }

}  // namespace kiln

#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kiln {

namespace {
// Closes a descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

Result<std::shared_ptr<const MappedFile>> MappedFile::open(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    if (errno == ENOENT) return NotFound("file '", path, "' does not exist");
    return IOError("cannot open '", path, "' (", std::strerror(errno), ")");
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return IOError("cannot stat '", path, "' (", std::strerror(errno), ")");
  if (S_ISDIR(st.st_mode)) return InvalidArgument("'", path, "' is a directory, not a file");
  std::shared_ptr<MappedFile> m(new MappedFile());
  if (S_ISREG(st.st_mode) && st.st_size > 0) {
    // MAP_POPULATE maps the whole file at once (page-cache pages, no copy) instead of one fault per page.
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE | MAP_POPULATE, f.fd, 0);
    if (p != MAP_FAILED) {
      m->data_ = static_cast<const char*>(p);
      m->size_ = static_cast<size_t>(st.st_size);
      m->mapped_ = true;
      return std::shared_ptr<const MappedFile>(std::move(m));
    }
  }
  // Not mappable (a pipe, /dev/stdin, a file system without mmap): read to the end.
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IOError("cannot read '", path, "' (", std::strerror(errno), ")");
    }
    if (n == 0) break;
    m->copy_.append(buf, static_cast<size_t>(n));
  }
  m->data_ = m->copy_.data();
  m->size_ = m->copy_.size();
  return std::shared_ptr<const MappedFile>(std::move(m));
}

MappedFile::~MappedFile() {
  if (mapped_) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace kiln

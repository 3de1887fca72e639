#include "core/mapped_file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kiln {

Result<std::shared_ptr<const MappedFile>> MappedFile::open(const std::string& path) { return open(path, Options{}); }

Result<std::shared_ptr<const MappedFile>> MappedFile::open(const std::string& path, const Options& opts) {
  KILN_ASSIGN_OR_RETURN(OpenedFile f, open_regular_file(path));
  return map(std::move(f), "'" + path + "'", opts);
}

Result<std::shared_ptr<const MappedFile>> MappedFile::map(OpenedFile f, const std::string& what, const Options& opts) {
  std::shared_ptr<MappedFile> m(new MappedFile());
  if (f.size > 0) {
    // MAP_POPULATE maps the whole file at once (page-cache pages, no copy) instead of one fault per page.
    int prot = PROT_READ | (opts.writable ? PROT_WRITE : 0);
    void* p = ::mmap(nullptr, f.size, prot, MAP_PRIVATE | (opts.populate ? MAP_POPULATE : 0), f.fd.get(), 0);
    if (p != MAP_FAILED) {
      m->data_ = static_cast<const char*>(p);
      m->size_ = f.size;
      m->mapped_ = true;
      return std::shared_ptr<const MappedFile>(std::move(m));
    }
    // Not mappable (a file system without mmap): read it, at the size fstat gave.
    m->copy_.resize(f.size);
    KILN_RETURN_IF_ERROR(read_at(f.fd.get(), m->copy_.data(), f.size, 0, what));
  }
  m->data_ = m->copy_.data();
  m->size_ = m->copy_.size();
  return std::shared_ptr<const MappedFile>(std::move(m));
}

MappedFile::~MappedFile() {
  if (mapped_) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace kiln

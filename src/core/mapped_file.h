// A file's bytes, read-only, without copying them: a regular file is memory-mapped (its pages come
// from the page cache on first touch; a model of hundreds of MB is not copied into the heap just to
// be parsed); one mmap refuses (some file systems) is read into memory. Anything that is not a
// regular file (a FIFO, a device, a directory) is a named error (core/file_access.h): kiln never
// blocks on opening a file. The bytes stay valid for the object's lifetime. Truncating a mapped
// file while it is mapped is the usual mmap hazard (SIGBUS on the lost pages), so kiln maps a model
// only while it imports it and copies what it keeps; engines are written by rename, never in place.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/file_access.h"
#include "core/status.h"

namespace kiln {

class MappedFile {
 public:
  // `populate`: map every page at once (MAP_POPULATE: right for a file that is read whole right
  // away; wrong for a file that may be refused after its first bytes, e.g. a 4 GiB sparse file).
  // `writable`: copy-on-write pages the caller may modify (never written back to the file).
  struct Options {
    bool populate = true;
    bool writable = false;
  };
  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path);
  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path, const Options& opts);
  static Result<std::shared_ptr<const MappedFile>> map(OpenedFile file, const std::string& what, const Options& opts);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view view() const { return {data_, size_}; }
  bool mapped() const { return mapped_; }  // false: read into memory

 private:
  MappedFile() = default;
  const char* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::string copy_;  // when not mapped
};

}  // namespace kiln

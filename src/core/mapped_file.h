// A file's bytes, read-only, without copying them: a regular file is memory-mapped (its pages come
// from the page cache on first touch; a model of hundreds of MB is not copied into the heap just to
// be parsed), anything else (a pipe, a file mmap refuses) is read into memory. The bytes stay valid
// for the object's lifetime. Truncating a mapped file while it is mapped is the usual mmap hazard
// (SIGBUS on the lost pages), so kiln maps a model only while it imports it and copies what it keeps.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln {

class MappedFile {
 public:
  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path);
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

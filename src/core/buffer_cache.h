// A cache of tensor buffers kept at their high-water capacity and reused from run to run: an engine's
// ExecutionContext installs its own around run() (engine/context.cc), so that the tensors its
// interpreter-loop layers create (reference kernels' outputs, data-dependent outputs such as
// NonMaxSuppression's or NonZero's, If/Loop results, copies of values leaving an arena) take a buffer
// that an earlier run used and released instead of a fresh allocation. A steady-state run of a model
// with data-dependent shapes then neither calls the allocator for tensor bytes nor touches new pages
// (large fresh allocations come from mmap and fault in every page they touch: the "shape work" cost).
//
// Every Tensor created on a thread while a BufferCacheScope is installed there takes its bytes from
// that cache (core/tensor.cc). A buffer is free again when no tensor holds it (the cache's own
// shared_ptr is its only owner), so a tensor that outlives the run (an output the caller keeps) keeps
// its buffer. Buffers are grouped by size class (exact multiples of 64 bytes up to 4 KiB, then four
// classes per power of two), so a request takes a buffer at most 25% larger than it asks for. Only
// the installing thread uses the cache (kernels' worker threads allocate as usual). The cache stops
// growing at kMaxBytes (then tensors allocate as without it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kiln {

class BufferCache {
 public:
  static constexpr size_t kMaxBytes = size_t{2} << 30;
  // A buffer of at least `bytes` (64-byte aligned) that no tensor holds, or a new one kept by the cache;
  // nullptr when the cache is full (the caller allocates a buffer of its own).
  std::shared_ptr<uint8_t[]> acquire(size_t bytes);

  // Frees the buffers no tensor holds (the context calls it when its input shapes change, so that a
  // service whose shapes vary keeps the high-water of one shape, not of every shape it has seen).
  void release_free();

  size_t buffers() const { return count_; }
  size_t bytes() const { return bytes_; }
  int64_t hits() const { return hits_; }      // requests served by a cached buffer
  int64_t misses() const { return misses_; }  // requests that allocated a new one

 private:
  struct SizeClass {
    std::vector<std::shared_ptr<uint8_t[]>> buffers;
    size_t next = 0;      // where the next search starts: buffers are mostly released in the order taken
    size_t capacity = 0;  // of each of its buffers
  };
  std::vector<SizeClass> classes_;
  size_t count_ = 0, bytes_ = 0;
  int64_t hits_ = 0, misses_ = 0;
};

// The cache tensors on this thread take their bytes from (nullptr: none installed).
BufferCache* current_buffer_cache();

// Installs `cache` on this thread for the scope's life (nested scopes restore the outer one).
class BufferCacheScope {
 public:
  explicit BufferCacheScope(BufferCache* cache);
  ~BufferCacheScope();
  BufferCacheScope(const BufferCacheScope&) = delete;
  BufferCacheScope& operator=(const BufferCacheScope&) = delete;

 private:
  BufferCache* previous_;
};

}  // namespace kiln

#include "core/buffer_cache.h"

#include <new>

namespace kiln {

namespace {
thread_local BufferCache* t_cache = nullptr;

// The size class of a request and the capacity every buffer of that class has.
std::pair<size_t, size_t> size_class(size_t bytes) {
  size_t n = bytes < 64 ? 64 : (bytes + 63) / 64 * 64;
  if (n <= 4096) return {n / 64 - 1, n};  // classes 0..63: exact multiples of 64 bytes
  // Above 4 KiB: four classes per power of two (capacity 2^k * {5,6,7,8}/4... rounded to 64 bytes).
  int k = 63 - __builtin_clzll(n - 1);  // 2^k < n <= 2^(k+1)
  size_t base = size_t{1} << k, step = base / 4;
  size_t sub = (n - base + step - 1) / step;  // 1..4
  size_t cap = base + sub * step;
  return {64 + static_cast<size_t>(k - 12) * 4 + (sub - 1), cap};
}
}  // namespace

std::shared_ptr<uint8_t[]> BufferCache::acquire(size_t bytes) {
  auto [index, capacity] = size_class(bytes);
  if (index >= classes_.size()) {
    if (bytes_ + capacity > kMaxBytes) return nullptr;
    classes_.resize(index + 1);
  }
  SizeClass& c = classes_[index];
  c.capacity = capacity;
  const size_t k = c.buffers.size();
  for (size_t j = 0; j < k; ++j) {
    size_t at = (c.next + j) % k;
    // Only the cache owns it: no tensor views it any more (nobody else can copy it meanwhile).
    if (c.buffers[at].use_count() == 1) {
      c.next = (at + 1) % k;
      ++hits_;
      return c.buffers[at];
    }
  }
  if (bytes_ + capacity > kMaxBytes) return nullptr;
  auto* p = static_cast<uint8_t*>(::operator new[](capacity, std::align_val_t(64), std::nothrow));
  if (!p) throw std::bad_alloc();
  c.buffers.emplace_back(p, [](uint8_t* q) { ::operator delete[](q, std::align_val_t(64)); });
  c.next = 0;
  ++count_, ++misses_;
  bytes_ += capacity;
  return c.buffers.back();
}

void BufferCache::release_free() {
  for (SizeClass& c : classes_) {
    size_t kept = 0;
    for (auto& b : c.buffers) {
      if (b.use_count() == 1) {  // only the cache holds it: freed
        --count_;
        bytes_ -= c.capacity;
        continue;
      }
      c.buffers[kept++] = std::move(b);
    }
    c.buffers.resize(kept);
    c.next = 0;
  }
}

BufferCache* current_buffer_cache() { return t_cache; }

BufferCacheScope::BufferCacheScope(BufferCache* cache) : previous_(t_cache) { t_cache = cache; }
BufferCacheScope::~BufferCacheScope() { t_cache = previous_; }

}  // namespace kiln

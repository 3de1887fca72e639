#include "core/buffer_cache.h"

#include <gtest/gtest.h>

#include "core/tensor.h"

namespace kiln {
namespace {

TEST(BufferCache, ReusesABufferOnceNoTensorHoldsIt) {
  BufferCache cache;
  const void* first = nullptr;
  {
    BufferCacheScope scope(&cache);
    Tensor a(DataType::kFloat32, {1000});
    first = a.raw();
    Tensor held(DataType::kFloat32, {1000});  // same class, another buffer: `a` still holds the first
    EXPECT_NE(held.raw(), first);
    a.data<float>()[7] = 3;
    a = Tensor();
    Tensor b(DataType::kFloat32, {995});  // the same class (4032 bytes): the released one, zeroed
    EXPECT_EQ(b.raw(), first);
    for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(b.data<float>()[i], 0.f);
  }
  EXPECT_EQ(cache.buffers(), 2u);
  EXPECT_EQ(cache.misses(), 2);
  EXPECT_EQ(cache.hits(), 1);
}

TEST(BufferCache, ATensorThatOutlivesTheScopeKeepsItsBytes) {
  BufferCache cache;
  Tensor kept, view;
  {
    BufferCacheScope scope(&cache);
    kept = Tensor(DataType::kInt64, {3, 5});
    kept.data<int64_t>()[14] = 42;
    view = kept.reshaped({15});  // shares the buffer: it is not free while either lives
  }
  kept = Tensor();
  BufferCacheScope scope(&cache);
  Tensor other(DataType::kInt64, {15});
  EXPECT_NE(other.raw(), view.raw());
  EXPECT_EQ(view.data<int64_t>()[14], 42);
}

TEST(BufferCache, SizeClassesHoldTheRequestAndStayClose) {
  BufferCache cache;
  BufferCacheScope scope(&cache);
  size_t expect_bytes = 0;
  for (size_t n : {1u, 63u, 64u, 65u, 4095u, 4096u, 4097u, 5121u, 100000u, 1u << 20, (1u << 20) + 1}) {
    Tensor t(DataType::kUInt8, {static_cast<int64_t>(n)});
    ASSERT_NE(t.raw(), nullptr);
    t.data<uint8_t>()[n - 1] = 1;  // the last byte is inside the buffer (ASan would say otherwise)
    expect_bytes += n;
  }
  // Each tensor died before the next: a class is allocated once per distinct class asked for, with a
  // capacity at most 25% above the request past 4 KiB (and up to 63 bytes of rounding below).
  EXPECT_LE(cache.bytes(), expect_bytes * 5 / 4 + 64 * 11);
}

TEST(BufferCache, ReleaseFreeKeepsTheBuffersTensorsHold) {
  BufferCache cache;
  Tensor held;
  {
    BufferCacheScope scope(&cache);
    held = Tensor(DataType::kFloat32, {5000});
    Tensor gone(DataType::kFloat32, {5000});
    Tensor small(DataType::kInt64, {3});
  }
  EXPECT_EQ(cache.buffers(), 3u);
  const size_t before = cache.bytes();
  cache.release_free();
  EXPECT_EQ(cache.buffers(), 1u);
  EXPECT_LT(cache.bytes(), before);
  EXPECT_GE(cache.bytes(), held.nbytes());
  held.data<float>()[4999] = 1;  // still its own
  held = Tensor();
  cache.release_free();
  EXPECT_EQ(cache.buffers(), 0u);
  EXPECT_EQ(cache.bytes(), 0u);
}

TEST(BufferCache, WithoutAScopeTensorsAllocateAsBefore) {
  BufferCache cache;
  { Tensor t(DataType::kFloat32, {100}); }
  EXPECT_EQ(cache.buffers(), 0u);
  EXPECT_EQ(current_buffer_cache(), nullptr);
  {
    BufferCacheScope outer(&cache);
    BufferCache inner_cache;
    {
      BufferCacheScope inner(&inner_cache);
      EXPECT_EQ(current_buffer_cache(), &inner_cache);
    }
    EXPECT_EQ(current_buffer_cache(), &cache);
  }
  EXPECT_EQ(current_buffer_cache(), nullptr);
}

}  // namespace
}  // namespace kiln

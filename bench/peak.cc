// The machine's arithmetic peak, measured: AVX-512 VNNI (vpdpbusd, 64 u8 x s8 multiply-adds per
// instruction), AVX-512 BF16 (vdpbf16ps, 32 bf16 multiply-adds) and FP32 FMA (vfmadd231ps, 16), each
// on 12 independent register chains per thread, on 1 and N threads. Speed figures in bench/ are
// judged against these (FLOPs = 2 x multiply-adds).
//
//   g++ -O3 -mavx512f -mavx512bw -mavx512vnni -mavx512bf16 bench/peak.cc -o /tmp/peak -lpthread && /tmp/peak 2
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {
constexpr int kChains = 12;
constexpr long kIters = 40'000'000;

template <typename Acc, typename Step>
double rate(Acc init, Step step, double macs_per_op) {
  Acc acc[kChains];
  for (auto& a : acc) a = init;
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kIters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kChains; ++k) acc[k] = step(acc[k]);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Every chain's result is read, so none can be dropped.
  unsigned char bytes[sizeof(acc)];
  std::memcpy(bytes, acc, sizeof(acc));
  unsigned sum = 0;
  for (unsigned char b : bytes) sum += b;
  volatile unsigned sink = sum;
  (void)sink;
  return kIters * kChains * macs_per_op / s;
}

struct Rates {
  double vnni, bf16, fma;
};

Rates one_thread() {
  const __m512i a8 = _mm512_set1_epi8(3), b8 = _mm512_set1_epi8(5);
  const __m512bh a16 = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1.f), _mm512_set1_ps(1.f));
  const __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
  Rates r;
  r.vnni = rate(
      _mm512_set1_epi32(1), [&](__m512i x) { return _mm512_dpbusd_epi32(x, a8, b8); }, 64);
  r.bf16 = rate(
      _mm512_set1_ps(1.f), [&](__m512 x) { return _mm512_dpbf16_ps(x, a16, a16); }, 32);
  r.fma = rate(
      _mm512_set1_ps(1.f), [&](__m512 x) { return _mm512_fmadd_ps(x, a, b); }, 16);
  return r;
}
}  // namespace

int main(int argc, char** argv) {
  int max_threads = argc > 1 ? std::atoi(argv[1]) : static_cast<int>(std::thread::hardware_concurrency());
  for (int threads = 1; threads <= max_threads; threads *= 2) {
    std::vector<Rates> r(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { r[t] = one_thread(); });
    for (auto& t : pool) t.join();
    Rates sum{0, 0, 0};
    for (const auto& x : r) sum.vnni += x.vnni, sum.bf16 += x.bf16, sum.fma += x.fma;
    std::printf("%d thread(s): int8 VNNI %.0f GMAC/s, bf16 %.0f GMAC/s, fp32 FMA %.0f GMAC/s (%.0f GFLOP/s)\n", threads,
                sum.vnni / 1e9, sum.bf16 / 1e9, sum.fma / 1e9, 2 * sum.fma / 1e9);
    if (threads * 2 > max_threads && threads != max_threads) threads = max_threads / 2;
  }
}

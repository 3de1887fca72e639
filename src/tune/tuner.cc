#include "tune/tuner.h"

#include <unistd.h>
#include <algorithm>
#include <exception>
#include <random>
#include <stdexcept>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "backends/device_runtime.h"
#include "core/parallel.h"
#include "tune/layer_key.h"

namespace kiln::tune {

namespace {

std::string what_of(const std::exception& e) { return std::string("exception: ") + e.what(); }

// Writes back and evicts [p, p + n) from every cache level (x86's clflush; elsewhere nothing).
void flush_from_caches(const void* p, size_t n) {
#if defined(__x86_64__) || defined(__i386__)
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end; a += 64)
    _mm_clflush(reinterpret_cast<const void*>(a));
  _mm_mfence();
#else
  (void)p, (void)n;
#endif
}

size_t total_bytes(const std::vector<std::pair<const void*, size_t>>& spans) {
  size_t n = 0;
  for (const auto& [ptr, bytes] : spans) n += ptr ? bytes : 0;
  return n;
}

}  // namespace

size_t cold_weight_bytes() {
  static const size_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<size_t>(l2) : size_t{1} << 20;
  }();
  return bytes;
}

Tensor random_activation(DataType dtype, const Dims& shape, std::mt19937_64& rng) {
  Tensor x(dtype, shape);
  if (dtype == DataType::kFloat32) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    float* p = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = u(rng);
  } else if (dtype_is_float(dtype) && dtype_is_builtin(dtype)) {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (int64_t i = 0; i < x.numel(); ++i) x.set_f64(i, u(rng));
  }
  return x;
}

const char* state_name(CandidateResult::State s) {
  switch (s) {
    case CandidateResult::State::kTimed: return "timed";
    case CandidateResult::State::kPrepared: return "prepared";
    case CandidateResult::State::kFailed: return "failed";
    case CandidateResult::State::kUnproven: return "unproven";
  }
  return "?";
}

bool disturbed(const CandidateResult& c) {
  return c.state == CandidateResult::State::kTimed && c.runs > 1 && c.min_ms > 0 && c.ms > 1.5 * c.min_ms;
}

bool timings_unreliable(int disturbed, int timed) { return disturbed >= 2 && disturbed * 10 >= timed; }

Tuner::Tuner(TimingCache& cache, TuneOptions opts, std::vector<Timer*> timers)
    : cache_(cache), opts_(opts), timers_(std::move(timers)), threads_(kiln::max_threads()) {
  if (timers_.empty())
    for (DeviceKind d : {DeviceKind::kCPU, DeviceKind::kCUDA})
      if (Timer* t = default_timer(d)) timers_.push_back(t);
}

Timer* Tuner::timer_for(DeviceKind device) const {
  for (Timer* t : timers_)
    if (t->device() == device) return t;
  return nullptr;
}

LayerTuning Tuner::first_viable(const std::vector<const backends::Tactic*>& candidates,
                                const backends::LayerSignature& sig) {
  LayerTuning r;
  for (const backends::Tactic* t : candidates) {
    CandidateResult c;
    c.tactic = t->name();
    c.revision = t->revision();
    try {
      auto prepared = t->prepare(sig);
      ++r.prepared;
      if (prepared.ok())
        c.state = CandidateResult::State::kPrepared;
      else
        c.error = "cannot prepare: " + prepared.status().message();
    } catch (const std::exception& e) {
      c.error = "cannot prepare: " + what_of(e);
    }
    r.candidates.push_back(std::move(c));
    if (r.candidates.back().state == CandidateResult::State::kPrepared) {
      r.kernel = t->name();
      break;
    }
  }
  return r;
}

std::string Tuner::key(const backends::LayerSignature& sig) const {
  return "threads=" + std::to_string(threads_) + "|" + layer_key(sig);
}

LayerTuning Tuner::tune(const backends::LayerSignature& sig, const std::vector<const backends::Tactic*>& candidates,
                        bool force_timing) {
  using State = CandidateResult::State;
  LayerTuning r;
  if (candidates.empty()) return r;
  if (!sig.fully_known()) {  // data-dependent shapes: nothing can be prepared before run time
    for (const backends::Tactic* t : candidates) {
      CandidateResult c;
      c.tactic = t->name();
      c.state = State::kUnproven;
      r.candidates.push_back(std::move(c));
    }
    r.kernel = candidates[0]->name();
    return r;
  }
  if (opts_.first_viable) return first_viable(candidates, sig);
  const std::string k = key(sig);
  const bool timing = candidates.size() > 1 || force_timing;
  Timer* timer = timing ? timer_for(sig.device.kind) : nullptr;
  std::vector<Tensor> inputs;  // made on first use, shared by the candidates
  std::vector<const Tensor*> in_ptrs;
  // An accelerator's candidates run on its default stream, on device copies of the inputs (constants
  // stay on the host: device tactics copy their weights at prepare time), into device outputs.
  const backends::DeviceRuntime* rt =
      sig.device.kind == DeviceKind::kCPU ? nullptr : backends::device_runtime(sig.device.kind);
  const int dev = sig.device.index;
  std::string device_error;
  auto make_inputs = [&] {
    if (!in_ptrs.empty() || sig.inputs.empty()) return;
    std::mt19937_64 rng(opts_.seed);
    inputs.resize(sig.inputs.size());
    for (size_t i = 0; i < sig.inputs.size(); ++i) {
      const backends::TensorSig& t = sig.inputs[i];
      if (!t.present)
        in_ptrs.push_back(nullptr);
      else if (t.constant)
        in_ptrs.push_back(t.constant);
      else {
        inputs[i] = random_activation(t.dtype, t.shape, rng);
        if (rt) {
          auto d = backends::to_device(*rt, dev, inputs[i], nullptr);
          if (d.ok())
            inputs[i] = std::move(d).value();
          else
            device_error = d.status().message();
        }
        in_ptrs.push_back(&inputs[i]);
      }
    }
  };

  // Prepared candidates being timed: their runs are interleaved (A B A B ...), so that a change in
  // the machine's load while the layer is timed (other processes, frequency) hits every candidate alike.
  struct Timing {
    size_t result;  // index into r.candidates
    std::shared_ptr<const backends::PreparedLayer> prepared;
    std::vector<std::pair<const void*, size_t>> constants;  // prepared->constant_memory(), asked once
    std::vector<Tensor> outs;
    std::vector<Tensor*> out_ptrs;
    Tensor workspace;  // workspace_bytes() of the candidate, made once: timed runs allocate nothing
    backends::RunContext ctx;
    std::vector<double> times;
    double total_ms = 0;
    bool done = false;
    std::string error;
  };
  std::vector<Timing> timings;
  auto fail = [&](CandidateResult& c, std::string why) {
    c.state = State::kFailed;
    c.error = std::move(why);
    cache_.put(k, c.tactic, {CacheEntry::State::kFailed, 0, 0, 0, c.error, c.revision});
  };

  for (const backends::Tactic* t : candidates) {
    r.candidates.emplace_back();
    CandidateResult& c = r.candidates.back();
    c.tactic = t->name();
    c.revision = t->revision();
    if (const CacheEntry* e = cache_.find(k, c.tactic, c.revision);
        e && (e->state != CacheEntry::State::kPrepared || !timing)) {  // a prepared-only entry lacks a time
      c.from_cache = true;
      c.state = e->state == CacheEntry::State::kTimed    ? State::kTimed
                : e->state == CacheEntry::State::kFailed ? State::kFailed
                                                         : State::kPrepared;
      c.ms = e->ms, c.runs = e->runs, c.min_ms = e->min_ms, c.error = e->error;
      ++r.cache_hits;
      continue;
    }
    std::shared_ptr<const backends::PreparedLayer> p;
    try {
      auto prepared = t->prepare(sig);
      ++r.prepared;
      if (!prepared.ok()) {
        fail(c, "cannot prepare: " + prepared.status().message());
        continue;
      }
      p = std::move(prepared).value();
    } catch (const std::exception& e) {
      fail(c, "cannot prepare: " + what_of(e));
      continue;
    }
    if (!timing) {
      c.state = State::kPrepared;
      cache_.put(k, c.tactic, {CacheEntry::State::kPrepared, 0, 0, 0, "", c.revision});
      continue;
    }
    Timing tm;
    tm.result = r.candidates.size() - 1;
    tm.prepared = std::move(p);
    timings.push_back(std::move(tm));
  }

  if (!timings.empty()) make_inputs();
  // Weights past L2: a network run reads them from memory (each layer's were last read a whole run
  // ago, the other layers' since), while repeated runs of one layer find them in L2/L3. When every
  // candidate reports its constant memory and each has more than L2 holds, each run starts with it
  // flushed out of the caches, so that a kernel that streams its weights is told apart from one that
  // waits on them (vit_b_32 at batch 1: its GEMMs' weights are 7-9 MB a layer).
  for (Timing& tm : timings) tm.constants = tm.prepared->constant_memory();
  r.cold = !timings.empty() && std::all_of(timings.begin(), timings.end(), [](const Timing& tm) {
    return total_bytes(tm.constants) > cold_weight_bytes();
  });
  // One run of a candidate; false (with its error set) when it failed.
  auto run_once = [&](Timing& tm, bool measured) {
    try {
      if (!device_error.empty()) {
        tm.error = device_error;
      } else if (!timer) {
        tm.error = "no timer for device " + backends::device_name(sig.device);
      } else {
        if (r.cold)
          for (const auto& [ptr, bytes] : tm.constants)
            if (ptr) flush_from_caches(ptr, bytes);
        Result<double> ms = timer->time_ms([&] { return tm.prepared->run(tm.ctx, in_ptrs, tm.out_ptrs); });
        if (!ms.ok())
          tm.error = ms.status().message();
        else if (measured)
          tm.times.push_back(ms.value()), tm.total_ms += ms.value();
      }
    } catch (const std::exception& e) {
      tm.error = what_of(e);
    }
    if (!tm.error.empty()) tm.done = true;
  };
  for (Timing& tm : timings) {
    try {
      std::vector<Dims> shapes = tm.prepared->output_shapes();
      std::vector<DataType> dtypes = tm.prepared->output_dtypes();
      for (size_t o = 0; o < shapes.size(); ++o) {
        // A dim of -1: the shape depends on the data, the tactic allocates the output (engine/executor.h).
        bool known = std::all_of(shapes[o].begin(), shapes[o].end(), [](int64_t d) { return d >= 0; });
        DataType dt = o < dtypes.size() ? dtypes[o] : DataType::kFloat32;
        if (known && rt) {
          auto d = backends::device_tensor(*rt, dev, dt, shapes[o]);
          if (!d.ok()) throw std::runtime_error(d.status().message());
          tm.outs.push_back(std::move(d).value());
        } else {
          tm.outs.push_back(known ? Tensor(dt, shapes[o]) : Tensor());
        }
      }
      for (auto& o : tm.outs) tm.out_ptrs.push_back(&o);
      tm.ctx.threads = std::max(1, kiln::max_threads());
      if (size_t ws = tm.prepared->workspace_bytes(tm.ctx.threads)) {
        if (rt) {
          auto d = backends::device_tensor(*rt, dev, DataType::kUInt8, {static_cast<int64_t>(ws)});
          if (!d.ok()) throw std::runtime_error(d.status().message());
          tm.workspace = std::move(d).value();
          if (Status f = rt->fill(tm.workspace.raw(), 0xFF, ws, nullptr); !f.ok())
            throw std::runtime_error(f.message());
        } else {
          tm.workspace = Tensor::uninitialized(DataType::kUInt8, {static_cast<int64_t>(ws)});
          backends::poison_workspace(tm.workspace.raw(), ws);
        }
        tm.ctx.workspace = tm.workspace.raw();
        tm.ctx.workspace_bytes = ws;
      }
    } catch (const std::exception& e) {
      tm.error = what_of(e);
      tm.done = true;
    }
    for (int w = 0; w < opts_.warmup_runs && !tm.done; ++w) run_once(tm, false);
  }
  for (bool any = true; any;) {
    any = false;
    for (Timing& tm : timings) {
      if (tm.done) continue;
      run_once(tm, true);
      int n = static_cast<int>(tm.times.size());
      tm.done |= n >= opts_.max_runs || tm.total_ms >= opts_.hard_limit_ms ||
                 (n >= opts_.min_runs && tm.total_ms >= opts_.max_ms_per_candidate);
      any |= !tm.done;
    }
  }
  for (Timing& tm : timings) {
    CandidateResult& c = r.candidates[tm.result];
    if (!tm.error.empty() || tm.times.empty()) {
      fail(c, "cannot run: " + (tm.error.empty() ? std::string("no run measured") : tm.error));
      continue;
    }
    std::sort(tm.times.begin(), tm.times.end());
    c.ms = tm.times[tm.times.size() / 2];
    c.min_ms = tm.times.front();
    c.runs = static_cast<int>(tm.times.size());
    c.state = State::kTimed;
    ++r.timed;
    cache_.put(k, c.tactic, {CacheEntry::State::kTimed, c.ms, c.runs, c.min_ms, "", c.revision});
  }
  timings.clear();  // the prepared layers and their outputs go now, not with the inputs

  // The lowest median wins (ties: the earlier in priority order).
  const CandidateResult* best = nullptr;
  for (const auto& c : r.candidates)
    if (c.state == State::kTimed && (!best || best->state != State::kTimed || c.ms < best->ms))
      best = &c;
    else if (c.state == State::kPrepared && !best)
      best = &c;
  if (best) r.kernel = best->tactic;
  return r;
}

}  // namespace kiln::tune

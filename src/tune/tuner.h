// The auto-tuner: picks one layer's kernel by timing its candidate tactics on the layer's actual
// shapes (TensorRT's tactic selection), with a timing cache so that later builds time nothing.
//
// For each candidate, in priority order: a cached result is taken as is (no prepare, no timing);
// otherwise the tactic is prepared (weights reordered/packed) on the signature's concrete shapes and,
// when the layer has more than one viable candidate, run on random inputs of the right dtypes (the
// weights are the real constants): warm-up, then runs until `max_runs` or `max_ms_per_candidate`,
// the median kept. A layer with one viable candidate is only prepared (that proves it can run).
// Candidates whose weights exceed L2 are timed with the weights flushed from the caches before each
// run (LayerTuning::cold), as a network run reads them.
// Failures to prepare or run are recorded with their reason, in the result and in the cache.
// The fastest viable candidate wins; the reference kernel only when none is viable.
//
// Timing happens at the current thread count (kiln::max_threads()), part of every cache key, with the
// timer of the layer's device (tune/timer.h: the CPU's steady clock; a CUDA one will use events).
#pragma once

#include <random>
#include <string>
#include <vector>

#include "backends/tactic.h"
#include "tune/timer.h"
#include "tune/timing_cache.h"

namespace kiln::tune {

struct TuneOptions {
  int warmup_runs = 1;
  int min_runs = 3;                  // measured runs before the time budget may stop the timing
  int max_runs = 20;                 // measured runs at most
  double max_ms_per_candidate = 50;  // measured time after which timing stops (once min_runs ran)
  double hard_limit_ms = 200;        // ... and after which it stops even before min_runs (slow layers)
  uint64_t seed = 0x6b696c6e;        // random inputs
  // No timing at all: each layer takes the first candidate in priority order that prepares, whatever a
  // timing cache holds (none is read or written), so that every build on one machine chooses the same
  // kernels (BuilderConfig::deterministic_tactics; INT8 calibration's FP32 engine).
  bool first_viable = false;
};

struct CandidateResult {
  enum class State {
    kTimed,     // prepared and timed now (or, with from_cache, earlier)
    kPrepared,  // prepared, not timed: the layer's only viable candidate
    kFailed,    // cannot prepare or run: `error` says why
    kUnproven,  // shapes unknown at build time: neither prepared nor timed (taken on trust)
  };
  std::string tactic;
  State state = State::kFailed;
  double ms = 0;      // kTimed: median
  int runs = 0;       // kTimed: runs measured
  double min_ms = 0;  // kTimed: fastest run
  bool from_cache = false;
  std::string error;
  int revision = 1;  // the tactic's revision(): the cache entry's
};

struct LayerTuning {
  std::string kernel = "reference";  // the winner
  std::vector<CandidateResult> candidates;
  int timed = 0;       // candidates timed now
  int prepared = 0;    // tactics prepared now (timed ones included)
  int cache_hits = 0;  // candidates answered by the cache
  bool cold = false;   // the candidates were timed with their weights flushed from the caches (below)
};

// Constant bytes (PreparedLayer::constant_memory) past which a layer's candidates are timed with
// their weights out of the caches, when every one reports them: the L2 size of this CPU (1 MiB when
// unknown).
size_t cold_weight_bytes();

const char* state_name(CandidateResult::State s);  // "timed", "prepared", "failed", "unproven"

// An activation for timing: floats uniform in [-1, 1]; integers and booleans zero (valid as indices
// and as masks whatever the shapes). The tuner's inputs; the builder's estimate run (engine/) too.
Tensor random_activation(DataType dtype, const Dims& shape, std::mt19937_64& rng);

// A timing that a busy machine disturbed: its median run more than 1.5x its fastest. On an idle 2-core
// VM every resnet50 candidate stayed under 1.3x; with two busy processes on the cores a quarter of
// them went past 1.5x (up to 13x: a worker thread waiting a scheduler tick for a core).
bool disturbed(const CandidateResult& c);
// Whether a build's fresh timings as a whole are not to be trusted: at least 2 of them disturbed and
// at least a tenth. The builder then warns: the kernels chosen may not be the fastest.
bool timings_unreliable(int disturbed, int timed);

class Tuner {
 public:
  // `cache` receives what is learned and answers what is known; it outlives the tuner. `timers`: one
  // per device the layers may be on (tune/timer.h; they outlive the tuner); empty: this build's CPU
  // timer. A layer on a device without a timer can only be prepared: timing its candidates fails.
  Tuner(TimingCache& cache, TuneOptions opts = {}, std::vector<Timer*> timers = {});

  // Chooses among `candidates` (tactics supporting `sig`, in priority order). Shapes of `sig` may be
  // partly unknown (data-dependent): then nothing can run and the first candidate is taken unproven.
  // `force_timing`: time even a single candidate (its layer has candidates in other precisions,
  // tuned with signatures of their own: engine/tactics.h choose_tactic). Under first_viable nothing is
  // timed: the candidates are prepared in order up to the first that prepares, the winner.
  LayerTuning tune(const backends::LayerSignature& sig, const std::vector<const backends::Tactic*>& candidates,
                   bool force_timing = false);

  int threads() const { return threads_; }
  // The cache key of a layer at this tuner's thread count.
  std::string key(const backends::LayerSignature& sig) const;

 private:
  Timer* timer_for(DeviceKind device) const;
  LayerTuning first_viable(const std::vector<const backends::Tactic*>& candidates, const backends::LayerSignature& sig);
  TimingCache& cache_;
  TuneOptions opts_;
  std::vector<Timer*> timers_;
  int threads_;
};

}  // namespace kiln::tune

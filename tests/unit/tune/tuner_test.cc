// The auto-tuner's selection logic with fake tactics (a slow one sleeps), its use of the timing cache,
// and the layer key.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "backends/device_runtime.h"
#include "tune/layer_key.h"
#include "tune/tuner.h"

namespace kiln::tune {
namespace {

using backends::LayerSignature;
using backends::PreparedLayer;
using backends::Tactic;

const CacheIdentity kHere{"0.1.0", "Test CPU | avx2"};

// Relu-like fake: copies its input; `sleep_ms` per run; may refuse to prepare or to run.
class FakeTactic : public Tactic {
 public:
  FakeTactic(std::string name, double sleep_ms, bool prepares = true, bool runs = true)
      : name_(std::move(name)), sleep_ms_(sleep_ms), prepares_(prepares), runs_(runs) {}
  std::string name() const override { return name_; }
  backends::TacticInfo info() const override { return backends::TacticInfo::cpu_f32(); }
  int revision() const override { return revision_; }
  int revision_ = 1;
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Relu"}}; }
  std::string why_unsupported(const LayerSignature&) const override { return ""; }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    ++prepared;
    if (!prepares_) return Unsupported(name_, ": no implementation for these shapes");
    return std::unique_ptr<PreparedLayer>(new Prepared(this, sig.inputs[0].shape));
  }
  mutable std::atomic<int> prepared{0}, ran{0};
  std::vector<float> weights;  // reported as the prepared layer's constant memory when not empty

 private:
  struct Prepared : PreparedLayer {
    Prepared(const FakeTactic* t, Dims s) : t(t), shape(std::move(s)) {}
    std::vector<Dims> output_shapes() const override { return {shape}; }
    std::vector<std::pair<const void*, size_t>> constant_memory() const override {
      if (t->weights.empty()) return {};
      return {{t->weights.data(), t->weights.size() * sizeof(float)}};
    }
    Status run(const backends::RunContext&, const std::vector<const Tensor*>& in,
               const std::vector<Tensor*>& out) const override {
      ++t->ran;
      if (!t->runs_) return Internal("fake failure at run time");
      if (in[0]->shape() != shape || out[0]->shape() != shape) return Internal("wrong shapes");
      if (t->sleep_ms_ > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(t->sleep_ms_));
      return Status::Ok();
    }
    const FakeTactic* t;
    Dims shape;
  };
  std::string name_;
  double sleep_ms_;
  bool prepares_, runs_;
};

struct Layer {
  ir::Node node;
  LayerSignature sig;
  explicit Layer(Dims shape = {2, 8}) {
    node.name = "relu_1";
    node.op_type = "Relu";
    node.opset = 14;
    node.inputs = {"x"};
    node.outputs = {"y"};
    sig.node = &node;
    backends::TensorSig x;
    x.present = true;
    x.dtype = DataType::kFloat32;
    x.shape = std::move(shape);
    sig.inputs = {x};
    sig.outputs.resize(1);
  }
  Layer(const Layer&) = delete;
};

const CandidateResult* find(const LayerTuning& t, const std::string& tactic) {
  for (const auto& c : t.candidates)
    if (c.tactic == tactic) return &c;
  return nullptr;
}

TEST(Tuner, PicksTheFasterOfTwo) {
  FakeTactic slow("slow", 3), fast("fast", 0);
  Layer l;
  for (auto order : {std::vector<const Tactic*>{&slow, &fast}, std::vector<const Tactic*>{&fast, &slow}}) {
    TimingCache fresh(kHere);
    Tuner t(fresh);
    LayerTuning r = t.tune(l.sig, order);
    EXPECT_EQ(r.kernel, "fast");
    ASSERT_EQ(r.candidates.size(), 2u);
    EXPECT_EQ(r.timed, 2);
    EXPECT_EQ(r.cache_hits, 0);
    const CandidateResult* s = find(r, "slow");
    const CandidateResult* f = find(r, "fast");
    ASSERT_TRUE(s && f);
    EXPECT_EQ(s->state, CandidateResult::State::kTimed);
    EXPECT_GE(s->ms, 2.9);
    EXPECT_LT(f->ms, s->ms);
    EXPECT_GE(s->runs, 3);
    EXPECT_LE(s->runs, 20);  // bounded: ~50 ms of 3 ms runs
    EXPECT_LE(f->runs, 20);
  }
}

// Candidates whose weights all exceed L2 are timed with them flushed from the caches (as a network
// run reads them); one that does not report its weights, or small weights, keeps the timing warm.
// Flushing keeps the values.
TEST(Tuner, BigWeightsAreTimedCold) {
  const size_t big = cold_weight_bytes() / sizeof(float) + 1024, small = 1024;
  auto tune = [](FakeTactic& a, FakeTactic& b) {
    Layer l;
    TimingCache fresh(kHere);
    Tuner t(fresh);
    return t.tune(l.sig, {&a, &b});
  };
  FakeTactic a("a", 0), b("b", 0);
  a.weights.assign(big, 1.5f), b.weights.assign(big, -2.f);
  LayerTuning r = tune(a, b);
  EXPECT_TRUE(r.cold);
  EXPECT_EQ(r.timed, 2);
  EXPECT_TRUE(std::all_of(a.weights.begin(), a.weights.end(), [](float v) { return v == 1.5f; }));
  EXPECT_TRUE(std::all_of(b.weights.begin(), b.weights.end(), [](float v) { return v == -2.f; }));
  b.weights.assign(small, 0.f);
  EXPECT_FALSE(tune(a, b).cold) << "one candidate's weights fit in L2";
  b.weights.clear();
  EXPECT_FALSE(tune(a, b).cold) << "one candidate does not report its weights";
}

TEST(Tuner, SingleCandidateIsPreparedNotTimed) {
  FakeTactic only("only", 0);
  TimingCache cache(kHere);
  Layer l;
  LayerTuning r = Tuner(cache).tune(l.sig, {&only});
  EXPECT_EQ(r.kernel, "only");
  EXPECT_EQ(only.prepared, 1);
  EXPECT_EQ(only.ran, 0);
  EXPECT_EQ(r.timed, 0);
  ASSERT_EQ(r.candidates.size(), 1u);
  EXPECT_EQ(r.candidates[0].state, CandidateResult::State::kPrepared);
}

TEST(Tuner, FailuresAreRecordedWithTheReasonAndTheOthersCompete) {
  FakeTactic noprep("noprep", 0, /*prepares=*/false), norun("norun", 0, true, /*runs=*/false), ok("ok", 1);
  TimingCache cache(kHere);
  Layer l;
  LayerTuning r = Tuner(cache).tune(l.sig, {&noprep, &norun, &ok});
  EXPECT_EQ(r.kernel, "ok");
  EXPECT_EQ(find(r, "noprep")->state, CandidateResult::State::kFailed);
  EXPECT_NE(find(r, "noprep")->error.find("no implementation"), std::string::npos) << find(r, "noprep")->error;
  EXPECT_EQ(find(r, "norun")->state, CandidateResult::State::kFailed);
  EXPECT_NE(find(r, "norun")->error.find("fake failure at run time"), std::string::npos);
  // Failures are cached too: a second tuning prepares and runs nothing.
  Tuner again(cache);
  int p0 = noprep.prepared + norun.prepared + ok.prepared, r0 = norun.ran + ok.ran;
  LayerTuning r2 = again.tune(l.sig, {&noprep, &norun, &ok});
  EXPECT_EQ(r2.kernel, "ok");
  EXPECT_EQ(r2.cache_hits, 3);
  EXPECT_EQ(noprep.prepared + norun.prepared + ok.prepared, p0);
  EXPECT_EQ(norun.ran + ok.ran, r0);
  EXPECT_EQ(find(r2, "noprep")->state, CandidateResult::State::kFailed);
  EXPECT_TRUE(find(r2, "noprep")->from_cache);
}

TEST(Tuner, ReferenceOnlyWhenNothingPrepares) {
  FakeTactic a("a", 0, false), b("b", 0, false);
  TimingCache cache(kHere);
  Layer l;
  LayerTuning r = Tuner(cache).tune(l.sig, {&a, &b});
  EXPECT_EQ(r.kernel, "reference");
  EXPECT_EQ(r.candidates.size(), 2u);
  EXPECT_EQ(Tuner(cache).tune(l.sig, {}).kernel, "reference");
}

TEST(Tuner, WarmCacheNeitherPreparesNorRuns) {
  FakeTactic slow("slow", 2), fast("fast", 0);
  TimingCache cache(kHere);
  Layer l;
  EXPECT_EQ(Tuner(cache).tune(l.sig, {&slow, &fast}).kernel, "fast");
  int prepared = slow.prepared + fast.prepared, ran = slow.ran + fast.ran;
  LayerTuning r = Tuner(cache).tune(l.sig, {&slow, &fast});
  EXPECT_EQ(r.kernel, "fast");
  EXPECT_EQ(r.cache_hits, 2);
  EXPECT_EQ(r.timed + r.prepared, 0);
  EXPECT_EQ(slow.prepared + fast.prepared, prepared);
  EXPECT_EQ(slow.ran + fast.ran, ran);
}

TEST(Tuner, OnlyTheUncachedCandidateIsPreparedAndTimed) {
  FakeTactic a("a", 1), b("b", 0);
  TimingCache cache(kHere);
  Layer l;
  Tuner(cache).tune(l.sig, {&a});  // a alone: prepared, not timed
  FakeTactic c("c", 0);
  LayerTuning r = Tuner(cache).tune(l.sig, {&a, &b});
  // a's cached entry has no time: with a rival it must be timed now.
  EXPECT_EQ(find(r, "a")->state, CandidateResult::State::kTimed);
  EXPECT_EQ(r.kernel, "b");
  int a_prepared = a.prepared;
  LayerTuning r2 = Tuner(cache).tune(l.sig, {&a, &b, &c});  // a new tactic appears
  EXPECT_EQ(a.prepared, a_prepared);
  EXPECT_EQ(r2.cache_hits, 2);
  EXPECT_EQ(r2.timed, 1);
  EXPECT_EQ(c.prepared, 1);
}

TEST(Tuner, ChangedKernelsAreTimedAgainTheOthersComeFromTheCache) {
  FakeTactic slow("slow", 2), fast("fast", 0);
  TimingCache cache(kHere);
  Layer l;
  EXPECT_EQ(Tuner(cache).tune(l.sig, {&slow, &fast}).kernel, "fast");
  int fast_prepared = fast.prepared, slow_prepared = slow.prepared;
  slow.revision_ = 2;  // slow's kernel changed: its cached time is of another kernel
  LayerTuning r = Tuner(cache).tune(l.sig, {&slow, &fast});
  EXPECT_EQ(r.cache_hits, 1);
  EXPECT_EQ(r.timed, 1);
  EXPECT_EQ(fast.prepared, fast_prepared);
  EXPECT_EQ(slow.prepared, slow_prepared + 1);
  EXPECT_FALSE(find(r, "slow")->from_cache);
  EXPECT_EQ(find(r, "slow")->revision, 2);
  EXPECT_TRUE(find(r, "fast")->from_cache);
  // The new revision's entry replaced the old one: a third build times nothing.
  LayerTuning r3 = Tuner(cache).tune(l.sig, {&slow, &fast});
  EXPECT_EQ(r3.cache_hits, 2);
  EXPECT_EQ(r3.timed + r3.prepared, 0);
  const std::string k = Tuner(cache).key(l.sig);
  EXPECT_EQ(cache.find(k, "slow", 1), nullptr);
  ASSERT_NE(cache.find(k, "slow", 2), nullptr);
}

TEST(Tuner, UnknownShapesTakeTheFirstUnproven) {
  FakeTactic a("a", 0), b("b", 0);
  TimingCache cache(kHere);
  Layer l({-1, 8});
  LayerTuning r = Tuner(cache).tune(l.sig, {&a, &b});
  EXPECT_EQ(r.kernel, "a");
  EXPECT_EQ(a.prepared + b.prepared, 0);
  EXPECT_EQ(r.candidates[0].state, CandidateResult::State::kUnproven);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(Tuner, KeyHasTheThreadCount) {
  TimingCache cache(kHere);
  Tuner t(cache);
  Layer l;
  EXPECT_EQ(t.key(l.sig).rfind("threads=" + std::to_string(t.threads()) + "|", 0), 0u) << t.key(l.sig);
}

TEST(LayerKey, IgnoresNamesAndProvenanceNotAttributesShapesOrConstness) {
  Layer a, b;
  b.node.name = "another_name";
  b.node.inputs = {"other_input"};
  ir::Attribute src;
  src.type = ir::Attribute::Type::kStrings;
  src.strings = {"onnx_node_1", "onnx_node_2"};
  b.node.attrs["kiln.sources"] = src;
  EXPECT_EQ(layer_key(a.sig), layer_key(b.sig));

  ir::Attribute alpha;
  alpha.type = ir::Attribute::Type::kFloat;
  alpha.f = 0.1f;
  b.node.attrs["alpha"] = alpha;
  EXPECT_NE(layer_key(a.sig), layer_key(b.sig));

  Layer c({4, 8});
  EXPECT_NE(layer_key(a.sig), layer_key(c.sig));

  Layer d;
  Tensor w(DataType::kFloat32, {2, 8});
  d.sig.inputs[0].constant = &w;
  EXPECT_NE(layer_key(a.sig), layer_key(d.sig));
  EXPECT_NE(layer_key(a.sig).find("float32[2,8]"), std::string::npos) << layer_key(a.sig);
  EXPECT_NE(layer_key(a.sig).find("@cpu["), std::string::npos) << layer_key(a.sig);
  EXPECT_NE(layer_key(a.sig).find("]:float32"), std::string::npos) << layer_key(a.sig);

  // The target's instruction set (kiln build --isa) is part of the key.
  Layer avx2, avx512;
  avx2.sig.isa = kIsaAvx2;
  avx512.sig.isa = kIsaAvx2 | kIsaAvx512;
  EXPECT_NE(layer_key(avx2.sig), layer_key(avx512.sig));
  EXPECT_NE(layer_key(avx2.sig).find("@cpu[avx2]:float32"), std::string::npos) << layer_key(avx2.sig);
  EXPECT_NE(layer_key(avx512.sig).find("@cpu[avx2+avx512]:float32"), std::string::npos) << layer_key(avx512.sig);

  // Small constants are parameters: their values count. Large ones are weights: they do not.
  Tensor small1 = Tensor::from_vector<int64_t>(DataType::kInt64, {2}, {1, 2});
  Tensor small2 = Tensor::from_vector<int64_t>(DataType::kInt64, {2}, {2, 1});
  Layer e, f;
  e.sig.inputs[0].constant = &small1;
  f.sig.inputs[0].constant = &small2;
  EXPECT_NE(layer_key(e.sig), layer_key(f.sig));
  Tensor big1(DataType::kFloat32, {2, 100}), big2(DataType::kFloat32, {2, 100});
  big2.data<float>()[5] = 1;
  e.sig.inputs[0].constant = &big1;
  f.sig.inputs[0].constant = &big2;
  EXPECT_EQ(layer_key(e.sig), layer_key(f.sig));
}

TEST(Tuner, DisturbedTimingsAreFlagged) {
  using State = CandidateResult::State;
  auto timed = [](double ms, double min_ms, int runs = 20) {
    CandidateResult c;
    c.state = State::kTimed;
    c.ms = ms, c.min_ms = min_ms, c.runs = runs;
    return c;
  };
  EXPECT_FALSE(disturbed(timed(1.27, 1.0)));  // the worst seen on an idle machine
  EXPECT_TRUE(disturbed(timed(1.51, 1.0)));
  EXPECT_TRUE(disturbed(timed(13.0, 1.0)));     // a worker thread waiting a scheduler tick
  EXPECT_FALSE(disturbed(timed(3.0, 1.0, 1)));  // one run: nothing to compare
  CandidateResult failed = timed(3.0, 1.0);
  failed.state = State::kFailed;
  EXPECT_FALSE(disturbed(failed));
  EXPECT_FALSE(timings_unreliable(0, 19));
  EXPECT_FALSE(timings_unreliable(1, 5));  // a single outlier
  EXPECT_FALSE(timings_unreliable(2, 40));
  EXPECT_TRUE(timings_unreliable(5, 19));  // measured with two busy processes on the 2 cores
}

// The tuner measures with the timer of the layer's device: a fake timer's times decide (10 ms for a
// run of `slow`, 1 ms for any other, whatever the clock says), and a layer on a device without a
// timer can only fail to be timed, with the reason.
class FakeTimer : public Timer {
 public:
  FakeTimer(DeviceKind device, const FakeTactic* slow) : device_(device), slow_(slow) {}
  DeviceKind device() const override { return device_; }
  Result<double> time_ms(const std::function<Status()>& run) override {
    ++calls;
    int before = slow_->ran.load();
    KILN_RETURN_IF_ERROR(run());
    return slow_->ran.load() != before ? 10.0 : 1.0;
  }
  int calls = 0;

 private:
  DeviceKind device_;
  const FakeTactic* slow_;
};

TEST(Tuner, TimesWithTheTimerOfTheLayersDevice) {
  FakeTactic a("a", 0), b("b", 0);
  Layer l;
  FakeTimer cpu(DeviceKind::kCPU, &b);
  TimingCache cache(kHere);
  Tuner t(cache, {}, {&cpu});
  LayerTuning r = t.tune(l.sig, {&b, &a});
  EXPECT_EQ(r.kernel, "a");
  const CandidateResult* ra = find(r, "a");
  const CandidateResult* rb = find(r, "b");
  ASSERT_TRUE(ra && rb);
  EXPECT_EQ(ra->ms, 1.0);
  EXPECT_EQ(rb->ms, 10.0);
  EXPECT_EQ(cpu.calls, ra->runs + rb->runs + 2);  // one warm-up each, then the measured runs

  // Only a CUDA timer: a CPU layer's candidates cannot be timed.
  FakeTimer cuda(DeviceKind::kCUDA, &b);
  TimingCache fresh(kHere);
  Tuner no_cpu(fresh, {}, {&cuda});
  LayerTuning n = no_cpu.tune(l.sig, {&a, &b});
  EXPECT_EQ(n.kernel, "reference");
  ASSERT_EQ(n.candidates.size(), 2u);
  for (const auto& c : n.candidates) {
    EXPECT_EQ(c.state, CandidateResult::State::kFailed) << c.tactic;
    EXPECT_NE(c.error.find("no timer for device cpu"), std::string::npos) << c.error;
  }
  EXPECT_EQ(cuda.calls, 0);
}

TEST(Tuner, SteadyClockTimerMeasuresAndPassesErrorsOn) {
  SteadyClockTimer timer;
  EXPECT_EQ(timer.device(), DeviceKind::kCPU);
  auto ms = timer.time_ms([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Status::Ok();
  });
  ASSERT_TRUE(ms.ok());
  EXPECT_GE(ms.value(), 1.9);
  auto bad = timer.time_ms([] { return Internal("kernel failed"); });
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("kernel failed"), std::string::npos);
  EXPECT_EQ(default_timer(DeviceKind::kCPU)->device(), DeviceKind::kCPU);
  // A CUDA build times CUDA layers with device events; without the backend there is no CUDA timer.
  if (backends::device_runtime(DeviceKind::kCUDA))
    EXPECT_EQ(default_timer(DeviceKind::kCUDA)->device(), DeviceKind::kCUDA);
  else
    EXPECT_EQ(default_timer(DeviceKind::kCUDA), nullptr);
}

}  // namespace
}  // namespace kiln::tune

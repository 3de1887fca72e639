// The timing cache file: round trip, what it refuses to trust (stale, foreign, corrupt) and how it says
// so, and concurrent builds writing one file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tune/timing_cache.h"

namespace kiln::tune {
namespace {

namespace fs = std::filesystem;

const CacheIdentity kHere{"0.1.0", "Test CPU 9000 | avx2 avx512f"};

// A fresh directory per test.
std::string temp_dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("kiln_tc_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Warnings {
  std::vector<std::string> lines;
  TimingCache::Warn fn() {
    return [this](const std::string& s) { lines.push_back(s); };
  }
  bool any(const std::string& needle) const {
    for (const auto& l : lines)
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }
};

CacheEntry timed(double ms) { return {CacheEntry::State::kTimed, ms, 7, ms * 0.9, ""}; }

// A cache file holding one timed, one prepared-only and one failed entry.
std::string make_cache(const std::string& dir, const CacheIdentity& id = kHere) {
  std::string path = dir + "/tc.json";
  TimingCache c = TimingCache::open(path, id, nullptr);
  c.put("threads=1|Conv{}", "conv_a", timed(1.5));
  c.put("threads=1|Conv{}", "conv_b", {CacheEntry::State::kFailed, 0, 0, 0, "no implementation"});
  c.put("threads=2|Gemm{}", "gemm_a", {CacheEntry::State::kPrepared, 0, 0, 0, ""});
  EXPECT_TRUE(c.save(nullptr).ok());
  return path;
}

TEST(TimingCache, RoundTrip) {
  std::string dir = temp_dir("roundtrip");
  std::string path = make_cache(dir);
  Warnings w;
  TimingCache c = TimingCache::open(path, kHere, w.fn());
  EXPECT_TRUE(w.lines.empty());
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.added(), 0u);
  const CacheEntry* a = c.find("threads=1|Conv{}", "conv_a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->state, CacheEntry::State::kTimed);
  EXPECT_DOUBLE_EQ(a->ms, 1.5);
  EXPECT_EQ(a->runs, 7);
  EXPECT_DOUBLE_EQ(a->min_ms, 1.5 * 0.9);
  const CacheEntry* b = c.find("threads=1|Conv{}", "conv_b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->state, CacheEntry::State::kFailed);
  EXPECT_EQ(b->error, "no implementation");
  const CacheEntry* g = c.find("threads=2|Gemm{}", "gemm_a");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->state, CacheEntry::State::kPrepared);
  EXPECT_EQ(c.find("threads=2|Conv{}", "conv_a"), nullptr);  // the thread count is part of the key
  EXPECT_EQ(c.find("threads=1|Conv{}", "conv_c"), nullptr);
}

TEST(TimingCache, NothingNewWritesNothing) {
  std::string dir = temp_dir("nothing");
  TimingCache c = TimingCache::open(dir + "/tc.json", kHere, nullptr);
  EXPECT_TRUE(c.save(nullptr).ok());
  EXPECT_FALSE(fs::exists(dir + "/tc.json"));
}

TEST(TimingCache, StaleVersionIgnoredWithAWarningAndMovedAsideOnSave) {
  std::string dir = temp_dir("stale");
  std::string path = make_cache(dir, {"0.0.9", kHere.machine});
  Warnings w;
  TimingCache c = TimingCache::open(path, kHere, w.fn());
  EXPECT_EQ(c.size(), 0u);
  ASSERT_EQ(w.lines.size(), 1u);
  EXPECT_TRUE(w.any("stale")) << w.lines[0];
  EXPECT_TRUE(w.any("kiln 0.0.9")) << w.lines[0];
  EXPECT_TRUE(w.any(path + ".stale")) << w.lines[0];
  std::string old = read(path);
  c.put("threads=1|Relu{}", "relu_a", timed(0.1));
  ASSERT_TRUE(c.save(w.fn()).ok());
  EXPECT_TRUE(w.any("moved the unusable file to " + path + ".stale"));
  EXPECT_EQ(read(path + ".stale"), old);  // kept, not destroyed
  TimingCache again = TimingCache::open(path, kHere, nullptr);
  EXPECT_EQ(again.size(), 1u);
  EXPECT_NE(again.find("threads=1|Relu{}", "relu_a"), nullptr);
}

TEST(TimingCache, OtherFormatVersionIsStale) {
  // 1: from before revisions (nothing says which kernels its timings were taken on); 99: a newer kiln.
  for (const std::string version : {"1", "99"}) {
    std::string dir = temp_dir("format" + version);
    std::string path = make_cache(dir);
    std::string text = read(path);
    size_t at = text.find("\"format_version\": 2");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 19, "\"format_version\": " + version);
    std::ofstream(path) << text;
    Warnings w;
    TimingCache c = TimingCache::open(path, kHere, w.fn());
    EXPECT_EQ(c.size(), 0u) << version;
    EXPECT_TRUE(w.any("stale") && w.any("cache format " + version + ")")) << (w.lines.empty() ? "" : w.lines[0]);
  }
}

TEST(TimingCache, EntryCountsOnlyForTheTacticRevisionItWasWrittenAt) {
  std::string dir = temp_dir("revision");
  std::string path = make_cache(dir);  // entries at revision 1 (CacheEntry's default)
  TimingCache c = TimingCache::open(path, kHere, nullptr);
  ASSERT_NE(c.find("threads=1|Conv{}", "conv_a", 1), nullptr);
  // conv_a's kernels changed (revision 2): its entry is not trusted, the others still are.
  EXPECT_EQ(c.find("threads=1|Conv{}", "conv_a", 2), nullptr);
  EXPECT_NE(c.find("threads=1|Conv{}", "conv_b", 1), nullptr);
  CacheEntry retimed = timed(0.5);
  retimed.revision = 2;
  c.put("threads=1|Conv{}", "conv_a", retimed);
  ASSERT_TRUE(c.save(nullptr).ok());
  EXPECT_NE(read(path).find("\"rev\": 2"), std::string::npos);
  TimingCache again = TimingCache::open(path, kHere, nullptr);
  EXPECT_EQ(again.find("threads=1|Conv{}", "conv_a", 1), nullptr);  // an older build's revision misses
  const CacheEntry* e = again.find("threads=1|Conv{}", "conv_a", 2);
  ASSERT_NE(e, nullptr);
  EXPECT_DOUBLE_EQ(e->ms, 0.5);
  EXPECT_EQ(e->revision, 2);
  EXPECT_EQ(again.size(), 3u);  // replaced, not added next to the old one
}

TEST(TimingCache, BuildIsRecordedNotCompared) {
  std::string dir = temp_dir("build");
  CacheIdentity old_build = kHere;
  old_build.build = "abc1234";
  std::string path = make_cache(dir, old_build);
  EXPECT_NE(read(path).find("\"kiln_build\": \"abc1234\""), std::string::npos);
  CacheIdentity new_build = kHere;
  new_build.build = "def5678-dirty";
  Warnings w;
  TimingCache c = TimingCache::open(path, new_build, w.fn());
  EXPECT_EQ(c.size(), 3u);
  EXPECT_TRUE(w.lines.empty());
}

TEST(TimingCache, ForeignMachineIgnoredWithAWarning) {
  std::string dir = temp_dir("foreign");
  std::string path = make_cache(dir, {kHere.kiln_version, "Other CPU | avx2"});
  Warnings w;
  TimingCache c = TimingCache::open(path, kHere, w.fn());
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.find("threads=1|Conv{}", "conv_a"), nullptr);
  ASSERT_EQ(w.lines.size(), 1u);
  EXPECT_TRUE(w.any("foreign") && w.any("Other CPU")) << w.lines[0];
  c.put("threads=1|Relu{}", "relu_a", timed(0.1));
  ASSERT_TRUE(c.save(w.fn()).ok());
  EXPECT_TRUE(fs::exists(path + ".foreign"));
}

TEST(TimingCache, CorruptOrTruncatedIgnoredWithoutCrashing) {
  std::string dir = temp_dir("corrupt");
  std::string path = make_cache(dir);
  std::string good = read(path);
  const std::vector<std::string> bad = {
      good.substr(0, good.size() / 2),  // truncated
      "",                               // empty
      "\x7f\x45\x4c\x46 binary junk",
      "[1, 2, 3]",
      "{\"format\": \"kiln-timing-cache\"}",
      // An entry of the wrong type: the whole file is distrusted, not partly used.
      "{\"format\": \"kiln-timing-cache\", \"format_version\": 2, \"kiln_version\": \"0.1.0\", \"machine\": \"" +
          kHere.machine +
          "\", \"layers\": {\"k\": {\"t\": {\"ms\": \"fast\", \"rev\": 1}}, \"k2\": {\"t\": {\"ms\": 1, \"rev\": 1}}}}",
      "{\"format\": \"kiln-timing-cache\", \"format_version\": 2, \"kiln_version\": \"0.1.0\", \"machine\": \"" +
          kHere.machine + "\", \"layers\": {\"k\": {\"t\": {\"ms\": -1, \"rev\": 1}}}}",
      // An entry without the revision of its tactic: it cannot be matched to a kernel.
      "{\"format\": \"kiln-timing-cache\", \"format_version\": 2, \"kiln_version\": \"0.1.0\", \"machine\": \"" +
          kHere.machine + "\", \"layers\": {\"k\": {\"t\": {\"ms\": 1}}}}",
  };
  for (const auto& text : bad) {
    std::ofstream(path, std::ios::trunc | std::ios::binary) << text;
    Warnings w;
    TimingCache c = TimingCache::open(path, kHere, w.fn());
    EXPECT_EQ(c.size(), 0u) << text;
    EXPECT_TRUE(w.any("corrupt")) << text;
  }
  TimingCache c = TimingCache::open(path, kHere, nullptr);
  c.put("threads=1|Relu{}", "relu_a", timed(0.1));
  ASSERT_TRUE(c.save(nullptr).ok());
  EXPECT_TRUE(fs::exists(path + ".corrupt"));
  EXPECT_EQ(TimingCache::open(path, kHere, nullptr).size(), 1u);
}

TEST(TimingCache, SaveMergesWhatAnotherBuildSavedMeanwhile) {
  std::string dir = temp_dir("merge");
  std::string path = dir + "/tc.json";
  TimingCache a = TimingCache::open(path, kHere, nullptr);
  TimingCache b = TimingCache::open(path, kHere, nullptr);
  a.put("threads=1|A{}", "t", timed(1));
  b.put("threads=1|B{}", "t", timed(2));
  b.put("threads=1|A{}", "u", timed(3));
  ASSERT_TRUE(a.save(nullptr).ok());
  ASSERT_TRUE(b.save(nullptr).ok());
  TimingCache c = TimingCache::open(path, kHere, nullptr);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_NE(c.find("threads=1|A{}", "t"), nullptr);
  EXPECT_NE(c.find("threads=1|A{}", "u"), nullptr);
  EXPECT_NE(c.find("threads=1|B{}", "t"), nullptr);
}

TEST(TimingCache, UnwritableDirectoryIsAnErrorNotACrash) {
  TimingCache c = TimingCache::open("/nonexistent_dir_for_kiln/tc.json", kHere, nullptr);
  c.put("k", "t", timed(1));
  Status s = c.save(nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent_dir_for_kiln/tc.json"), std::string::npos) << s.message();
}

// Two processes saving into one file over and over: the file stays valid and ends up holding every
// entry of both (flock + re-read + merge + atomic rename).
TEST(TimingCache, ConcurrentProcessesKeepEveryEntry) {
  std::string dir = temp_dir("concurrent");
  std::string path = dir + "/tc.json";
  constexpr int kRounds = 15, kPerRound = 20;
  pid_t kids[2];
  for (int p = 0; p < 2; ++p) {
    kids[p] = ::fork();
    ASSERT_GE(kids[p], 0);
    if (kids[p] == 0) {
      int bad = 0;
      for (int r = 0; r < kRounds; ++r) {
        Warnings w;
        TimingCache c = TimingCache::open(path, kHere, w.fn());
        bad += !w.lines.empty();  // a reader must never see a half-written file
        for (int i = 0; i < kPerRound; ++i)
          c.put("threads=1|P" + std::to_string(p) + "R" + std::to_string(r) + "{}", "t" + std::to_string(i),
                timed(p + r + i));
        bad += !c.save(nullptr).ok();
      }
      ::_exit(bad == 0 ? 0 : 1);
    }
  }
  for (pid_t k : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(k, &status, 0), k);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << k << " status " << status;
  }
  Warnings w;
  TimingCache c = TimingCache::open(path, kHere, w.fn());
  EXPECT_TRUE(w.lines.empty());
  EXPECT_EQ(c.size(), static_cast<size_t>(2 * kRounds * kPerRound));
  for (int p = 0; p < 2; ++p)
    for (int r = 0; r < kRounds; ++r)
      EXPECT_NE(c.find("threads=1|P" + std::to_string(p) + "R" + std::to_string(r) + "{}", "t0"), nullptr) << p << r;
  for (const auto& e : fs::directory_iterator(dir))  // no temporaries left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// Hostile files: fields of the wrong JSON type anywhere (each used to throw out of the reader and
// abort), nesting 100,000 deep (a stack overflow), a FIFO (a hang) and a directory. Each is a
// warning naming the problem and an empty cache, never an abort.
TEST(TimingCache, WrongTypesDeepNestingFifoAndDirectoryAreWarnings) {
  std::string dir = temp_dir("hostile");
  std::string path = dir + "/tc.json";
  std::string head =
      "{\"format\": \"kiln-timing-cache\", \"format_version\": 2, \"kiln_version\": \"0.1.0\", "
      "\"machine\": \"" +
      kHere.machine + "\", \"layers\": ";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"format\": 5}", "does not say"},
      {head + "{\"k\": {\"t\": {\"prepared\": \"yes\", \"rev\": 1}}}}", "prepared is not a boolean"},
      {head + "{\"k\": {\"t\": {\"ms\": 1, \"runs\": \"7\", \"rev\": 1}}}}", "runs is not an integer"},
      {head + "{\"k\": {\"t\": {\"ms\": 1, \"min_ms\": [1], \"rev\": 1}}}}", "min_ms is not a number"},
      {head + "{\"k\": {\"t\": {\"error\": 3, \"rev\": 1}}}}", "error is not a string"},
      {"{\"format\": \"kiln-timing-cache\", \"format_version\": 2.5, \"kiln_version\": 1, \"machine\": [], "
       "\"layers\": 3}",
       "wrong type"},
      {std::string(100000, '[') + std::string(100000, ']'), "deeper than 64 levels"},
  };
  for (const auto& [text, why] : bad) {
    std::ofstream(path, std::ios::trunc | std::ios::binary) << text;
    Warnings w;
    TimingCache c = TimingCache::open(path, kHere, w.fn());
    EXPECT_EQ(c.size(), 0u) << text.substr(0, 200);
    EXPECT_TRUE(w.any("is corrupt")) << text.substr(0, 200);
    EXPECT_TRUE(w.any(why)) << text.substr(0, 200) << "\n" << (w.lines.empty() ? "" : w.lines[0]);
  }
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  Warnings wf;
  EXPECT_EQ(TimingCache::open(path, kHere, wf.fn()).size(), 0u);
  EXPECT_TRUE(wf.any("cannot be read (it is a FIFO")) << (wf.lines.empty() ? "" : wf.lines[0]);
  fs::remove(path);
  fs::create_directories(path);
  Warnings wd;
  EXPECT_EQ(TimingCache::open(path, kHere, wd.fn()).size(), 0u);
  EXPECT_TRUE(wd.any("cannot be read (it is a directory")) << (wd.lines.empty() ? "" : wd.lines[0]);
}

}  // namespace
}  // namespace kiln::tune

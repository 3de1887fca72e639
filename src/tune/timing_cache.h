// The timing cache: what the auto-tuner learned about tactics on this machine, kept in a file and
// reused by later builds (of this model or any other with the same layers).
//
// The file is JSON:
//   {"format": "kiln-timing-cache", "format_version": 2, "kiln_version": "0.1.0",
//    "kiln_build": "c50bcf3-dirty", "machine": "AMD EPYC 9R14 | sse4.2 avx avx2 fma avx512f ...",
//    "layers": {"threads=2|Conv/13{...}(...)@cpu[avx2+avx512]:float32": {
//                  "conv2d_onednn_blocked": {"ms": 0.412, "min_ms": 0.398, "runs": 20, "rev": 1},
//                  "conv2d_onednn_nchw": {"error": "oneDNN has no implementation ...", "rev": 1}}}}
// keyed by layer (layer_key.h, prefixed by the thread count) and tactic. One entry per tactic says
// it was timed (median ms), prepared but not timed (a layer's only candidate), or failed to prepare
// or run (so later builds skip it), at which revision of the tactic's kernels (Tactic::revision()).
//
// Kernels change between builds of one kiln version: an entry counts only for the revision it was
// written at (find() with another revision misses, the tuner times the tactic again and put()
// replaces the entry), so a changed kernel is re-timed while the other tactics' timings stay warm
// (TensorRT's tactic identities do the same). "kiln_build" (git describe of the build that last
// saved the file) is informational: it is not compared, or every commit would empty the cache.
//
// Trust: a file written by another kiln version or cache format (stale), on another machine (CPU
// model or ISA flags differ: foreign), or that does not parse (corrupt) is ignored with a warning,
// never partly used. It is not overwritten in place either: when the build has timings to save,
// the bad file is renamed to PATH.stale / PATH.foreign / PATH.corrupt (replacing an older one of that
// name) and a new cache is written.
//
// Concurrency: builds may share one file. save() holds an exclusive flock on PATH.lock while it
// re-reads the file, merges its own new entries in, writes PATH.tmp.<pid> and renames it over PATH,
// so readers (who take no lock) always see a whole file and no build loses another's entries.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "core/status.h"

namespace kiln::tune {

struct CacheEntry {
  enum class State { kTimed, kPrepared, kFailed };
  State state = State::kTimed;
  double ms = 0;      // kTimed: the median run time
  int runs = 0;       // kTimed: how many runs the median is of
  double min_ms = 0;  // kTimed: the fastest run
  std::string error;  // kFailed: why the tactic cannot take this layer
  int revision = 1;   // the tactic's revision() when the entry was written
};

// What timings are only valid for: written into the file and compared on load.
struct CacheIdentity {
  std::string kiln_version;
  std::string machine;            // CPU model and ISA flags; later a GPU's name and driver
  std::string build = "unknown";  // git describe of this build: recorded, not compared
};

class TimingCache {
 public:
  using Warn = std::function<void(const std::string&)>;
  static constexpr int kFormatVersion = 2;  // 2: entries carry their tactic's revision

  // An empty cache held in memory (save() is a no-op): repeated layers of one build reuse timings.
  explicit TimingCache(CacheIdentity id) : id_(std::move(id)) {}
  // The cache in `path`; a missing file is an empty cache, a bad one (stale, foreign, corrupt,
  // unreadable) is ignored with a warning through `warn`.
  static TimingCache open(const std::string& path, CacheIdentity id, const Warn& warn);

  // The entry of `tactic` on layer `key`, if one was written at `revision` of the tactic.
  const CacheEntry* find(const std::string& key, const std::string& tactic, int revision = 1) const;
  void put(const std::string& key, const std::string& tactic, CacheEntry e);

  size_t size() const;                           // entries (key, tactic)
  size_t added() const { return added_count_; }  // entries put since open()
  const std::string& path() const { return path_; }
  const CacheIdentity& identity() const { return id_; }

  // Merges the entries put since open() into the file (see the top of this file). Nothing to do
  // when none were put. Warnings (a bad file moved aside) go through `warn`.
  Status save(const Warn& warn);

 private:
  using Entries = std::map<std::string, std::map<std::string, CacheEntry>>;
  std::string path_;
  CacheIdentity id_;
  Entries entries_;  // what find() answers from: the file's entries and this process's
  Entries added_;    // this process's, merged into the file by save()
  size_t added_count_ = 0;
};

}  // namespace kiln::tune

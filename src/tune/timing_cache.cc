#include "tune/timing_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/bounded_json.h"
#include "core/file_access.h"
#include "core/mapped_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kiln::tune {

namespace {

constexpr const char* kFormatName = "kiln-timing-cache";

// What reading the file found.
struct FileState {
  enum class Kind { kOk, kMissing, kUnreadable, kStale, kForeign, kCorrupt };
  Kind kind = Kind::kOk;
  std::string detail;  // why it is not usable
  std::map<std::string, std::map<std::string, CacheEntry>> entries;
};

const char* aside_suffix(FileState::Kind k) {
  switch (k) {
    case FileState::Kind::kStale: return ".stale";
    case FileState::Kind::kForeign: return ".foreign";
    default: return ".corrupt";
  }
}

Result<CacheEntry> entry_from(const nlohmann::json& j) {
  CacheEntry e;
  if (!j.is_object()) return InvalidModel("an entry is not an object");
  if (!j.contains("rev") || !j["rev"].is_number_integer()) return InvalidModel("an entry has no revision");
  for (const char* k : {"ms", "min_ms"})
    if (j.contains(k) && !j[k].is_number()) return InvalidModel("an entry's ", k, " is not a number");
  if (j.contains("runs") && !j["runs"].is_number_integer()) return InvalidModel("an entry's runs is not an integer");
  if (j.contains("prepared") && !j["prepared"].is_boolean())
    return InvalidModel("an entry's prepared is not a boolean");
  e.revision = j["rev"].get<int>();
  if (j.contains("ms")) {
    if (!j["ms"].is_number() || j["ms"].get<double>() < 0) return InvalidModel("an entry's ms is not a time");
    e.state = CacheEntry::State::kTimed;
    e.ms = j["ms"].get<double>();
    e.runs = j.contains("runs") && j["runs"].is_number_integer() ? j["runs"].get<int>() : 0;
    e.min_ms = j.contains("min_ms") && j["min_ms"].is_number() ? j["min_ms"].get<double>() : e.ms;
  } else if (j.contains("error")) {
    if (!j["error"].is_string()) return InvalidModel("an entry's error is not a string");
    e.state = CacheEntry::State::kFailed;
    e.error = j["error"].get<std::string>();
  } else if (j.contains("prepared") && j["prepared"].get<bool>()) {
    e.state = CacheEntry::State::kPrepared;
  } else {
    return InvalidModel("an entry has neither ms, error nor prepared");
  }
  return e;
}

nlohmann::json entry_json(const CacheEntry& e) {
  switch (e.state) {
    case CacheEntry::State::kTimed: return {{"ms", e.ms}, {"min_ms", e.min_ms}, {"runs", e.runs}, {"rev", e.revision}};
    case CacheEntry::State::kPrepared: return {{"prepared", true}, {"rev", e.revision}};
    case CacheEntry::State::kFailed: return {{"error", e.error}, {"rev", e.revision}};
  }
  return {};
}

FileState read_file_unchecked(const std::string& path, const CacheIdentity& id) {
  FileState st;
  // Non-blocking open, regular files only (a FIFO would block a plain open forever).
  auto opened = open_regular_file(path, "it");
  if (!opened.ok()) {
    st.kind = opened.status().code() == ErrorCode::kNotFound ? FileState::Kind::kMissing : FileState::Kind::kUnreadable;
    st.detail = opened.status().message();
    return st;
  }
  auto file = MappedFile::map(std::move(opened).value(), "timing cache " + path, MappedFile::Options{});
  if (!file.ok()) {
    st.kind = FileState::Kind::kUnreadable;
    st.detail = file.status().message();
    return st;
  }
  auto corrupt = [&](const std::string& why) {
    st.kind = FileState::Kind::kCorrupt;
    st.detail = why;
    st.entries.clear();
    return st;
  };
  auto parsed = parse_bounded_json(file.value()->view(), "it", ErrorCode::kInvalidArgument);
  if (!parsed.ok()) return corrupt(parsed.status().message());
  nlohmann::json j = std::move(parsed).value();
  if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
      j["format"].get<std::string>() != kFormatName)
    return corrupt(std::string("it does not say \"format\": \"") + kFormatName + "\"");
  if (!j.contains("format_version") || !j["format_version"].is_number_integer() || !j.contains("kiln_version") ||
      !j["kiln_version"].is_string() || !j.contains("machine") || !j["machine"].is_string() || !j.contains("layers") ||
      !j["layers"].is_object())
    return corrupt("format_version, kiln_version, machine or layers is missing or of the wrong type");
  int fv = j["format_version"].get<int>();
  std::string kv = j["kiln_version"].get<std::string>();
  if (fv != TimingCache::kFormatVersion || kv != id.kiln_version) {
    st.kind = FileState::Kind::kStale;
    std::string build = j.contains("kiln_build") && j["kiln_build"].is_string() ? j["kiln_build"].get<std::string>()
                                                                                : std::string("unknown");
    st.detail = "it was written by kiln " + kv + " (build " + build + ", cache format " + std::to_string(fv) +
                "); this is kiln " + id.kiln_version + " (build " + id.build + ", cache format " +
                std::to_string(TimingCache::kFormatVersion) + "): its timings may not hold for this kiln's kernels";
    return st;
  }
  std::string machine = j["machine"].get<std::string>();
  if (machine != id.machine) {
    st.kind = FileState::Kind::kForeign;
    st.detail = "it was made on another machine ('" + machine + "'; this one is '" + id.machine + "')";
    return st;
  }
  for (const auto& [key, tactics] : j["layers"].items()) {
    if (!tactics.is_object()) return corrupt("layer '" + key + "' is not an object");
    for (const auto& [tactic, je] : tactics.items()) {
      auto e = entry_from(je);
      if (!e.ok()) return corrupt(e.status().message() + " (layer '" + key + "', tactic '" + tactic + "')");
      st.entries[key][tactic] = std::move(e).value();
    }
  }
  return st;
}

// Every field's type is checked before use; anything that still throws (a JSON type error, memory)
// makes the file corrupt: ignored with a warning, never an abort.
FileState read_file(const std::string& path, const CacheIdentity& id) {
  try {
    return read_file_unchecked(path, id);
  } catch (const std::exception& e) {
    FileState st;
    st.kind = FileState::Kind::kCorrupt;
    st.detail = std::string("it could not be read as a timing cache (") + e.what() + ")";
    return st;
  }
}

std::string describe_ignored(const std::string& path, const FileState& st) {
  std::string what = st.kind == FileState::Kind::kStale     ? "is stale"
                     : st.kind == FileState::Kind::kForeign ? "is foreign"
                                                            : "is corrupt";
  return "timing cache " + path + " " + what + ": " + st.detail + ". Ignoring it: every layer is timed again. " +
         "If this build saves timings, the file is moved to " + path + aside_suffix(st.kind) +
         " and a new cache is written in its place";
}

Status write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IOError(std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// An exclusive flock on PATH.lock for the lifetime of the object (the lock file itself stays: removing
// it while another process waits on it would let two writers in).
class FileLock {
 public:
  explicit FileLock(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666)) {
    if (fd_ < 0) {
      error_ = std::strerror(errno);
      return;
    }
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      error_ = std::strerror(errno);
      return;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  const std::string& error() const { return error_; }

 private:
  int fd_;
  std::string error_;
};

}  // namespace

TimingCache TimingCache::open(const std::string& path, CacheIdentity id, const Warn& warn) {
  TimingCache c(std::move(id));
  c.path_ = path;
  FileState st = read_file(path, c.id_);
  switch (st.kind) {
    case FileState::Kind::kOk: c.entries_ = std::move(st.entries); break;
    case FileState::Kind::kMissing: break;  // the first build writes it
    case FileState::Kind::kUnreadable:
      if (warn) warn("timing cache " + path + " cannot be read (" + st.detail + "): building without it");
      break;
    default:
      if (warn) warn(describe_ignored(path, st));
      break;
  }
  return c;
}

const CacheEntry* TimingCache::find(const std::string& key, const std::string& tactic, int revision) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  auto t = it->second.find(tactic);
  return t == it->second.end() || t->second.revision != revision ? nullptr : &t->second;
}

void TimingCache::put(const std::string& key, const std::string& tactic, CacheEntry e) {
  entries_[key][tactic] = e;
  added_[key][tactic] = std::move(e);
  ++added_count_;
}

size_t TimingCache::size() const {
  size_t n = 0;
  for (const auto& [k, t] : entries_) n += t.size();
  return n;
}

Status TimingCache::save(const Warn& warn) {
  if (path_.empty() || added_.empty()) return Status::Ok();
  FileLock lock(path_ + ".lock");
  if (!lock.error().empty())
    return IOError("timing cache ", path_, ": cannot lock ", path_, ".lock (", lock.error(), ")");
  // Re-read under the lock: another build may have saved since we opened the file.
  FileState st = read_file(path_, id_);
  if (st.kind == FileState::Kind::kUnreadable)
    return IOError("timing cache ", path_, " cannot be read (", st.detail, "): not updated");
  if (st.kind == FileState::Kind::kStale || st.kind == FileState::Kind::kForeign ||
      st.kind == FileState::Kind::kCorrupt) {
    std::string aside = path_ + aside_suffix(st.kind);
    if (std::rename(path_.c_str(), aside.c_str()) != 0)
      return IOError("timing cache ", path_, " is not usable (", st.detail, ") and cannot be moved to ", aside, " (",
                     std::strerror(errno), "): not updated");
    if (warn) warn("timing cache " + path_ + ": moved the unusable file to " + aside + "; writing a new cache");
    st.entries.clear();
  }
  for (const auto& [key, tactics] : added_)
    for (const auto& [tactic, e] : tactics) st.entries[key][tactic] = e;  // this build's results win
  nlohmann::json layers = nlohmann::json::object();
  for (const auto& [key, tactics] : st.entries)
    for (const auto& [tactic, e] : tactics) layers[key][tactic] = entry_json(e);
  nlohmann::json j = {{"format", kFormatName},   {"format_version", kFormatVersion}, {"kiln_version", id_.kiln_version},
                      {"kiln_build", id_.build}, {"machine", id_.machine},           {"layers", layers}};
  std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return IOError("timing cache ", path_, ": cannot create ", tmp, " (", std::strerror(errno), ")");
  Status w = write_all(fd, j.dump(1) + "\n");
  if (w.ok() && ::fsync(fd) != 0) w = IOError(std::strerror(errno));
  ::close(fd);
  if (w.ok() && std::rename(tmp.c_str(), path_.c_str()) != 0) w = IOError(std::strerror(errno));
  if (!w.ok()) {
    std::remove(tmp.c_str());
    return IOError("timing cache ", path_, ": cannot write it (", w.message(), ")");
  }
  entries_ = std::move(st.entries);
  added_.clear();
  added_count_ = 0;
  return Status::Ok();
}

}  // namespace kiln::tune

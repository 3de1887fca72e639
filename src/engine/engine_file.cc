// The .kiln engine file.
//
//   offset  size  field
//   0       8     magic "KILNENG\0"
//   8       4     format version (little-endian u32)
//   12      4     header length H (u32)
//   16      8     body length B (u64)
//   24      4     CRC-32C of the header
//   28      4     CRC-32C of the body
//   32      H     header: JSON (kiln version, target, build config and profiles, how kernels were
//                 tuned, layers with their kernel and every candidate's time, memory plan)
//   ...           zero padding to a multiple of 64
//   P       B     body: the optimized graph as ONNX protobuf (graph_offset/graph_length in the header),
//                 then the weights, each 64-byte aligned (weights_offset in the header); the graph's
//                 initializers refer to them as external data, so loading aliases them without copies.
//
// Loading checks, in order: size, magic, format version, lengths, both checksums, the kiln version,
// and whether this machine has the CPU features the kernels need. Each failure says what differs
// and to rebuild from the ONNX model.
//
// Versions: 2 added the auto-tuner's per-layer candidates ("candidates") and build.tuning; 3 changed
// the checksums from zlib's CRC-32 to CRC-32C (the SSE4.2 instruction: checking a 100 MB engine took
// ~60 ms with zlib, ~15 ms now). Files of other versions are refused with the advice to rebuild.
// Within version 3, optional fields were added that older files lack and older readers ignore: a
// reference layer's "reference" record (reasons, shape work, estimated ms) and build.reference;
// build.plugins (the custom-op plugins the layers use: name, version, origin, ops, layers), checked
// against the loaded plugins before the graph is read, and a plugin layer's stored state (the node
// attribute kiln.plugin_state, src/plugin/custom_ops.h).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <sstream>

#include "backends/registry.h"
#include "core/bounded_json.h"
#include "core/checked_size.h"
#include "core/checksum.h"
#include "core/file_access.h"
#include "core/mapped_file.h"
#include "engine/engine_impl.h"
#include "engine/profiles.h"
#include "ir/rewrite.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "ops/interpreter.h"
#include "plugin/custom_ops.h"

namespace kiln::detail {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', '\0'};
constexpr size_t kFixedHeader = 32;
const char* kRebuild = " — rebuild the engine from the ONNX model with kiln build";

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

template <typename T>
void put(std::string& s, size_t at, T v) {
  std::memcpy(s.data() + at, &v, sizeof v);
}
template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint32_t crc(const uint8_t* p, size_t n) { return crc32c(0, p, n); }

nlohmann::json target_json(const engine::TargetInfo& t) {
  nlohmann::json j = {{"device", t.device}, {"cpu_model", t.cpu_model}, {"isa", t.isa}, {"cores", t.cores}};
  if (!t.gpu.empty()) j["gpu"] = t.gpu;
  return j;
}
engine::TargetInfo target_from(const nlohmann::json& j) {
  engine::TargetInfo t;
  t.device = j.at("device").get<std::string>();
  t.cpu_model = j.at("cpu_model").get<std::string>();
  t.isa = j.at("isa").get<std::vector<std::string>>();
  t.cores = j.at("cores").get<int>();
  if (j.contains("gpu")) t.gpu = j.at("gpu").get<std::map<std::string, std::string>>();
  return t;
}

// What the engine was built for (kiln::Target): device, instruction set, layout block, precision.
nlohmann::json built_for_json(const Target& t) {
  std::vector<std::string> isa;
  if (t.isa != kIsaPortable) {
    std::stringstream names(isa_names(t.isa));
    for (std::string n; names >> n;) isa.push_back(n);
  }
  return {{"device", device_name(t.device)},
          {"isa", isa},
          {"layout_block", t.layout_block},
          {"precision", dtype_name(t.precision)},
          {"tf32", t.tf32},
          {"exact_gelu", t.exact_gelu},
          {"reduced_float", t.reduced_float},
          {"channels_last", t.channels_last}};
}
Target built_for_from(const nlohmann::json& j) {
  Target t;
  std::string device = j.at("device").get<std::string>();
  if (!parse_device(device, &t.device))
    throw std::runtime_error("build target device '" + device + "' is not one kiln knows");
  t.tf32 = j.value("tf32", false);
  t.exact_gelu = j.value("exact_gelu", false);
  t.reduced_float = j.value("reduced_float", false);
  // Engines written before the option: the pass ran for CUDA builds allowing fp16/bf16.
  t.channels_last = j.value("channels_last", t.device.kind == DeviceKind::kCUDA && t.reduced_float);
  for (const auto& n : j.at("isa").get<std::vector<std::string>>()) {
    IsaSet feature;
    if (!parse_isa_feature(n, &feature)) throw std::runtime_error("unknown instruction set '" + n + "'");
    t.isa |= feature;
  }
  t.layout_block = j.at("layout_block").get<int64_t>();
  std::string precision = j.at("precision").get<std::string>();
  if (!dtype_from_name(precision, &t.precision)) throw std::runtime_error("unknown precision '" + precision + "'");
  return t;
}

using tune::CandidateResult;

nlohmann::json candidates_json(const std::vector<CandidateResult>& cs) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : cs) {
    nlohmann::json j = {{"tactic", c.tactic}, {"state", tune::state_name(c.state)}, {"cached", c.from_cache}};
    if (c.state == CandidateResult::State::kTimed) j["ms"] = c.ms, j["min_ms"] = c.min_ms, j["runs"] = c.runs;
    if (!c.error.empty()) j["error"] = c.error;
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<CandidateResult> candidates_from(const nlohmann::json& j) {
  std::vector<CandidateResult> out;
  for (const auto& jc : j) {
    CandidateResult c;
    c.tactic = jc.at("tactic").get<std::string>();
    std::string state = jc.at("state").get<std::string>();
    bool known = false;
    for (auto s : {CandidateResult::State::kTimed, CandidateResult::State::kPrepared, CandidateResult::State::kFailed,
                   CandidateResult::State::kUnproven})
      if (state == tune::state_name(s)) c.state = s, known = true;
    if (!known) throw std::runtime_error("unknown candidate state '" + state + "'");
    c.from_cache = jc.value("cached", false);
    c.ms = jc.value("ms", 0.0);
    c.runs = jc.value("runs", 0);
    c.min_ms = jc.value("min_ms", c.ms);
    c.error = jc.value("error", "");
    out.push_back(std::move(c));
  }
  return out;
}

// Why a reference layer is one (LayerInfo::reference). Optional in the header: files without it load
// (the record reads as not made), so adding it kept format version 3.
nlohmann::json reference_json(const LayerInfo::Reference& r) {
  nlohmann::json j = {{"reasons", r.reasons}, {"shape_work", r.shape_work}};
  if (r.ms >= 0) j["ms"] = r.ms;
  return j;
}

LayerInfo::Reference reference_from(const nlohmann::json& j) {
  LayerInfo::Reference r;
  r.recorded = true;
  r.reasons = j.at("reasons").get<std::vector<std::string>>();
  r.shape_work = j.value("shape_work", false);
  r.ms = j.value("ms", -1.0);
  return r;
}

}  // namespace

namespace {

// An engine file laid out but not assembled: the weights stay where they are (the model's tensors)
// and are visited piece by piece, so that saving copies them once (into the file), never into a
// buffer first: engines of large models are hundreds of MB, and each copy showed in kiln build's time.
struct Layout {
  std::string header;                              // JSON
  std::string graph;                               // ONNX protobuf with external weights
  std::vector<std::pair<size_t, Tensor>> weights;  // offset in the weights blob, tensor
  size_t weights_offset = 0, weights_length = 0, body_start = 0, body_length = 0;
  uint32_t header_crc = 0, body_crc = 0;

  // Calls emit(ptr, n) for every byte after the header, in order: padding, graph, weights (nullptr
  // for runs of zeros).
  template <typename Emit>
  void body(Emit&& emit) const {
    size_t after_header = kFixedHeader + header.size();
    emit(nullptr, body_start - after_header);
    emit(graph.data(), graph.size());
    size_t at = graph.size();  // within the body
    for (const auto& [off, t] : weights) {
      emit(nullptr, weights_offset + off - at);
      emit(t.raw(), t.nbytes());
      at = weights_offset + off + t.nbytes();
    }
    emit(nullptr, body_length - at);  // the graph's padding when there are no weights
  }
  // The 32 fixed bytes and the header.
  std::string head() const {
    std::string h(kFixedHeader, '\0');
    std::memcpy(h.data(), kMagic, 8);
    put<uint32_t>(h, 8, kEngineFormatVersion);
    put<uint32_t>(h, 12, static_cast<uint32_t>(header.size()));
    put<uint64_t>(h, 16, static_cast<uint64_t>(body_length));
    put<uint32_t>(h, 24, header_crc);
    put<uint32_t>(h, 28, body_crc);
    return h + header;
  }
};

Result<Layout> lay_out(const EngineImpl& e) {
  Layout L;
  onnx_import::ExportOptions opts;
  opts.external_location = "kiln-engine-weights";
  opts.store_external = [&](const Tensor& t) -> std::pair<int64_t, int64_t> {
    size_t off = align64(L.weights_length);
    L.weights.emplace_back(off, t);
    L.weights_length = off + t.nbytes();
    return {static_cast<int64_t>(off), static_cast<int64_t>(t.nbytes())};
  };
  KILN_ASSIGN_OR_RETURN(L.graph, onnx_import::serialize_model(e.model, opts));
  size_t graph_offset = 0;
  L.weights_offset = align64(L.graph.size());
  nlohmann::json h;
  h["kiln_version"] = KILN_VERSION;
  h["format_version"] = kEngineFormatVersion;
  h["target"] = target_json(e.target);
  h["built_for"] = built_for_json(e.built_for);
  h["required_isa"] = e.required_isa;
  h["build"] = e.build;
  h["graph_offset"] = graph_offset;
  h["graph_length"] = L.graph.size();
  h["weights_offset"] = L.weights_offset;
  h["weights_length"] = L.weights_length;
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : e.layers) {
    nlohmann::json jl = {{"name", l.name},
                         {"kernel", l.kernel},
                         {"precision", l.precision},
                         {"candidates", candidates_json(l.candidates)}};
    if (l.reference.recorded) jl["reference"] = reference_json(l.reference);
    layers.push_back(std::move(jl));
  }
  h["layers"] = layers;
  h["memory"] = {{"arena_bytes", e.plan.arena_bytes},
                 {"naive_bytes", e.plan.naive_bytes},
                 {"in_place", e.plan.in_place},
                 {"workspace_bytes", e.plan.workspace_bytes}};
  L.header = h.dump();
  L.body_length = L.weights_offset + L.weights_length;
  L.body_start = align64(kFixedHeader + L.header.size());
  L.header_crc = crc(reinterpret_cast<const uint8_t*>(L.header.data()), L.header.size());
  return L;  // body_crc: computed by whoever writes the body, in the same pass
}

// Calls emit(ptr, n) for the body in pieces of at most 1 MiB (zeros from a static buffer) while
// checksumming them: the checksum reads a piece just before emit copies it, so the bytes come from
// memory once. Returns the body's CRC-32C (it covers the padding too: every byte after the header).
template <typename Emit>
uint32_t emit_body(const Layout& L, Emit&& emit) {
  static const char kZeros[1 << 16] = {};
  uint32_t c = 0;
  L.body([&](const void* p, size_t n) {
    const auto* b = static_cast<const char*>(p);
    while (n > 0) {
      size_t k = std::min(n, b ? size_t{1} << 20 : sizeof kZeros);
      const char* piece = b ? b : kZeros;
      c = crc32c(c, piece, k);
      emit(piece, k);
      if (b) b += k;
      n -= k;
    }
  });
  return c;
}

}  // namespace

Result<std::string> serialize_engine(const EngineImpl& e) {
  KILN_ASSIGN_OR_RETURN(Layout L, lay_out(e));
  std::string file = L.head();
  file.reserve(L.body_start + L.body_length);
  L.body_crc = emit_body(L, [&](const char* p, size_t n) { file.append(p, n); });
  put<uint32_t>(file, 28, L.body_crc);
  return file;
}

Status write_engine(const EngineImpl& e, const std::string& path) {
  KILN_ASSIGN_OR_RETURN(Layout L, lay_out(e));
  // Written beside the target, then renamed over it: readers never see a half-written engine, a
  // failed build leaves the previous engine in place, and a process that has the old file open keeps
  // reading the old bytes.
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IOError("cannot write engine file '", path, "' (", std::strerror(errno), ")");
  int err = 0;
  auto put_bytes = [&](const char* p, size_t n) {
    while (n > 0 && !err) {
      ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        err = w < 0 ? errno : EIO;
        break;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  std::string head = L.head();  // its body checksum is filled in at the end
  put_bytes(head.data(), head.size());
  L.body_crc = emit_body(L, put_bytes);
  head = L.head();
  if (!err && ::pwrite(fd, head.data(), kFixedHeader, 0) != static_cast<ssize_t>(kFixedHeader))
    err = errno ? errno : EIO;
  if (::close(fd) != 0 && !err) err = errno;
  if (!err && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err) {
    ::unlink(tmp.c_str());
    return IOError("cannot write engine file '", path, "' (", std::strerror(err), ")");
  }
  return Status::Ok();
}

namespace {

// The 32 fixed bytes against the file's size: magic, format version and both lengths, before
// anything else is read, copied or mapped. Returns where the body starts.
Result<size_t> check_fixed_header(const uint8_t* p, size_t n) {
  if (n < kFixedHeader)
    return InvalidModel("not a kiln engine: the file has ", n, " bytes, fewer than the 32-byte header (truncated?)",
                        kRebuild);
  if (std::memcmp(p, kMagic, 8) != 0)
    return InvalidModel(
        "not a kiln engine file (bad magic bytes; an ONNX model is the input of kiln build, not of this "
        "command; a damaged engine must be rebuilt)",
        kRebuild);
  uint32_t version = get<uint32_t>(p + 8);
  if (version != kEngineFormatVersion)
    return InvalidModel("engine file format version ", version, " — this kiln (", KILN_VERSION,
                        ") reads format version ", kEngineFormatVersion, kRebuild);
  uint64_t header_len = get<uint32_t>(p + 12);
  uint64_t body_len = get<uint64_t>(p + 16);
  size_t body_start = align64(kFixedHeader + header_len);
  if (header_len > n || body_len > n || body_start + body_len != n)
    return InvalidModel(
        "engine file is truncated or has extra bytes: its header says ",
        header_len <= n && body_len <= n ? std::to_string(body_start + body_len) : std::string("an impossible size"),
        " bytes, the file has ", n, kRebuild);
  return body_start;
}

// Every profile input has min, opt and max of one rank, non-negative, min <= opt <= max, and a
// max whose element count fits in 64 bits: what select_profile and the planner index by.
Status check_profiles(const std::vector<Profile>& profiles) {
  for (const auto& p : profiles)
    for (const auto& [name, r] : p.inputs) {
      std::string what = "engine profile '" + p.name + "' input '" + name + "'";
      if (r.min.size() != r.opt.size() || r.min.size() != r.max.size())
        return InvalidModel(what, ": min, opt and max have different ranks", kRebuild);
      for (size_t k = 0; k < r.min.size(); ++k)
        if (r.min[k] < 0 || r.min[k] > r.opt[k] || r.opt[k] > r.max[k])
          return InvalidModel(what, ": dim ", k, " is not 0 <= min <= opt <= max (", r.min[k], ", ", r.opt[k], ", ",
                              r.max[k], ")", kRebuild);
      KILN_RETURN_IF_ERROR(checked_numel(r.max, what, ErrorCode::kInvalidModel).status());
    }
  return Status::Ok();
}

Result<std::shared_ptr<EngineImpl>> deserialize_checked(std::shared_ptr<uint8_t[]> storage, size_t n);
Result<std::shared_ptr<EngineImpl>> deserialize_parts(const std::shared_ptr<uint8_t[]>& storage, size_t body_start,
                                                      uint64_t header_len, uint64_t body_len);

}  // namespace

Result<std::shared_ptr<EngineImpl>> deserialize_engine(std::string_view bytes) {
  const size_t n = bytes.size();
  KILN_RETURN_IF_ERROR(check_fixed_header(reinterpret_cast<const uint8_t*>(bytes.data()), n).status());
  // Copy into 64-byte-aligned storage that the weights alias for the engine's lifetime.
  auto* raw = static_cast<uint8_t*>(::operator new[](n, std::align_val_t(64), std::nothrow));
  if (!raw) return InvalidModel("engine of ", n, " bytes: not enough memory to load it");
  std::shared_ptr<uint8_t[]> storage(raw, [](uint8_t* p) { ::operator delete[](p, std::align_val_t(64)); });
  std::memcpy(storage.get(), bytes.data(), n);
  return deserialize_checked(std::move(storage), n);
}

Result<std::shared_ptr<EngineImpl>> load_engine_file(const std::string& path) {
  std::string what = "engine file '" + path + "'";
  KILN_ASSIGN_OR_RETURN(OpenedFile f, open_regular_file(path, what, ErrorCode::kInvalidArgument));
  uint8_t fixed[kFixedHeader] = {};
  if (f.size >= kFixedHeader) KILN_RETURN_IF_ERROR(read_at(f.fd.get(), fixed, kFixedHeader, 0, what));
  auto checked = check_fixed_header(fixed, f.size);
  if (!checked.ok()) return checked.status().with_context("'" + path + "': ");
  // Mapped, not read: pages come in as the checksum reads them; copy-on-write, so the weights that
  // alias it are as writable as heap memory and nothing is ever written back. An engine is replaced
  // by rename (write_engine), so the mapped file is never truncated under a loaded engine by kiln.
  MappedFile::Options mo;
  mo.populate = false;
  mo.writable = true;
  KILN_ASSIGN_OR_RETURN(auto file, MappedFile::map(std::move(f), what, mo));
  if (!file->mapped() || reinterpret_cast<uintptr_t>(file->data()) % 64 != 0) {
    auto e = deserialize_engine(file->view());  // read into memory: copy into aligned storage
    if (!e.ok()) return e.status().with_context("'" + path + "': ");
    return e;
  }
  std::shared_ptr<uint8_t[]> storage(file, reinterpret_cast<uint8_t*>(const_cast<char*>(file->data())));
  auto e = deserialize_checked(std::move(storage), file->size());
  if (!e.ok()) return e.status().with_context("'" + path + "': ");
  return e;
}

namespace {

Result<std::shared_ptr<EngineImpl>> deserialize_checked(std::shared_ptr<uint8_t[]> storage, size_t n) {
  const uint8_t* p = storage.get();
  KILN_ASSIGN_OR_RETURN(size_t body_start, check_fixed_header(p, n));
  uint64_t header_len = get<uint32_t>(p + 12);
  uint64_t body_len = get<uint64_t>(p + 16);
  uint32_t header_crc = get<uint32_t>(p + 24), body_crc = get<uint32_t>(p + 28);
  uint32_t actual_header_crc = crc(p + kFixedHeader, header_len);
  if (actual_header_crc != header_crc)
    return InvalidModel("engine header is corrupted (checksum ", actual_header_crc, ", expected ", header_crc, ")",
                        kRebuild);
  size_t after_header = kFixedHeader + header_len;
  uint32_t actual_body_crc = crc(p + after_header, n - after_header);
  if (actual_body_crc != body_crc)
    return InvalidModel("engine weights/graph are corrupted (checksum ", actual_body_crc, ", expected ", body_crc, ")",
                        kRebuild);
  try {
    return deserialize_parts(storage, body_start, header_len, body_len);
  } catch (const std::bad_alloc&) {
    return InvalidModel("the engine needs more memory than is available to load", kRebuild);
  } catch (const std::exception& ex) {
    return InvalidModel("engine is malformed (", ex.what(), ")", kRebuild);
  }
}

}  // namespace

namespace {
// The header's JSON and the graph, once the fixed header and both checksums are verified.
Result<std::shared_ptr<EngineImpl>> deserialize_parts(const std::shared_ptr<uint8_t[]>& storage, size_t body_start,
                                                      uint64_t header_len, uint64_t body_len) {
  const uint8_t* p = storage.get();
  auto e = std::make_shared<EngineImpl>();
  e->storage = storage;
  nlohmann::json h;
  size_t graph_offset, graph_length, weights_offset, weights_length;
  try {
    auto parsed = parse_bounded_json(
        std::string_view(reinterpret_cast<const char*>(p + kFixedHeader), static_cast<size_t>(header_len)),
        "engine header", ErrorCode::kInvalidModel);
    if (!parsed.ok()) return Status(parsed.status().code(), parsed.status().message() + kRebuild);
    h = std::move(parsed).value();
    if (!h.is_object()) return InvalidModel("engine header is not a JSON object", kRebuild);
    std::string built_by = h.at("kiln_version").get<std::string>();
    if (built_by != KILN_VERSION)
      return InvalidModel("engine was built by kiln ", built_by, "; this is kiln ", KILN_VERSION,
                          " (kernels and formats may differ)", kRebuild);
    e->target = target_from(h.at("target"));
    // Engines written before the build target was recorded ran their kernels at this machine's best.
    e->built_for = h.contains("built_for") ? built_for_from(h.at("built_for")) : engine::host_target();
    e->required_isa = h.at("required_isa").get<std::vector<std::string>>();
    e->build = h.at("build");
    graph_offset = h.at("graph_offset").get<size_t>();
    graph_length = h.at("graph_length").get<size_t>();
    weights_offset = h.at("weights_offset").get<size_t>();
    weights_length = h.at("weights_length").get<size_t>();
    e->plan.arena_bytes = h.at("memory").at("arena_bytes").get<size_t>();
    e->plan.naive_bytes = h.at("memory").at("naive_bytes").get<size_t>();
    e->plan.in_place = h.at("memory").at("in_place").get<int>();
    e->plan.workspace_bytes = h.at("memory").value("workspace_bytes", size_t{0});  // older engines: none
  } catch (const std::exception& ex) {
    return InvalidModel("engine header is malformed (", ex.what(), ")", kRebuild);
  }
  // Before the graph is read: its custom ops come from plugins, and a missing one is named as such.
  KILN_RETURN_IF_ERROR(plugin::check_engine_plugins(
      e->build.is_object() && e->build.contains("plugins") ? e->build["plugins"] : nlohmann::json()));
  if (graph_offset > body_len || graph_length > body_len - graph_offset || weights_offset > body_len ||
      weights_length > body_len - weights_offset)
    return InvalidModel("engine header points outside the file", kRebuild);
  if (e->build.is_object() && e->build.contains("config") && e->build["config"].is_object() &&
      e->build["config"].contains("profiles")) {
    auto profiles = profiles_from_json(e->build["config"]["profiles"]);
    if (!profiles.ok()) return InvalidModel(profiles.status().message(), kRebuild);
    e->profiles = std::move(profiles).value();
    KILN_RETURN_IF_ERROR(check_profiles(e->profiles));
  }
  KILN_RETURN_IF_ERROR(engine::check_runnable(e->required_isa, e->target, engine::detect_host()));
  const size_t weights_abs = body_start + weights_offset;
  onnx_import::ImportOptions opts;
  opts.external_resolver = [&](const std::string& location, int64_t offset, int64_t length, DataType dt,
                               const Dims& dims) -> Result<Tensor> {
    auto numel_r = checked_numel(dims, "engine weight", ErrorCode::kInvalidModel);
    if (!numel_r.ok()) return Status(numel_r.status().code(), numel_r.status().message() + kRebuild);
    int64_t numel = numel_r.value();
    if (dt != DataType::kString && static_cast<uint64_t>(numel) > weights_length / std::max<size_t>(dtype_size(dt), 1))
      return InvalidModel("engine weight reference is out of bounds", kRebuild);
    if (location != "kiln-engine-weights" || offset < 0 || length < 0 || static_cast<size_t>(offset) > weights_length ||
        static_cast<size_t>(length) > weights_length - static_cast<size_t>(offset) ||
        static_cast<size_t>(numel) * dtype_size(dt) != static_cast<size_t>(length) || dt == DataType::kString)
      return InvalidModel("engine weight reference is out of bounds", kRebuild);
    return Tensor::alias(dt, dims, storage, weights_abs + static_cast<size_t>(offset));
  };
  std::string_view graph(reinterpret_cast<const char*>(p + body_start + graph_offset), graph_length);
  auto m = onnx_import::parse_model(graph, "", opts);
  if (!m.ok()) return m.status().with_context("engine graph is invalid: ");
  e->model = std::move(m).value();
  KILN_RETURN_IF_ERROR(ops::check_supported(*e->model.graph));
  e->describe_layers();
  try {
    const auto& jl = h.at("layers");
    if (jl.size() != e->layers.size())
      return InvalidModel("engine lists ", jl.size(), " layers but its graph has ", e->layers.size(), kRebuild);
    for (size_t i = 0; i < jl.size(); ++i) {
      e->layers[i].kernel = jl[i].at("kernel").get<std::string>();
      // Engines written before layers recorded their precision computed in float32.
      e->layers[i].precision = jl[i].value("precision", std::string("fp32"));
      e->layers[i].candidates = candidates_from(jl[i].at("candidates"));
      if (jl[i].contains("reference")) e->layers[i].reference = reference_from(jl[i]["reference"]);
    }
  } catch (const std::exception& ex) {
    return InvalidModel("engine header is malformed (", ex.what(), ")", kRebuild);
  }
  for (const auto& l : e->layers)  // e.g. an engine built with oneDNN, loaded by a kiln built without it
    if (l.kernel != "reference" && !backends::find_tactic(l.kernel))
      return Unsupported("layer '", l.name, "' runs tactic '", l.kernel, "', which this kiln lacks", kRebuild);
  return e;
}
// The subgraphs of a control-flow layer (If branches, Loop and Scan bodies) in attribute order. kiln's
// fused ops keep their body private (the fused kernel runs it): none.
std::vector<std::pair<std::string, const ir::Graph*>> control_flow_bodies(const ir::Node& n) {
  std::vector<std::pair<std::string, const ir::Graph*>> out;
  if (n.domain == "kiln") return out;
  for (const auto& [k, a] : n.attrs) {
    if (a.g) out.emplace_back(k, a.g.get());
    for (const auto& sg : a.graphs) out.emplace_back(k, sg.get());
  }
  return out;
}

// A control-flow layer's bodies with their layers and kernels; nested bodies under their own layer.
// `slow`: the layers on interpreted plugin kernels by path ("loop/body/act", as build.plugins names
// them), with why; `prefix`: the path of n's graph.
using SlowLayers = std::map<std::string, std::string>;
nlohmann::json bodies_json(const ir::Node& n, const std::string& prefix, const SlowLayers& slow) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [attr, sg] : control_flow_bodies(n)) {
    const std::string path = prefix + n.name + "/" + attr + "/";
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& bn : sg->nodes) {
      nlohmann::json outs = nlohmann::json::array();
      for (const auto& o : bn.outputs) {
        auto it = sg->value_types.find(o);
        outs.push_back({{"name", o}, {"type", o.empty() || it == sg->value_types.end() ? "" : it->second.str()}});
      }
      nlohmann::json l = {{"name", bn.name},
                          {"op", bn.domain.empty() ? bn.op_type : bn.domain + "." + bn.op_type},
                          {"kernel", bn.attr_string(engine::kBodyKernelAttr, "reference")},
                          {"sources", ir::sources_of(bn)},
                          {"outputs", outs}};
      if (auto it = slow.find(path + bn.name); it != slow.end()) l["slow"] = it->second;
      nlohmann::json nested = bodies_json(bn, path, slow);
      if (!nested.empty()) l["bodies"] = std::move(nested);
      layers.push_back(std::move(l));
    }
    out.push_back({{"attribute", attr}, {"graph", sg->name}, {"layers", std::move(layers)}});
  }
  return out;
}
}  // namespace

BodyLayerCount count_body_layers(const ir::Graph& g) {
  BodyLayerCount c;
  for (const auto& n : g.nodes)
    for (const auto& [attr, sg] : control_flow_bodies(n)) {
      for (const auto& bn : sg->nodes) {
        ++c.layers;
        c.with_tactic += bn.attr_string(engine::kBodyKernelAttr, "reference") != "reference";
      }
      BodyLayerCount inner = count_body_layers(*sg);
      c.layers += inner.layers, c.with_tactic += inner.with_tactic;
    }
  return c;
}

nlohmann::json inspect(const EngineImpl& e) {
  nlohmann::json j;
  j["kiln_version"] = KILN_VERSION;
  j["target"] = target_json(e.target);
  j["built_for"] = built_for_json(e.built_for);
  j["required_isa"] = e.required_isa;
  j["build"] = e.build;
  const ir::Graph& g = *e.model.graph;
  auto type_str = [&](const std::string& v) {
    auto it = g.value_types.find(v);
    return it == g.value_types.end() ? std::string("?") : it->second.str();
  };
  nlohmann::json layers = nlohmann::json::array();
  std::map<std::string, int> op_counts;
  // Reference layers with their share of the build's estimated run time (engine/reference_layers.cc).
  nlohmann::json reference = nlohmann::json::array();
  double estimated_ms = 0;
  if (e.build.contains("reference") && e.build["reference"].contains("estimated_ms"))
    estimated_ms = e.build["reference"]["estimated_ms"].get<double>();
  for (size_t i = 0; i < e.layers.size(); ++i) {
    const LayerInfo& l = e.layers[i];
    if (!l.reference.recorded || l.kernel != "reference") continue;
    nlohmann::json r = {{"layer", l.name},
                        {"op", l.op_type},
                        {"domain", l.domain},
                        {"opset", i < g.nodes.size() ? g.nodes[i].opset : 0},
                        {"reasons", l.reference.reasons},
                        {"shape_work", l.reference.shape_work}};
    if (l.reference.ms >= 0) {
      r["ms"] = l.reference.ms;
      if (estimated_ms > 0) r["share"] = l.reference.ms / estimated_ms;
    }
    reference.push_back(std::move(r));
  }
  // Body layers (If/Loop/Scan) on reference kernels, named by their path (engine/reference_layers.cc).
  if (e.build.contains("body_reference") && e.build["body_reference"].is_array())
    for (nlohmann::json r : e.build["body_reference"]) {
      if (r.contains("ms") && estimated_ms > 0) r["share"] = r["ms"].get<double>() / estimated_ms;
      r["body"] = true;
      reference.push_back(std::move(r));
    }
  j["reference_layers"] = reference;
  // Each layer's workspace: the most its kernel needs at the opt shapes or any profile's max shapes
  // (build["workspace"], engine/builder.cc); 0 for none and for engines of older builds.
  const nlohmann::json no_workspace = nlohmann::json::object();
  const nlohmann::json& ws_layers = e.build.contains("workspace") && e.build["workspace"].contains("layers")
                                        ? e.build["workspace"]["layers"]
                                        : no_workspace;
  auto workspace_of = [&](const std::string& name) -> size_t {
    return ws_layers.contains(name) ? ws_layers[name].get<size_t>() : 0;
  };
  // Layers on interpreted plugin kernels (Python's @kiln.custom_op): "slow" says so, with the plugin.
  SlowLayers slow_layers;
  if (e.build.contains("plugins") && e.build["plugins"].is_array())
    for (const auto& p : e.build["plugins"])
      if (p.value("slow", false))
        for (const auto& l : p.value("layers", nlohmann::json::array()))
          slow_layers[l.get<std::string>()] =
              "runs a slow interpreted kernel of plugin '" + p.value("name", "") + "'" +
              (p.value("origin", "") == plugin::kPythonOrigin ? " (a Python @kiln.custom_op, called under the GIL)"
                                                              : "") +
              ": for prototyping, not deployment";
  for (size_t li = 0; li < e.layers.size(); ++li) {
    const LayerInfo& l = e.layers[li];
    nlohmann::json ins = nlohmann::json::array(), outs = nlohmann::json::array();
    for (const auto& i : l.inputs) ins.push_back({{"name", i}, {"type", i.empty() ? "" : type_str(i)}});
    for (const auto& o : l.outputs) outs.push_back({{"name", o}, {"type", o.empty() ? "" : type_str(o)}});
    std::string op = l.domain.empty() ? l.op_type : l.domain + "." + l.op_type;
    ++op_counts[op];
    layers.push_back({{"name", l.name},
                      {"op", op},
                      {"kernel", l.kernel},
                      {"precision", l.precision},
                      {"candidates", candidates_json(l.candidates)},
                      {"reference", l.reference.recorded ? reference_json(l.reference) : nlohmann::json()},
                      {"sources", l.sources},
                      {"inputs", ins},
                      {"outputs", outs},
                      {"workspace_bytes", workspace_of(l.name)}});
    if (auto slow = slow_layers.find(l.name); slow != slow_layers.end()) layers.back()["slow"] = slow->second;
    if (li < g.nodes.size())
      if (nlohmann::json bodies = bodies_json(g.nodes[li], "", slow_layers); !bodies.empty())
        layers.back()["bodies"] = bodies;
  }
  j["layers"] = layers;
  j["layer_counts"] = op_counts;
  const BodyLayerCount body_layers = count_body_layers(g);
  j["body_layers"] = {{"layers", body_layers.layers}, {"with_tactic", body_layers.with_tactic}};
  j["memory"] = {{"arena_bytes", e.plan.arena_bytes},
                 {"naive_bytes", e.plan.naive_bytes},
                 {"in_place", e.plan.in_place},
                 {"dynamic_values", e.plan.dynamic.size()},
                 {"workspace", e.build.contains("workspace") ? e.build["workspace"] : nlohmann::json()}};
  nlohmann::json ins = nlohmann::json::array(), outs = nlohmann::json::array();
  for (const auto& i : g.inputs) ins.push_back({{"name", i.name}, {"type", i.type.str()}});
  for (const auto& o : g.outputs) outs.push_back({{"name", o.name}, {"type", o.type.str()}});
  j["inputs"] = ins;
  j["outputs"] = outs;
  // Profiles with the model's symbolic dims, and the activation memory planned at min / opt / max.
  nlohmann::json profiles = nlohmann::json::array();
  for (const auto& p : e.profiles) {
    nlohmann::json pins = nlohmann::json::array();
    for (const auto& [name, r] : p.inputs)
      pins.push_back(
          {{"name", name}, {"dims", input_signature(g, name)}, {"min", r.min}, {"opt", r.opt}, {"max", r.max}});
    profiles.push_back({{"name", p.name},
                        {"inputs", pins},
                        {"memory", {{"min", p.memory_min}, {"opt", p.memory_opt}, {"max", p.memory_max}}}});
  }
  j["profiles"] = profiles;
  size_t weight_bytes = 0;
  for (const auto& [k, t] : g.initializers) weight_bytes += t.nbytes();
  j["weights_bytes"] = weight_bytes;
  return j;
}

}  // namespace kiln::detail

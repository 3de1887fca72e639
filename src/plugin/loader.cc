// Loading plugin shared libraries (kiln/plugin.h): dlopen, the ABI checks, and the adapter from the C
// description to CustomOpDesc. Every struct is read through its struct_size: the fields an older
// plugin lacks read as zero, the fields of a newer one kiln does not know are ignored.
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "plugin/custom_ops.h"
#include "plugin/host_api.h"

namespace kiln::plugin {

namespace {

// The sizes of ABI 1.0's structs: the least a plugin may hand over (later minor versions only append).
constexpr size_t kMinPlugin = offsetof(kiln_plugin, ops) + sizeof(void*);
constexpr size_t kMinOp = offsetof(kiln_custom_op, kernels) + sizeof(void*);
constexpr size_t kMinKernel = offsetof(kiln_kernel, compute) + sizeof(void*);

// A copy of the plugin's struct `T` at `p` through its struct_size (zero past it, ignoring what is
// past ours).
template <typename T>
T read_struct(const T* p) {
  T out;
  std::memset(&out, 0, sizeof out);
  uint32_t size = 0;
  std::memcpy(&size, p, sizeof size);
  std::memcpy(&out, p, std::min<size_t>(size, sizeof out));
  return out;
}

std::string abi_str(uint32_t v) {
  return std::to_string(KILN_PLUGIN_ABI_MAJOR_OF(v)) + "." + std::to_string(KILN_PLUGIN_ABI_MINOR_OF(v));
}

bool valid_name(const char* s, const char* extra) {
  if (!s || !*s) return false;
  for (const char* c = s; *c; ++c)
    if (!std::isalnum(static_cast<unsigned char>(*c)) && *c != '_' && !std::strchr(extra, *c)) return false;
  return std::strlen(s) <= 128;
}

std::string failure(const kiln_error& e) { return e.set ? e.message : "failed (it set no message)"; }

// The C description of one op as a CustomOpDesc calling its function pointers.
Result<CustomOpDesc> adapt_op(const kiln_plugin& p, const kiln_custom_op* raw, int index, const std::string& what) {
  std::string at = what + ": op " + std::to_string(index);
  if (!raw) return InvalidArgument(at, " is a null pointer");
  uint32_t size = 0;
  std::memcpy(&size, raw, sizeof size);
  if (size < kMinOp)
    return InvalidArgument(at, ": struct_size ", size, " is smaller than kiln_custom_op of ABI 1.0 (", kMinOp,
                           " bytes)");
  kiln_custom_op op = read_struct(raw);
  if (!op.domain || !valid_name(op.op_type, ""))
    return InvalidArgument(at, ": domain or op_type is null or not a name ([A-Za-z0-9_]+)");
  CustomOpDesc d;
  d.plugin = p.name, d.plugin_version = p.version;
  d.domain = op.domain, d.op_type = op.op_type;
  at = what + ": op '" + (d.domain.empty() ? "ai.onnx" : d.domain) + "::" + d.op_type + "'";
  d.since_opset = op.since_opset, d.until_opset = op.until_opset;
  d.min_inputs = op.min_inputs, d.max_inputs = op.max_inputs;
  if (!op.infer) return InvalidArgument(at, ": infer is NULL (shape and type inference is required)");
  if (!op.serialize_state != !op.deserialize_state)
    return InvalidArgument(at, ": serialize_state and deserialize_state must both be set or both be NULL");
  auto destroy = op.destroy_state;
  auto wrap = [destroy](void* s) -> CustomOpDesc::State {
    if (!s) return nullptr;
    return CustomOpDesc::State(s, [destroy](const void* q) {
      if (destroy) destroy(const_cast<void*>(q));
    });
  };
  if (auto create = op.create_state)
    d.create_state = [create, wrap](const kiln_attrs* attrs, CustomOpDesc::State* state) -> std::string {
      kiln_error e;
      void* s = nullptr;
      if (create(attrs, &s, &e) != KILN_OK) return failure(e);
      *state = wrap(s);
      return "";
    };
  if (auto ser = op.serialize_state)
    d.serialize_state = [ser](const void* state, std::string* bytes) -> std::string {
      kiln_error e;
      kiln_buffer b{bytes};
      return ser(state, &b, &e) == KILN_OK ? "" : failure(e);
    };
  if (auto de = op.deserialize_state)
    d.deserialize_state = [de, wrap](const std::string& bytes, CustomOpDesc::State* state) -> std::string {
      kiln_error e;
      void* s = nullptr;
      if (de(bytes.data(), bytes.size(), &s, &e) != KILN_OK) return failure(e);
      *state = wrap(s);
      return "";
    };
  auto infer = op.infer;
  d.infer = [infer](const void* state, kiln_shape_ctx* shapes) -> std::string {
    kiln_error e;
    return infer(state, shapes, &e) == KILN_OK ? "" : failure(e);
  };
  if (op.num_kernels <= 0 || !op.kernels)
    return InvalidArgument(at, ": it has no kernels (num_kernels ", op.num_kernels, ")");
  for (int32_t k = 0; k < op.num_kernels; ++k) {
    const kiln_kernel* rk = op.kernels[k];
    std::string kat = at + ": kernel " + std::to_string(k);
    if (!rk) return InvalidArgument(kat, " is a null pointer");
    uint32_t ksize = 0;
    std::memcpy(&ksize, rk, sizeof ksize);
    if (ksize < kMinKernel)
      return InvalidArgument(kat, ": struct_size ", ksize, " is smaller than kiln_kernel of ABI 1.0 (", kMinKernel,
                             " bytes)");
    kiln_kernel kd = read_struct(rk);
    if (!valid_name(kd.name, "")) return InvalidArgument(kat, ": its name is null or not [A-Za-z0-9_]+");
    kat = at + ": kernel '" + kd.name + "'";
    if (!kd.compute) return InvalidArgument(kat, ": compute is NULL");
    CustomKernelDesc kernel;
    kernel.name = std::string(p.name) + "." + kd.name;
    kernel.device = kd.device;
    kernel.revision = kd.revision;
    if (auto sup = kd.supports)
      kernel.why_unsupported = [sup](const void* state, const kiln_shape_ctx* shapes) -> std::string {
        kiln_error e;
        return sup(state, shapes, &e) == KILN_OK ? "" : failure(e);
      };
    if (auto ws = kd.workspace_size)
      kernel.workspace_size = [ws](const void* state, const kiln_shape_ctx* shapes, int threads) {
        return ws(state, shapes, threads);
      };
    auto compute = kd.compute;
    kernel.compute = [compute](const void* state, const kiln_kernel_io& io) -> std::string {
      kiln_error e;
      return compute(state, &io, &e) == KILN_OK ? "" : failure(e);
    };
    d.kernels.push_back(std::move(kernel));
  }
  return d;
}

struct Loaded {
  std::mutex mu;
  std::map<std::string, std::string> by_path;  // real path -> plugin name
};
Loaded& loaded() {
  static Loaded* l = new Loaded;
  return *l;
}

}  // namespace

Result<PluginInfo> load_plugin_file(const std::string& path) {
  std::string what = "plugin '" + path + "'";
  char real[PATH_MAX];
  if (!::realpath(path.c_str(), real))
    return NotFound(what,
                    ": no such file (give the path of a shared library, e.g. build/plugins/"
                    "libkiln_square_plus.so)");
  std::string canonical = real;
  Loaded& L = loaded();
  std::lock_guard<std::mutex> lock(L.mu);
  if (auto it = L.by_path.find(canonical); it != L.by_path.end())
    if (const Provider* p = find_provider(it->second)) return info_of(*p);
  void* handle = ::dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = ::dlerror();
    return InvalidArgument(what, " cannot be loaded as a shared library: ", e ? e : "unknown dlopen error");
  }
  // From here on a failure closes the library: nothing of it was registered.
  auto fail = [&](Status s) -> Status {
    ::dlclose(handle);
    return s;
  };
  ::dlerror();
  void* sym = ::dlsym(handle, KILN_PLUGIN_INIT_SYMBOL);
  if (!sym)
    return fail(InvalidArgument(what, " is not a kiln plugin: it exports no '", KILN_PLUGIN_INIT_SYMBOL,
                                "' function (declare it with KILN_PLUGIN_EXPORT and extern \"C\", kiln/plugin.h)"));
  auto init = reinterpret_cast<kiln_plugin_init_fn>(sym);
  const kiln_plugin* raw = init(kiln::plugin_host_api());
  if (!raw)
    return fail(InvalidArgument(what, ": kiln_plugin_init returned NULL (the plugin refused to load into kiln ",
                                KILN_VERSION, ", plugin ABI ", abi_str(KILN_PLUGIN_ABI_VERSION), ")"));
  uint32_t header[2] = {0, 0};  // struct_size, abi_version: the fields every ABI version starts with
  std::memcpy(header, raw, sizeof header);
  if (KILN_PLUGIN_ABI_MAJOR_OF(header[1]) != KILN_PLUGIN_ABI_MAJOR)
    return fail(Unsupported(what, " was built for kiln plugin ABI ", abi_str(header[1]), "; this kiln (", KILN_VERSION,
                            ") loads ABI ", KILN_PLUGIN_ABI_MAJOR, ".x (up to ", abi_str(KILN_PLUGIN_ABI_VERSION),
                            " and newer minor versions) — rebuild the plugin against this kiln's kiln/plugin.h"));
  if (header[0] < kMinPlugin)
    return fail(InvalidArgument(what, ": its kiln_plugin struct_size ", header[0],
                                " is smaller than ABI 1.0's kiln_plugin (", kMinPlugin, " bytes)"));
  kiln_plugin p = read_struct(raw);
  if (!valid_name(p.name, ".-")) return fail(InvalidArgument(what, ": its name is null or not [A-Za-z0-9_.-]+"));
  what = "plugin '" + std::string(p.name) + "' (" + path + ")";
  if (!p.version || !std::isdigit(static_cast<unsigned char>(p.version[0])))
    return fail(InvalidArgument(what, ": its version is null or not MAJOR.MINOR.PATCH"));
  if (p.num_ops <= 0 || !p.ops) return fail(InvalidArgument(what, ": it describes no ops (num_ops ", p.num_ops, ")"));
  std::vector<CustomOpDesc> descs;
  for (int32_t i = 0; i < p.num_ops; ++i) {
    auto d = adapt_op(p, p.ops[i], i, what);
    if (!d.ok()) return fail(d.status());
    d.value().origin = canonical;
    descs.push_back(std::move(d).value());
  }
  for (const auto& d : descs)
    if (Status s = check_registrable(d); !s.ok()) return fail(s);
  for (auto& d : descs) {
    // Checked above: registration only fails here if two ops of this plugin clash with each other.
    if (Status s = register_op(std::move(d)); !s.ok()) return s;  // the library stays: some ops are in
  }
  L.by_path[canonical] = p.name;
  const Provider* prov = find_provider(p.name);
  return prov ? info_of(*prov) : PluginInfo{p.name, p.version, canonical, {}, {}};
}

Status load_env_plugins_once() {
  static std::mutex mu;
  static bool done = false;
  static Status result;
  std::lock_guard<std::mutex> lock(mu);
  if (done) return result;
  done = true;
  const char* env = std::getenv("KILN_PLUGIN_PATH");
  if (!env || !*env) return result;
  std::string s = env;
  for (size_t start = 0; start <= s.size();) {
    size_t end = s.find(':', start);
    if (end == std::string::npos) end = s.size();
    std::string entry = s.substr(start, end - start);
    start = end + 1;
    if (entry.empty()) continue;
    std::vector<std::string> files;
    struct stat st;
    if (::stat(entry.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      if (DIR* dir = ::opendir(entry.c_str())) {
        while (dirent* de = ::readdir(dir)) {
          std::string f = de->d_name;
          if (f.size() > 3 && f.compare(f.size() - 3, 3, ".so") == 0) files.push_back(entry + "/" + f);
        }
        ::closedir(dir);
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(entry);
    }
    for (const auto& f : files) {
      auto r = load_plugin_file(f);
      if (!r.ok()) {
        result = r.status().with_context("KILN_PLUGIN_PATH: ");
        return result;
      }
    }
  }
  return result;
}

}  // namespace kiln::plugin

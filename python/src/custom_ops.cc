// Python's @kiln.custom_op (python/kiln/custom_op.py): a custom op whose shape function and kernel are
// Python callables, registered through the public C++ path (kiln::register_custom_op, plugin "python",
// origin "python", slow) like any plugin op. The engine runs with the GIL released, so every callback
// takes it first; they see the node through kiln::plugin_host_api(), as shared-library plugins do.
//
// The state of a node is its attributes read into C++ values (no Python object: states are freed
// by kiln's threads and after the interpreter stops); each call hands them to Python as a dict.
// Python's side (custom_op.py) normalizes what the user's functions return and turns an exception
// into its traceback's text, which the callbacks return as the failure kiln reports with the node.
#include "custom_ops.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cctype>
#include <cstring>
#include <map>
#include <memory>
#include <type_traits>
#include <variant>

#include "arrays.h"
#include "kiln/custom_op.h"

namespace kiln::python {
namespace {

// One attribute of a node: ONNX's AttributeType code and its value.
struct AttrValue {
  std::string name;
  int32_t type = 0;
  std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>, std::vector<std::string>> value;
};
using NodeAttrs = std::vector<AttrValue>;

// The provider and origin of every Python op (engines record it; kiln's messages recognize it).
constexpr const char* kPythonPlugin = "python";

enum : int32_t { kFloat = 1, kInt = 2, kString = 3, kFloats = 6, kInts = 7, kStrings = 8 };

const char* attr_type_name(int32_t t) {
  static const char* names[] = {"UNDEFINED",      "FLOAT",     "INT",     "STRING",  "TENSOR", "GRAPH",
                                "FLOATS",         "INTS",      "STRINGS", "TENSORS", "GRAPHS", "SPARSE_TENSOR",
                                "SPARSE_TENSORS", "TYPE_PROTO"};
  return t >= 0 && t < 14 ? names[t] : "?";
}

// Reads every attribute of the node through the host's accessors (ABI 1.1).
std::string read_attrs(const kiln_host_api* host, const kiln_attrs* a, NodeAttrs* out) {
  const int32_t n = host->num_attrs(a);
  for (int32_t i = 0; i < n; ++i) {
    AttrValue v;
    v.name = host->attr_name(a, i);
    v.type = host->attr_type(a, v.name.c_str());
    const char* name = v.name.c_str();
    switch (v.type) {
      case kInt: {
        int64_t x = 0;
        host->attr_int(a, name, &x);
        v.value = x;
        break;
      }
      case kFloat: {
        float x = 0;
        host->attr_float(a, name, &x);
        v.value = x;
        break;
      }
      case kString: {
        const char* d = nullptr;
        size_t size = 0;
        host->attr_string(a, name, &d, &size);
        v.value = std::string(d ? d : "", size);
        break;
      }
      case kInts: {
        const int64_t* d = nullptr;
        size_t count = 0;
        host->attr_ints(a, name, &d, &count);
        v.value = std::vector<int64_t>(d, d + count);
        break;
      }
      case kFloats: {
        const float* d = nullptr;
        size_t count = 0;
        host->attr_floats(a, name, &d, &count);
        v.value = std::vector<float>(d, d + count);
        break;
      }
      case kStrings: {
        size_t count = 0;
        host->attr_strings(a, name, 0, nullptr, nullptr, &count);
        std::vector<std::string> s(count);
        for (size_t k = 0; k < count; ++k) {
          const char* d = nullptr;
          size_t size = 0;
          host->attr_strings(a, name, k, &d, &size, nullptr);
          s[k].assign(d ? d : "", size);
        }
        v.value = std::move(s);
        break;
      }
      default:
        return "attribute '" + v.name + "' is of type " + attr_type_name(v.type) +
               "; Python custom ops take INT, FLOAT, STRING, INTS, FLOATS and STRINGS attributes";
    }
    out->push_back(std::move(v));
  }
  return "";
}

py::dict attrs_dict(const void* state) {
  py::dict d;
  if (!state) return d;
  for (const auto& a : *static_cast<const NodeAttrs*>(state))
    std::visit(
        [&](const auto& x) {
          if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::string>)
            d[py::str(a.name)] = py::bytes(x).attr("decode")("utf-8", "surrogateescape");
          else
            d[py::str(a.name)] = py::cast(x);
        },
        a.value);
  return d;
}

// The Python functions of one op. Re-registering the op from Python swaps them (an edited prototype);
// the registry keeps the slot (and kiln the op) for the process's life.
struct Slot {
  PyObject* infer = nullptr;   // custom_op.py's _infer_adapter: (inputs, attrs) -> [(dtype, dims)] or str
  PyObject* kernel = nullptr;  // custom_op.py's _kernel_adapter: (inputs, attrs, expected) -> [arrays] or str
};

std::map<std::string, Slot*>& slots() {
  static auto* s = new std::map<std::string, Slot*>;  // never destroyed: kiln's registry calls into its slots
  return *s;
}

PluginInfo python_info() {
  for (const auto& p : loaded_plugins())
    if (p.name == kPythonPlugin) return p;
  return {};
}

// Runs `f` holding the GIL; a Python exception that escapes the adapters becomes its message.
template <typename F>
std::string with_gil(F&& f) {
  if (!Py_IsInitialized()) return "the Python interpreter has stopped; Python custom ops cannot run";
  py::gil_scoped_acquire gil;
  try {
    return f();
  } catch (py::error_already_set& e) {
    return std::string("Python raised ") + e.what();
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string call_infer(const Slot* slot, const void* state, kiln_shape_ctx* shapes) {
  const kiln_host_api* host = plugin_host_api();
  return with_gil([&]() -> std::string {
    const int32_t n = host->num_inputs(shapes);
    py::list inputs;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t dt = host->input_dtype(shapes, i), rank = host->input_rank(shapes, i);
      if (dt == KILN_DTYPE_UNDEFINED && rank < 0) {
        inputs.append(py::none());  // absent (or not known yet)
        continue;
      }
      py::object dtype = py::none();
      const std::string name = dtype_name_of(dt);
      if (!name.empty()) dtype = py::dtype(name);
      py::object dims = py::none();
      if (rank >= 0) {
        py::list d;
        for (int32_t k = 0; k < rank; ++k) d.append(host->input_dim(shapes, i, k));
        dims = d;
      }
      inputs.append(py::make_tuple(dtype, dims));
    }
    py::object r = py::reinterpret_borrow<py::object>(slot->infer)(inputs, attrs_dict(state));
    if (py::isinstance<py::str>(r)) return r.cast<std::string>();
    const auto outs = r.cast<std::vector<std::pair<py::object, std::vector<py::object>>>>();
    const int32_t node_outputs = host->num_outputs(shapes);
    if (static_cast<int32_t>(outs.size()) < node_outputs)
      return "the shape function gave " + std::to_string(outs.size()) + " output shape(s); the node has " +
             std::to_string(node_outputs) + " outputs";
    for (int32_t o = 0; o < node_outputs; ++o) {
      const auto& [dtype, dims] = outs[o];
      const DataTypeCode code = dtype_code(py::dtype::from_args(dtype));
      if (!code)
        return "output " + std::to_string(o) + ": dtype " + py::str(dtype).cast<std::string>() + " is not one kiln has";
      if (host->set_output_type(shapes, o, code, static_cast<int32_t>(dims.size())) != KILN_OK)
        return "output " + std::to_string(o) + ": cannot set its type (dtype " + py::str(dtype).cast<std::string>() +
               ", rank " + std::to_string(dims.size()) + ")";
      for (size_t k = 0; k < dims.size(); ++k) {
        const int32_t axis = static_cast<int32_t>(k);
        int ok = KILN_OK;
        if (py::isinstance<py::tuple>(dims[k])) {  // (input, axis): that input's dim, symbol included
          auto [in, in_axis] = dims[k].cast<std::pair<int32_t, int32_t>>();
          ok = host->copy_input_dim(shapes, o, axis, in, in_axis);
        } else {
          ok = host->set_output_dim(shapes, o, axis, dims[k].cast<int64_t>());
        }
        if (ok != KILN_OK) return "output " + std::to_string(o) + ": cannot set dim " + std::to_string(k);
      }
    }
    return "";
  });
}

// An input of a kernel call as a read-only numpy view of kiln's buffer (valid during the call).
py::object input_view(const kiln_tensor& t, int index) {
  if (t.dtype == KILN_DTYPE_UNDEFINED) return py::none();
  py::dtype dt = numpy_dtype(t.dtype, "input " + std::to_string(index));
  std::vector<py::ssize_t> shape(t.dims, t.dims + t.rank);
  static char no_data;  // an empty tensor may have no buffer; a capsule needs a pointer
  void* data = t.data ? t.data : &no_data;
  py::array a(dt, shape, data, py::capsule(data, [](void*) {}));  // a base: a view, not a copy
  a.attr("setflags")(py::arg("write") = false);
  return std::move(a);
}

std::string call_kernel(const Slot* slot, const void* state, const kiln_kernel_io& io) {
  return with_gil([&]() -> std::string {
    py::list inputs, expected;
    for (int32_t i = 0; i < io.num_inputs; ++i) inputs.append(input_view(io.inputs[i], i));
    for (int32_t o = 0; o < io.num_outputs; ++o) {
      const kiln_tensor& t = io.outputs[o];
      if (!t.data && t.dtype == KILN_DTYPE_UNDEFINED) {
        expected.append(py::none());
        continue;
      }
      expected.append(py::make_tuple(numpy_dtype(t.dtype, "output " + std::to_string(o)),
                                     py::tuple(py::cast(std::vector<int64_t>(t.dims, t.dims + t.rank)))));
    }
    py::object r = py::reinterpret_borrow<py::object>(slot->kernel)(inputs, attrs_dict(state), expected);
    if (py::isinstance<py::str>(r)) return r.cast<std::string>();
    py::list results = r.cast<py::list>();
    for (int32_t o = 0; o < io.num_outputs && o < static_cast<int32_t>(results.size()); ++o) {
      if (results[o].is_none()) continue;
      py::array a = results[o].cast<py::array>();
      const kiln_tensor& t = io.outputs[o];
      // The adapter made it C-contiguous, of the output's dtype and shape: check rather than trust.
      if (dtype_code(a.dtype()) != t.dtype || static_cast<size_t>(a.nbytes()) != t.nbytes ||
          !(a.flags() & py::array::c_style))
        return "output " + std::to_string(o) + ": the kernel's array does not match the output kiln allocated";
      if (t.nbytes) std::memcpy(t.data, a.data(), t.nbytes);
    }
    return "";
  });
}

// "my.domain" "MyOp" -> "python.my_domain.MyOp": the op's one kernel, a tactic name.
std::string kernel_name(const std::string& domain, const std::string& op_type) {
  std::string d = domain.empty() ? "ai_onnx" : domain;
  for (char& c : d)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return "python." + d + "." + op_type;
}

// Registers (domain, op_type) with Python callables `infer` and `kernel` (the adapters of
// custom_op.py), or swaps the callables of an op registered before from Python.
PluginInfo register_python_op(const std::string& domain, const std::string& op_type, int since_opset, int until_opset,
                              int min_inputs, int max_inputs, py::object infer, py::object kernel) {
  const std::string key = (domain.empty() ? "ai.onnx" : domain) + "::" + op_type;
  auto& by_op = slots();  // guarded by the GIL (callbacks read a slot's callables holding it too)
  if (auto it = by_op.find(key); it != by_op.end()) {
    Slot* slot = it->second;
    PyObject* old_infer = slot->infer;
    PyObject* old_kernel = slot->kernel;
    slot->infer = infer.release().ptr(), slot->kernel = kernel.release().ptr();
    Py_XDECREF(old_infer), Py_XDECREF(old_kernel);  // a call under way holds its own reference
    return python_info();
  }
  auto slot = std::make_unique<Slot>();
  slot->infer = infer.release().ptr();
  slot->kernel = kernel.release().ptr();
  const Slot* sp = slot.get();
  const kiln_host_api* host = plugin_host_api();

  CustomOpDesc d;
  d.plugin = kPythonPlugin, d.plugin_version = "1.0.0", d.origin = kPythonPlugin;
  d.slow = true;
  d.domain = domain, d.op_type = op_type;
  d.since_opset = since_opset, d.until_opset = until_opset;
  d.min_inputs = min_inputs, d.max_inputs = max_inputs;
  d.create_state = [host](const kiln_attrs* a, CustomOpDesc::State* state) -> std::string {
    auto attrs = std::make_shared<NodeAttrs>();
    std::string err = read_attrs(host, a, attrs.get());
    if (err.empty()) *state = attrs;
    return err;
  };
  d.infer = [sp](const void* state, kiln_shape_ctx* shapes) { return call_infer(sp, state, shapes); };
  CustomKernelDesc k;
  k.name = kernel_name(domain, op_type);
  k.compute = [sp](const void* state, const kiln_kernel_io& io) { return call_kernel(sp, state, io); };
  d.kernels.push_back(std::move(k));
  {
    py::gil_scoped_release unlocked;   // kiln's registry lock: never taken while holding the GIL
    register_custom_op(std::move(d));  // throws kiln::Error naming the conflict (the slot then leaks)
  }
  by_op[key] = slot.release();
  return python_info();
}

}  // namespace

void bind_custom_ops(py::module_& m) {
  py::class_<PluginInfo>(m, "PluginInfo", "A loaded plugin (or Python's custom ops): name, version, path, ops")
      .def_readonly("name", &PluginInfo::name)
      .def_readonly("version", &PluginInfo::version)
      .def_readonly("path", &PluginInfo::path, "the shared library's path; \"python\" for @kiln.custom_op ops")
      .def_readonly("ops", &PluginInfo::ops, "\"domain::OpType\" of each op")
      .def_readonly("kernels", &PluginInfo::kernels, "the kernels' tactic names")
      .def("__repr__", [](const PluginInfo& p) {
        return "PluginInfo(name=" + py::repr(py::str(p.name)).cast<std::string>() +
               ", version=" + py::repr(py::str(p.version)).cast<std::string>() +
               ", path=" + py::repr(py::str(p.path)).cast<std::string>() +
               ", ops=" + py::repr(py::cast(p.ops)).cast<std::string>() + ")";
      });
  m.def(
      "load_plugin",
      [](const std::string& path) {
        py::gil_scoped_release unlocked;
        return load_plugin(path);
      },
      py::arg("path"),
      "Loads a custom-op plugin (a shared library implementing kiln/plugin.h) and registers its ops; "
      "returns its PluginInfo. Loading the same file again returns its info.");
  m.def(
      "loaded_plugins",
      [] {
        py::gil_scoped_release unlocked;
        return loaded_plugins();
      },
      "Every plugin loaded so far (\"python\" holds the @kiln.custom_op ops)");
  m.def("_register_custom_op", &register_python_op, py::arg("domain"), py::arg("op_type"), py::arg("since_opset"),
        py::arg("until_opset"), py::arg("min_inputs"), py::arg("max_inputs"), py::arg("infer"), py::arg("kernel"));
}

}  // namespace kiln::python

// kiln._kiln: pybind11 bindings over the public C++ API (include/kiln/*.h); the package python/kiln
// wraps them (kiln.build's keyword arguments, kiln.compare, the ONNX Runtime drop-in). The GIL is
// released while an engine builds, loads, saves or runs and while compare runs, so Python threads
// run contexts concurrently; Python custom ops (custom_ops.cc) take it back in their callbacks.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "arrays.h"
#include "custom_ops.h"
#include "engine/engine_impl.h"
#include "kiln/compare.h"
#include "kiln/kiln.h"
#include "tools/build_flags.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

// kiln.Error and one subclass per ErrorCategory (see errors in python/kiln/__init__.py).
struct ErrorTypes {
  PyObject* base = nullptr;
  PyObject* by_category[8] = {};
};
ErrorTypes g_errors;

PyObject* new_error_type(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  std::string qualified = std::string("kiln.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (!t) throw py::error_already_set();
  m.add_object(name, py::handle(t));
  return t;
}

void register_errors(py::module_& m) {
  g_errors.base = new_error_type(m, "Error", PyExc_RuntimeError, "Base of every kiln error; the message is the CLI's.");
  auto sub = [&](ErrorCategory c, const char* name, PyObject* also, const char* doc) {
    PyObject* bases = also ? PyTuple_Pack(2, g_errors.base, also) : PyTuple_Pack(1, g_errors.base);
    g_errors.by_category[static_cast<int>(c)] = new_error_type(m, name, bases, doc);
    Py_DECREF(bases);
  };
  sub(ErrorCategory::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError,
      "A bad argument: a flag, an input's name, dtype or size (CLI exit code 3).");
  sub(ErrorCategory::kInvalidModel, "InvalidModelError", nullptr, "A malformed model or engine file (exit code 3).");
  sub(ErrorCategory::kUnsupported, "UnsupportedError", nullptr,
      "Valid, but kiln cannot do it: an op, a dtype, an attribute (exit code 4).");
  sub(ErrorCategory::kNotFound, "NotFoundError", nullptr, "A file, name or value is missing (exit code 3).");
  sub(ErrorCategory::kIOError, "IOError", PyExc_OSError, "Reading or writing failed (exit code 3).");
  sub(ErrorCategory::kOutOfRange, "ShapeError", nullptr,
      "A shape outside every optimization profile, or a size out of range (exit code 3).");
  sub(ErrorCategory::kInternal, "InternalError", nullptr, "A bug in kiln (exit code 5).");
  sub(ErrorCategory::kDeadlineExceeded, "DeadlineExceededError", nullptr, "A run passed its deadline (exit code 6).");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      int c = static_cast<int>(e.category());
      PyObject* t = c >= 0 && c < 8 && g_errors.by_category[c] ? g_errors.by_category[c] : g_errors.base;
      PyErr_SetString(t, e.what());
    }
  });
}

// An input's or output's description: name, dtype, and dims as ints, with the symbol's name (str) for
// a dynamic dim that has one and None for one that has not.
struct TensorInfo {
  std::string name;
  DataTypeCode code = 0;
  std::vector<int64_t> dims;
  std::vector<std::string> symbols;
};

py::tuple shape_tuple(const TensorInfo& t) {
  py::tuple out(t.dims.size());
  for (size_t i = 0; i < t.dims.size(); ++i) {
    if (t.dims[i] >= 0)
      out[i] = py::int_(t.dims[i]);
    else if (i < t.symbols.size() && !t.symbols[i].empty())
      out[i] = py::str(t.symbols[i]);
    else
      out[i] = py::none();
  }
  return out;
}

std::vector<TensorInfo> infos(const std::vector<TensorDesc>& descs) {
  std::vector<TensorInfo> out;
  for (const auto& d : descs) out.push_back({d.name, d.dtype, d.shape, d.dim_names});
  return out;
}

std::shared_ptr<Engine> build(const std::string& source, bool from_bytes, const std::string& flags_json) {
  tools::BuildFlags flags = nlohmann::json::parse(flags_json).get<tools::BuildFlags>();
  py::gil_scoped_release unlocked;
  auto cfg = tools::builder_config(flags);
  if (!cfg.ok()) detail::throw_error(cfg.status());
  Builder builder(std::move(cfg).value());
  return from_bytes ? builder.build_from_memory(source) : builder.build_from_file(source);
}

py::dict run(ExecutionContext& ctx, const py::dict& feeds, bool copy) {
  for (const auto& [key, value] : feeds) bind_input(ctx, py::str(key).cast<std::string>(), value);
  {
    py::gil_scoped_release unlocked;
    ctx.run();
  }
  py::dict out;
  for (const auto& name : ctx.output_names()) out[py::str(name)] = output_array(ctx, name, copy);
  return out;
}

// The C++ API's cost of one run with these inputs (set_input_shared per input, run, output per output),
// timed in C++ over `iterations` runs: the baseline of bench/python_overhead.py. Seconds per run.
double time_cpp_runs(ExecutionContext& ctx, const py::dict& feeds, int iterations) {
  std::vector<std::pair<std::string, HostTensor>> inputs;
  std::vector<py::array> keep;
  for (const auto& [key, value] : feeds) {
    py::array a = py::array::ensure(value, py::array::c_style);
    keep.push_back(a);
    HostTensor t = HostTensor::borrow(dtype_code(a.dtype()), std::vector<int64_t>(a.shape(), a.shape() + a.ndim()),
                                      a.data(), static_cast<size_t>(a.nbytes()));
    inputs.emplace_back(py::str(key).cast<std::string>(), std::move(t));
  }
  const std::vector<std::string> names = ctx.output_names();
  py::gil_scoped_release unlocked;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    for (const auto& [name, t] : inputs) ctx.set_input_shared(name, t);
    ctx.run();
    for (const auto& n : names) {
      HostTensor h = ctx.output(n);
      if (!h.data && h.nbytes) throw Error(ErrorCategory::kInternal, "output without data");
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / std::max(iterations, 1);
}

}  // namespace
}  // namespace kiln::python

PYBIND11_MODULE(_kiln, m) {
  using namespace kiln;
  using namespace kiln::python;
  m.doc() = "kiln's C++ API (use the kiln package, which wraps this module)";
  register_errors(m);
  bind_custom_ops(m);

  py::class_<TensorInfo>(m, "TensorInfo", "An engine input or output: name, dtype and (symbolic) shape")
      .def_readonly("name", &TensorInfo::name)
      .def_property_readonly("dtype",
                             [](const TensorInfo& t) -> py::object {
                               std::string n = dtype_name_of(t.code);
                               return n.empty() ? py::object(py::none()) : py::object(py::dtype(n));
                             })
      .def_property_readonly("shape", &shape_tuple)
      .def_property_readonly("type", [](const TensorInfo& t) { return onnx_type_string(t.code); })
      .def_readonly("dtype_code", &TensorInfo::code)
      .def("__repr__", [](const TensorInfo& t) {
        return "TensorInfo(name=" + py::repr(py::str(t.name)).cast<std::string>() +
               ", type=" + onnx_type_string(t.code) + ", shape=" + py::repr(shape_tuple(t)).cast<std::string>() + ")";
      });

  py::class_<ExecutionContext>(m, "ExecutionContext", "Per-run state of an engine; one per thread")
      .def("run", &run, py::arg("feeds"), py::arg("copy") = true)
      .def("set_profile", &ExecutionContext::set_profile, py::arg("index"), py::call_guard<py::gil_scoped_release>())
      .def("set_input_shape", &ExecutionContext::set_input_shape, py::arg("name"), py::arg("shape"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("profile_index", &ExecutionContext::profile_index)
      .def("output_shape", &ExecutionContext::output_shape, py::arg("name"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("output_names", &ExecutionContext::output_names)
      .def_property_readonly("activation_bytes", &ExecutionContext::activation_bytes)
      .def_property_readonly("arena_bytes", &ExecutionContext::arena_bytes)
      // A CUDA engine's input in the caller's device memory (e.g. torch: t.data_ptr(), t.shape,
      // t.numel() * t.element_size(), stream=torch.cuda.current_stream().cuda_stream): read by every later
      // run(); the context's stream waits for the work queued on `stream` (kiln.h states the contract).
      .def(
          "set_input_device",
          [](ExecutionContext& ctx, const std::string& name, uintptr_t ptr, std::vector<int64_t> shape, int dtype_code,
             size_t nbytes, int device, uintptr_t stream) {
            DeviceTensor t;
            t.dtype = dtype_code, t.shape = std::move(shape), t.data = reinterpret_cast<void*>(ptr);
            t.nbytes = nbytes, t.device = {DeviceKind::kCUDA, device}, t.stream = reinterpret_cast<void*>(stream);
            ctx.set_input_device(name, t);
          },
          py::arg("name"), py::arg("ptr"), py::arg("shape"), py::arg("dtype_code"), py::arg("nbytes"),
          py::arg("device") = 0, py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>())
      .def("_time_cpp_runs", &time_cpp_runs, py::arg("feeds"), py::arg("iterations"));

  py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine", "A built engine (immutable; contexts run it)")
      .def_static(
          "load",
          [](const std::string& path) {
            py::gil_scoped_release unlocked;
            return Engine::load(path);
          },
          py::arg("path"))
      .def_static(
          "deserialize",
          [](const py::bytes& b) {
            std::string s = b;
            py::gil_scoped_release unlocked;
            return Engine::deserialize(s);
          },
          py::arg("data"))
      .def(
          "save",
          [](const Engine& e, const std::string& path) {
            py::gil_scoped_release unlocked;
            e.save(path);
          },
          py::arg("path"))
      .def("serialize", [](const Engine& e) { return py::bytes(e.serialize()); })
      .def_property_readonly("inputs", [](const Engine& e) { return infos(e.inputs()); })
      .def_property_readonly("outputs", [](const Engine& e) { return infos(e.outputs()); })
      .def("_profiles",
           [](const Engine& e) {
             py::list out;
             for (const auto& p : e.profiles()) {
               py::dict inputs;
               for (const auto& [name, r] : p.inputs)
                 inputs[py::str(name)] =
                     py::make_tuple(py::tuple(py::cast(r.min)), py::tuple(py::cast(r.opt)), py::tuple(py::cast(r.max)));
               py::dict d;
               d["name"] = p.name;
               d["inputs"] = inputs;
               d["memory_min"] = p.memory_min;
               d["memory_opt"] = p.memory_opt;
               d["memory_max"] = p.memory_max;
               out.append(d);
             }
             return out;
           })
      .def("_inspect_json", &Engine::inspect_json)
      // Without the GIL: preparing layers may call Python custom ops' callbacks on kiln's threads.
      .def(
          "create_context", [](const Engine& e) { return e.create_context(); },
          py::call_guard<py::gil_scoped_release>());

  m.def("_build", &build, py::arg("source"), py::arg("from_bytes"), py::arg("flags_json"));
  m.def(
      "_compare_json",
      [](const std::vector<std::string>& args) {
        py::gil_scoped_release unlocked;
        return compare_json(args);
      },
      py::arg("args"));
  m.def("set_threads", &set_threads, py::arg("n"),
        "Threads for every kernel of this process (n <= 0: the default, OMP_NUM_THREADS or one per core)");
  m.def("threads", &threads, "The current kernel thread count");
  m.def("version", &version, "kiln's version string");
}

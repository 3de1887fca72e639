#include "arrays.h"

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace kiln::python {

namespace {

struct DtypeRow {
  DataTypeCode code;
  const char* numpy;  // numpy's name, nullptr: no numpy type
  const char* onnx;   // ONNX Runtime's type string
};
// ONNX TensorProto.DataType codes.
constexpr DtypeRow kDtypes[] = {
    {1, "float32", "tensor(float)"},    {2, "uint8", "tensor(uint8)"},     {3, "int8", "tensor(int8)"},
    {4, "uint16", "tensor(uint16)"},    {5, "int16", "tensor(int16)"},     {6, "int32", "tensor(int32)"},
    {7, "int64", "tensor(int64)"},      {8, nullptr, "tensor(string)"},    {9, "bool", "tensor(bool)"},
    {10, "float16", "tensor(float16)"}, {11, "float64", "tensor(double)"}, {12, "uint32", "tensor(uint32)"},
    {13, "uint64", "tensor(uint64)"},   {16, nullptr, "tensor(bfloat16)"},
};

const DtypeRow* row_of(DataTypeCode code) {
  for (const auto& r : kDtypes)
    if (r.code == code) return &r;
  return nullptr;
}

}  // namespace

py::dtype numpy_dtype(DataTypeCode code, const std::string& what) {
  const DtypeRow* r = row_of(code);
  if (!r || !r->numpy)
    throw Error(ErrorCategory::kUnsupported, what + " has element type " + onnx_type_string(code) +
                                                 ", which numpy has no type for (the Python module takes and "
                                                 "returns numeric and bool tensors)");
  return py::dtype(r->numpy);
}

DataTypeCode dtype_code(const py::dtype& dt) {
  // By kind and size (no dtype objects made on the run path); kiln's tensors are in native byte order.
  const char order = dt.byteorder();
  if (order == '>') return 0;  // x86 and ARM Linux are little-endian: '>' is foreign, '<' '=' '|' native
  const auto size = dt.itemsize();
  switch (dt.kind()) {
    case 'b': return 9;
    case 'f': return size == 4 ? 1 : size == 8 ? 11 : size == 2 ? 10 : 0;
    case 'i': return size == 1 ? 3 : size == 2 ? 5 : size == 4 ? 6 : size == 8 ? 7 : 0;
    case 'u': return size == 1 ? 2 : size == 2 ? 4 : size == 4 ? 12 : size == 8 ? 13 : 0;
    default: return 0;
  }
}

std::string onnx_type_string(DataTypeCode code) {
  const DtypeRow* r = row_of(code);
  return r ? r->onnx : "tensor(code " + std::to_string(code) + ")";
}

std::string dtype_name_of(DataTypeCode code) {
  const DtypeRow* r = row_of(code);
  return r && r->numpy ? r->numpy : "";
}

void bind_input(ExecutionContext& ctx, const std::string& name, const py::handle& value) {
  py::array arr = py::array::ensure(value);
  if (!arr) throw Error(ErrorCategory::kInvalidArgument, "input '" + name + "': not convertible to a numpy array");
  if (!(arr.flags() & py::array::c_style) || !(arr.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_))
    arr = py::array::ensure(arr, py::array::c_style | py::array::forcecast);  // one copy, C order
  const DataTypeCode code = dtype_code(arr.dtype());
  if (code == 0)
    throw Error(
        ErrorCategory::kInvalidArgument,
        "input '" + name + "': numpy dtype " + py::str(arr.dtype()).cast<std::string>() + " has no kiln element type");
  HostTensor t;
  t.dtype = code;
  t.shape.assign(arr.shape(), arr.shape() + arr.ndim());
  t.nbytes = static_cast<size_t>(arr.nbytes());
  // The context owns a reference to the array while it holds the input; it may drop it on any thread
  // (the deleter takes the GIL).
  auto* owner = new py::object(arr);
  t.data = std::shared_ptr<const void>(arr.data(), [owner](const void*) {
    py::gil_scoped_acquire gil;
    delete owner;
  });
  ctx.set_input_shared(name, std::move(t));
}

py::array output_array(const ExecutionContext& ctx, const std::string& name, bool copy) {
  HostTensor h = ctx.output(name);
  py::dtype dt = numpy_dtype(h.dtype, "output '" + name + "'");
  std::vector<py::ssize_t> shape(h.shape.begin(), h.shape.end());
  if (copy) {
    py::array out(dt, shape);
    if (h.nbytes) std::memcpy(out.mutable_data(), h.data.get(), h.nbytes);
    return out;
  }
  // A view: the capsule keeps the context's bytes alive (never freed under the array); the next run
  // overwrites them, so the view is read-only.
  auto* keep = new HostTensor(std::move(h));
  py::capsule base(keep, [](void* p) { delete static_cast<HostTensor*>(p); });
  py::array view(dt, shape, keep->data.get(), base);
  py::detail::array_proxy(view.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return view;
}

}  // namespace kiln::python

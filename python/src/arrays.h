// numpy <-> kiln tensors for the Python module: dtype codes both ways, inputs bound without a copy
// where the layout allows, outputs copied or viewed.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "kiln/kiln.h"

namespace kiln::python {

namespace py = pybind11;

// numpy's dtype for an ONNX element type code; throws kiln::Error (kUnsupported) for types numpy
// lacks (bfloat16, strings), naming `what`.
py::dtype numpy_dtype(DataTypeCode code, const std::string& what);
// The ONNX code of a numpy dtype, or 0 when kiln has none.
DataTypeCode dtype_code(const py::dtype& dt);
// ONNX Runtime's type string: "tensor(float)", "tensor(int64)", ...
std::string onnx_type_string(DataTypeCode code);
// The name numpy and the CLI give a dtype ("float32"), "" when unknown.
std::string dtype_name_of(DataTypeCode code);

// Binds `value` (a numpy array or anything np.asarray takes) as input `name`: a C-contiguous array of a
// kiln dtype is shared with the context (ExecutionContext::set_input_shared: no copy when 64-byte
// aligned), anything else is converted first (one copy). Needs the GIL.
void bind_input(ExecutionContext& ctx, const std::string& name, const py::handle& value);
// Output `name` of the last run as a new array (copy) or as a read-only view of the context's memory,
// valid until the context's next run (view). Needs the GIL.
py::array output_array(const ExecutionContext& ctx, const std::string& name, bool copy);

}  // namespace kiln::python

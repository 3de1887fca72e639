// What the opaque handles of kiln/plugin.h are inside kiln, and the host table (plugin_host_api) that
// gives plugins their accessors. The shape context is made from an InferContext (import and build:
// symbolic dims, constants), a LayerSignature (a tactic's supports check) or concrete tensors (before
// every kernel call), so one infer callback serves them all.
#pragma once

#include <string>
#include <vector>

#include "backends/tactic.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "ir/graph.h"
#include "kiln/plugin.h"
#include "ops/registry.h"

struct kiln_error {
  std::string message;
  bool set = false;
};

struct kiln_attrs {
  const kiln::ir::Node* node = nullptr;
};

struct kiln_buffer {
  std::string* bytes = nullptr;
};

struct kiln_shape_ctx {
  struct Input {
    bool present = false;
    int32_t dtype = 0;
    int32_t rank = -1;            // -1: unknown
    std::vector<kiln::Dim> dims;  // rank entries when known
    const kiln::Tensor* constant = nullptr;
    kiln_tensor constant_view{};
  };
  struct Output {
    bool set = false;
    int32_t dtype = 0;
    std::vector<kiln::Dim> dims;
  };
  std::vector<Input> inputs;
  std::vector<Output> outputs;
  bool writable = false;  // infer only

  static kiln_shape_ctx from_infer(const kiln::ops::InferContext& ctx);
  static kiln_shape_ctx from_signature(const kiln::backends::LayerSignature& sig);
  // Concrete tensors (nullptr: absent); `outputs` is the node's output count.
  static kiln_shape_ctx from_tensors(const std::vector<const kiln::Tensor*>& inputs, size_t outputs);
};

namespace kiln::plugin {

// The C view of a tensor (dims alias the tensor's shape).
kiln_tensor tensor_view(const Tensor& t);
// Output o as an IR type (the importer's inference), or an error naming it when infer left it unset.
Result<ir::TypeInfo> output_type(const kiln_shape_ctx& ctx, size_t o);
// Output o's concrete dims: an error when infer left a dim unknown at concrete input shapes.
Result<Dims> output_dims(const kiln_shape_ctx& ctx, size_t o);

}  // namespace kiln::plugin

// ir::Model -> ONNX ModelProto bytes. Used for engine files (the optimized graph is stored as ONNX
// with kiln-domain fused nodes) and for reproducer bundles.
#pragma once

#include <functional>
#include <string>

#include "core/status.h"
#include "ir/graph.h"

namespace kiln::onnx_import {

struct ExportOptions {
  // When set, initializers of at least `external_min_bytes` are not embedded: the callback stores
  // their bytes and returns (offset, length) in its blob; the proto refers to them as external data
  // with location `external_location`.
  std::function<std::pair<int64_t, int64_t>(const Tensor&)> store_external;
  std::string external_location = "weights";
  size_t external_min_bytes = 64;
};

Result<std::string> serialize_model(const ir::Model& m, const ExportOptions& opts = {});
Status save_model(const ir::Model& m, const std::string& path);

}  // namespace kiln::onnx_import

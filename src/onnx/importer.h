// ONNX ModelProto -> ir::Model. Every malformed input is a Status naming what is wrong.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"
#include "ops/value.h"

namespace onnx {
class TensorProto;
}

namespace kiln::onnx_import {

// Supplies external tensor data from somewhere other than files beside the model (an engine
// file's weight section): location/offset/length as stored in the TensorProto.
using ExternalResolver = std::function<Result<Tensor>(const std::string& location, int64_t offset, int64_t length,
                                                      DataType dtype, const Dims& dims)>;

// The process-wide default of ImportOptions::allow_external_data_outside (the CLI's
// --allow-external-data-outside sets it; off unless set).
bool allow_external_data_outside_default();
void set_allow_external_data_outside_default(bool allow);

struct ImportOptions {
  bool infer_shapes = true;
  ExternalResolver external_resolver;
  // External data (of a model or an input .pb) must resolve inside the file's folder after
  // following symlinks (core/file_access.h); true lifts that, for users who keep weights elsewhere.
  bool allow_external_data_outside = allow_external_data_outside_default();
};

// Supported ranges, checked at import.
constexpr int64_t kMinIrVersion = 3;
constexpr int64_t kMaxIrVersion = 13;
constexpr int kMaxDefaultOpset = 28;

Result<ir::Model> load_model(const std::string& path, const ImportOptions& opts = {});
// `base_dir` resolves external data; empty means external data is an error.
Result<ir::Model> parse_model(std::string_view bytes, const std::string& base_dir, const ImportOptions& opts = {});

// TensorProto conversion. `base_dir` resolves external data (confined to it unless `allow_outside`).
// Every dim and byte size is overflow-checked and bounded (core/checked_size.h) before allocating.
Result<Tensor> tensor_from_proto(const onnx::TensorProto& p, const std::string& base_dir,
                                 bool allow_outside = allow_external_data_outside_default());
void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* p);

// Reads a .pb file holding a TensorProto, SequenceProto or OptionalProto; `expected` picks which
// (a tensor when unknown).
Result<ops::Value> read_value_pb(const std::string& path, const ir::TypeInfo* expected = nullptr,
                                 const ImportOptions& opts = {});
Status write_tensor_pb(const std::string& path, const Tensor& t, const std::string& name);

}  // namespace kiln::onnx_import

// Importing a model without copying its weights twice. protobuf copies every `bytes` field into a
// std::string of its own when it parses, so a 100 MB model costs a 100 MB copy (plus page faults on
// fresh memory) before kiln copies the weights again into its aligned tensors. detach_raw_data()
// rewrites the serialized model, before protobuf sees it, so that each large initializer's raw_data
// becomes a reference into the original bytes (an external-data entry with location
// kDetachedLocation, offset and length into the model bytes); the importer then copies those bytes
// once, straight into the tensor. Only the wire format is walked (no schema beyond the field numbers
// of ModelProto.graph, GraphProto.initializer and TensorProto); anything unexpected (malformed
// input, groups, a tensor that already has external data) leaves the input to protobuf unchanged,
// which then reports what is wrong as before.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::onnx_import {

// The external-data location of a detached raw_data: ".." makes it a path kiln refuses in any model
// (external data must lie inside the model's folder), so it cannot clash with a real file.
inline constexpr std::string_view kDetachedLocation = "../<kiln: raw_data of this model>";

// The rewritten model, or nothing when no initializer has raw_data of at least `min_bytes` bytes (or
// the bytes are not a well-formed ModelProto): parse `model` as it is then.
std::optional<std::string> detach_raw_data(std::string_view model, size_t min_bytes = 4096);

}  // namespace kiln::onnx_import

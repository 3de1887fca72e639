// libFuzzer target: the ONNX importer (protobuf parse, initializers dense and sparse, attributes,
// subgraphs, shape inference) on arbitrary bytes. Every input must come back as a model or a Status.
#include <string_view>

#include "fuzz_util.h"
#include "onnx/importer.h"

KILN_FUZZ_TARGET(onnx_import) {
  kiln::fuzz::bound_allocations();
  auto m = kiln::onnx_import::parse_model(std::string_view(reinterpret_cast<const char*>(data), size), "");
  if (!m.ok() && m.status().message().empty()) __builtin_trap();  // every error says what is wrong
  return 0;
}

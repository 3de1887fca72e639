// libFuzzer target: the input .pb reader (TensorProto, SequenceProto, OptionalProto; the first byte
// picks which), through a memfd. External data resolves in /proc/self/fd, where nothing matches.
#include "fuzz_util.h"
#include "ir/graph.h"
#include "onnx/importer.h"

KILN_FUZZ_TARGET(tensor_pb) {
  kiln::fuzz::bound_allocations();
  if (size < 1) return 0;
  kiln::fuzz::MemFile f(data + 1, size - 1);
  if (!f.ok()) return 0;
  kiln::ir::TypeInfo type = kiln::ir::TypeInfo::tensor(kiln::DataType::kFloat32, kiln::SymShape());
  const kiln::ir::TypeInfo* expected = nullptr;
  kiln::ir::TypeInfo seq = kiln::ir::TypeInfo::sequence(type), opt = kiln::ir::TypeInfo::optional(type);
  if (data[0] % 3 == 1) expected = &seq;
  if (data[0] % 3 == 2) expected = &opt;
  auto v = kiln::onnx_import::read_value_pb(f.path(), expected);
  if (!v.ok() && v.status().message().empty()) __builtin_trap();
  return 0;
}

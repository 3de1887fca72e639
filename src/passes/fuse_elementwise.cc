// fuse_elementwise: merges connected elementwise nodes into one kiln.FusedElementwise, whose
// "body" attribute holds the original nodes (a subgraph whose inputs are the fused node's inputs).
//
// Matches trees of elementwise ops (those declaring ops::trait::kElementwiseUnary, e.g. Relu, Clip,
// kiln.Gelu, or kElementwiseBroadcast with two inputs, e.g. Add, PRelu, Max/Min/Sum of two), where
// every node's output has the dtype and static shape of the tree's root output (so no intermediate
// is broadcast up: other operands, constants or values computed elsewhere, only broadcast into it)
// and every absorbed intermediate has exactly one reader. Trees grow from their last node (the
// root) up through its operands; at least two nodes.
//
// Exact: the body is the original nodes, run by the same kernels. Leaves alone: single nodes,
// intermediates read twice or that are graph outputs, float16/integer tensors (float32/float64
// only), shape-changing broadcasts, ops of opset < 7 (legacy broadcasting), and nodes with
// subgraphs or several outputs.
//
// For a CUDA target (fuse_elementwise_for) only the trees the CUDA tactic runs in one kernel
// (backends/cuda/cuda_fused_tactic.cc) fuse: float32, rank <= 8, ops with a CUDA kernel of their own
// (the unary activations and math, Add/Sub/Mul/Div/Pow/Max/Min/PRelu; Clip only with constant bounds
// as attributes or none), at most kCudaMaxNodes nodes and kCudaMaxInputs inputs; any other device
// fuses nothing.
#include <set>

#include "core/target.h"
#include "ops/op_traits.h"
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

// The limits of the CUDA tactic's op program (cuda_fused_elementwise.h: kFusedMaxSteps, kFusedMaxInputs).
constexpr size_t kCudaMaxNodes = 16, kCudaMaxInputs = 8;

bool cuda_runs(const ir::Node& n) {
  static const std::set<std::string> kOps = {
      "Relu",  "Sigmoid", "Tanh",       "Exp",      "Log",       "Sqrt", "Neg",       "Abs", "Erf",
      "Floor", "Ceil",    "Reciprocal", "Softplus", "HardSwish", "Gelu", "LeakyRelu", "Elu", "HardSigmoid",
      "Clip",  "Add",     "Sub",        "Mul",      "Div",       "Pow",  "Max",       "Min", "PRelu"};
  if (n.domain == "kiln") return n.op_type == "Gelu";
  if (!n.domain.empty() || !kOps.count(n.op_type)) return false;
  return n.op_type != "Clip" || n.opset < 11 || n.inputs.size() == 1;
}

bool is_elementwise(const ir::Node& n) {
  const bool unary = ops::has_trait(n, ops::trait::kElementwiseUnary);
  if (!unary && !ops::has_trait(n, ops::trait::kElementwiseBroadcast)) return false;
  if (n.outputs.size() != 1 || n.outputs[0].empty() || n.attr("body")) return false;  // not a fused tree again
  if (n.domain.empty() && n.opset < 7) return false;
  if (unary) return n.op_type == "Clip" ? n.inputs.size() <= 3 : n.inputs.size() == 1;
  return n.inputs.size() == 2;
}

// A node may join a tree rooted at a value of type `root`.
bool fits(const ir::Graph& g, const ir::Node& n, const ir::TypeInfo& root) {
  if (!is_elementwise(n)) return false;
  const ir::TypeInfo* t = fusion::type_of(g, n.outputs[0]);
  return t && t->elem == root.elem && fusion::same_shape(t->shape, root.shape);
}

bool try_elementwise(ir::Graph& g, const ir::UseIndex& uses, int ri, bool cuda) {
  // Roots are visited from the end so that each tree starts at its last node.
  ri = static_cast<int>(g.nodes.size()) - 1 - ri;
  const ir::Node& root = g.nodes[static_cast<size_t>(ri)];
  const ir::TypeInfo* rt = is_elementwise(root) ? fusion::type_of(g, root.outputs[0]) : nullptr;
  if (!rt || (rt->elem != DataType::kFloat32 && rt->elem != DataType::kFloat64) || !rt->shape.rank_known) return false;
  if (cuda && (rt->elem != DataType::kFloat32 || rt->shape.rank() > 8 || !cuda_runs(root))) return false;
  // Skip a node that belongs to a later tree: its output's one reader fits too.
  int reader = fusion::sole_consumer(uses, root.outputs[0]);
  if (reader >= 0 && fits(g, g.nodes[static_cast<size_t>(reader)], *rt) &&
      (!cuda || cuda_runs(g.nodes[static_cast<size_t>(reader)])))
    return false;
  std::set<int> group = {ri};
  std::vector<int> work = {ri};
  while (!work.empty()) {
    int i = work.back();
    work.pop_back();
    for (const auto& in : g.nodes[static_cast<size_t>(i)].inputs) {
      int p = in.empty() ? -1 : uses.producer(in);
      if (p < 0 || group.count(p) || !uses.single_use(in) || !fits(g, g.nodes[static_cast<size_t>(p)], *rt)) continue;
      if (cuda && !cuda_runs(g.nodes[static_cast<size_t>(p)])) continue;
      group.insert(p);
      work.push_back(p);
    }
  }
  if (group.size() < 2) return false;
  // The body: the group's nodes in order, reading renamed copies of the values from outside.
  std::string name = ir::unique_name(g, root.name + "_fused");
  auto body = std::make_shared<ir::Graph>();
  body->name = name + "_body";
  body->parent = &g;
  body->opset_imports = g.opset_imports;
  ir::Node f = fusion::kiln_node("FusedElementwise", name);
  std::map<std::string, std::string> outer_to_body;
  std::set<std::string> produced;
  for (int i : group) produced.insert(g.nodes[static_cast<size_t>(i)].outputs[0]);
  for (int i : group) {
    ir::Node n = g.nodes[static_cast<size_t>(i)];
    n.attrs.erase("kiln.sources");
    for (auto& in : n.inputs) {
      if (in.empty() || produced.count(in)) continue;
      auto it = outer_to_body.find(in);
      if (it == outer_to_body.end()) {
        std::string bn = name + "_in" + std::to_string(f.inputs.size());
        const ir::TypeInfo* t = fusion::type_of(g, in);
        if (!t || (cuda && t->elem != DataType::kFloat32)) return false;
        body->inputs.push_back({bn, ir::TypeInfo::tensor(t->elem, t->shape)});
        f.inputs.push_back(in);
        it = outer_to_body.emplace(in, bn).first;
      }
      in = it->second;
    }
    if (i == ri) n.outputs[0] = name + "_out";
    body->nodes.push_back(std::move(n));
  }
  if (cuda && (group.size() > kCudaMaxNodes || f.inputs.size() > kCudaMaxInputs)) return false;
  body->outputs.push_back({name + "_out", *rt});
  f.outputs = root.outputs;
  ir::Attribute a;
  a.type = ir::Attribute::Type::kGraph;
  a.g = body;
  f.attrs["body"] = a;
  fusion::replace_group(g, group, std::move(f));
  return true;
}

}  // namespace

Result<int> fuse_elementwise(ir::Graph& g) {
  return fusion::rewrite_until_fixpoint(
      g, [](ir::Graph& h, const ir::UseIndex& uses, int ri) { return try_elementwise(h, uses, ri, false); });
}

Result<int> fuse_elementwise_for(ir::Graph& g, const Target& target) {
  if (target.device.kind == DeviceKind::kCPU) return fuse_elementwise(g);
  if (target.device.kind != DeviceKind::kCUDA) return 0;
  return fusion::rewrite_until_fixpoint(
      g, [](ir::Graph& h, const ir::UseIndex& uses, int ri) { return try_elementwise(h, uses, ri, true); });
}

}  // namespace kiln::passes

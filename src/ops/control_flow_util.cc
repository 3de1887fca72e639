#include "ops/control_flow_util.h"

namespace kiln::ops::cf {

bool same_type(const ir::TypeInfo& a, const ir::TypeInfo& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case ir::TypeInfo::Kind::kUnknown: return true;
    case ir::TypeInfo::Kind::kTensor:
      return a.elem == b.elem && a.shape.rank_known == b.shape.rank_known && a.shape.dims == b.shape.dims;
    case ir::TypeInfo::Kind::kMap:
      if (a.map_key != b.map_key) return false;
      [[fallthrough]];
    case ir::TypeInfo::Kind::kSequence:
    case ir::TypeInfo::Kind::kOptional:
      if (!a.inner || !b.inner) return !a.inner && !b.inner;
      return same_type(*a.inner, *b.inner);
  }
  return false;
}

ir::TypeInfo widen(const ir::TypeInfo& a, const ir::TypeInfo& b, const std::function<Dim()>& fresh_dim) {
  using K = ir::TypeInfo::Kind;
  if (a.kind == K::kUnknown || b.kind == K::kUnknown) return ir::TypeInfo();
  if (a.kind == K::kOptional && b.kind != K::kOptional) {
    if (!a.inner) return a;
    return ir::TypeInfo::optional(widen(*a.inner, b, fresh_dim));
  }
  if (b.kind == K::kOptional && a.kind != K::kOptional) return widen(b, a, fresh_dim);
  if (a.kind != b.kind) return ir::TypeInfo();
  if (a.kind == K::kTensor) {
    ir::TypeInfo t = ir::TypeInfo::tensor(a.elem == b.elem ? a.elem : DataType::kUndefined);
    if (a.shape.rank_known && b.shape.rank_known && a.shape.rank() == b.shape.rank()) {
      std::vector<Dim> d(a.shape.rank());
      for (size_t i = 0; i < d.size(); ++i)
        d[i] = a.shape.dims[i] == b.shape.dims[i] ? a.shape.dims[i] : (fresh_dim ? fresh_dim() : Dim());
      t.shape = SymShape(d);
    }
    return t;
  }
  if (a.kind == K::kMap && a.map_key != b.map_key) return ir::TypeInfo();
  ir::TypeInfo t = a;
  if (a.inner && b.inner)
    t.inner = std::make_shared<ir::TypeInfo>(widen(*a.inner, *b.inner, fresh_dim));
  else
    t.inner = std::make_shared<ir::TypeInfo>();
  return t;
}

std::shared_ptr<ir::Graph> clone_graph(const ir::Graph& g, const ir::Graph* parent) {
  auto c = std::make_shared<ir::Graph>(g);
  c->parent = parent;
  for (auto& n : c->nodes) {
    for (auto& [k, a] : n.attrs) {
      if (a.g) a.g = clone_graph(*a.g, c.get());
      for (auto& sg : a.graphs) sg = clone_graph(*sg, c.get());
    }
  }
  return c;
}

namespace {
// Moves `src` (a clone of dst, inferred) into `dst`, keeping dst's parent; subgraphs one level down
// are re-pointed at dst (deeper ones keep their own, moved-along parents).
void adopt(ir::Graph& dst, ir::Graph&& src) {
  const ir::Graph* parent = dst.parent;
  dst = std::move(src);
  dst.parent = parent;
  for (auto& n : dst.nodes)
    for (auto& [k, a] : n.attrs) {
      if (a.g) a.g->parent = &dst;
      for (auto& sg : a.graphs) sg->parent = &dst;
    }
}
}  // namespace

Result<std::vector<ir::TypeInfo>> infer_loop_body(InferContext& ctx, const ir::Graph& body,
                                                  std::vector<ir::TypeInfo>& in_types, size_t in0, size_t out0,
                                                  size_t n) {
  if (!ctx.infer_subgraph) return InvalidModel(ctx.node.where(), "subgraph inference is not available");
  constexpr int kMaxRounds = 4;
  // Each round infers a scratch copy of the body. The round that settles has inferred the body with
  // exactly the types the final inference would use, so its copy becomes the body: the body is
  // inferred once per round, not once more at the end. (Re-inferring it doubled the work at every
  // level of nested Loops: 20 levels took 5 s, 60 never finished.)
  for (int round = 0; round < kMaxRounds; ++round) {
    auto scratch = clone_graph(body, body.parent);
    KILN_ASSIGN_OR_RETURN(std::vector<ir::TypeInfo> outs, ctx.infer_subgraph(*scratch, in_types));
    if (outs.size() < out0 + n || scratch->inputs.size() < in0 + n) break;  // the caller reports arity
    bool settled = true;
    for (size_t k = 0; k < n; ++k) {
      // What the body saw on entry (the given type refined by the body's declaration).
      const ir::TypeInfo& seen = scratch->inputs[in0 + k].type;
      ir::TypeInfo w = widen(seen, outs[out0 + k]);
      if (!same_type(w, seen)) {
        in_types[in0 + k] = w;
        settled = false;
      }
    }
    if (settled) {
      adopt(const_cast<ir::Graph&>(body), std::move(*scratch));
      for (size_t k = 0; k < n && in0 + k < body.inputs.size() && in0 + k < in_types.size(); ++k)
        in_types[in0 + k] = body.inputs[in0 + k].type;
      return outs;
    }
  }
  // No fixed point in a few rounds (or an arity problem): keep only what cannot change (kind, dtype).
  for (size_t k = 0; k < n && in0 + k < in_types.size(); ++k) {
    ir::TypeInfo& t = in_types[in0 + k];
    if (t.is_tensor())
      t.shape = SymShape();
    else
      t = ir::TypeInfo();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<ir::TypeInfo> outs, ctx.infer_subgraph(body, in_types));
  for (size_t k = 0; k < n && in0 + k < body.inputs.size() && in0 + k < in_types.size(); ++k)
    in_types[in0 + k] = body.inputs[in0 + k].type;
  return outs;
}

Result<const ir::Graph*> graph_attr(const ir::Node& node, const char* name) {
  const ir::Attribute* a = node.attr(name);
  if (!a || !a->g) return InvalidModel(node.where(), "graph attribute '", name, "' is required");
  return a->g.get();
}

const ir::TypeInfo* sequence_elem(const InferContext& ctx, size_t i) {
  if (!ctx.has_input(i)) return nullptr;
  const ir::TypeInfo& t = ctx.input(i);
  if (t.kind != ir::TypeInfo::Kind::kSequence || !t.inner) return nullptr;
  return t.inner.get();
}

}  // namespace kiln::ops::cf

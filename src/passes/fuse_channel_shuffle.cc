// fuse_channel_shuffle: ShuffleNet's channel shuffle becomes one kiln.ChannelShuffle
// (ops/kiln_channel_shuffle.cc), which copies each channel once, from the layers that made it to the
// layers that read it:
//
//   [Concat(X_0, ..., axis=1) ->] Reshape [N, G, C/G, d...] -> Transpose perm [0, 2, 1, 3, ...]
//     -> Reshape [N, C, d...] [-> Split(axis=1) | Slices along axis 1 that partition C]
//
// torch's channel_shuffle (view, transpose, contiguous, view) exports the middle three; ShuffleNet
// v2 concatenates its two branches before it and chunks the result in two after it (as two
// Slices, or a Split). The ONNX ops copy the whole tensor three times (Concat, Transpose, Split);
// the fused op once.
//
// Matches on the inferred types, not on the Reshapes' shape inputs (a dynamic batch computes them
// at run time): the first Reshape's output is [N, G, C/G, d...] for its input [N, C, d...] (G and
// C known, the other dims the same), the second Reshape gives back the input's shape, and the
// intermediate values have no other reader. A Concat is taken in when it is along axis 1 and its
// output has no other reader; Slices are taken in when they are all of the result's readers, slice
// axis 1 only, with step 1, and partition the channels (else the result stays one output).
// Exact: the same elements move to the same places. CPU targets only (fuse_channel_shuffle_for): the
// op's kernel is the CPU's movement tactic; a CUDA build keeps the ONNX ops its kernels run.
#include <algorithm>

#include "ir/attribute_builders.h"
#include "ops/movement_geometry.h"
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_onnx;

std::vector<int64_t> ints_of(const Tensor* t) {
  std::vector<int64_t> v;
  if (t && (t->dtype() == DataType::kInt64 || t->dtype() == DataType::kInt32))
    for (int64_t k = 0; k < t->numel(); ++k) v.push_back(t->get_i64(k));
  return v;
}

// The channel range [start, start + len) that Slice `s` takes along axis 1 of a rank-r input with
// c channels (and nothing else: every other axis whole, step 1); false when it is not such a Slice.
bool channel_slice(const ir::Graph& g, const ir::Node& s, int64_t r, int64_t c, int64_t* start, int64_t* len) {
  std::vector<int64_t> starts, ends, axes, steps;
  if (s.opset < 10) {
    starts = s.attr_ints("starts"), ends = s.attr_ints("ends"), axes = s.attr_ints("axes");
    if (!s.attr("axes")) return false;
  } else {
    if (s.inputs.size() < 4) return false;  // without axes, starts address dim 0 first
    auto input = [&](size_t i) { return i < s.inputs.size() && !s.inputs[i].empty(); };
    const Tensor* ts = ir::constant_value(g, s.inputs[1]);
    const Tensor* te = ir::constant_value(g, s.inputs[2]);
    const Tensor* ta = ir::constant_value(g, s.inputs[3]);
    if (!ts || !te || !ta) return false;
    starts = ints_of(ts), ends = ints_of(te), axes = ints_of(ta);
    if (input(4)) {
      const Tensor* tp = ir::constant_value(g, s.inputs[4]);
      if (!tp) return false;
      steps = ints_of(tp);
    }
  }
  if (axes.size() != 1 || starts.size() != 1 || ends.size() != 1 || steps.size() > 1) return false;
  if (axes[0] != 1 && axes[0] != 1 - r) return false;
  if (!steps.empty() && steps[0] != 1) return false;
  auto a = ops::slice_axis(c, starts[0], ends[0], 1);
  if (!a.ok() || a->len <= 0) return false;
  *start = a->start, *len = a->len;
  return true;
}

// The channel counts the readers of y (of c channels, rank r) take when they are one Split along
// axis 1 or Slices that partition the channels; their outputs in `outs`, the nodes in `nodes`.
bool channel_parts(const ir::Graph& g, const ir::UseIndex& uses, const std::string& y, int64_t r, int64_t c,
                   std::vector<int64_t>* split, std::vector<std::string>* outs, std::vector<int>* nodes) {
  if (uses.is_graph_output(y)) return false;
  const std::vector<int>& readers = uses.consumers(y);
  if (readers.empty()) return false;
  const ir::Node& first = g.nodes[static_cast<size_t>(readers[0])];
  if (readers.size() == 1 && is_onnx(first, "Split") && first.inputs[0] == y) {
    int64_t axis = first.attr_int("axis", 0);
    if (axis != 1 && axis != 1 - r) return false;
    bool has_split = false;
    std::vector<int64_t> sizes;
    if ((first.opset >= 2 && first.opset < 13) || (first.opset < 2 && first.attr("split"))) {
      has_split = first.attr("split") != nullptr, sizes = first.attr_ints("split");
    } else if (first.inputs.size() > 1 && !first.inputs[1].empty()) {
      const Tensor* t = ir::constant_value(g, first.inputs[1]);
      if (!t) return false;
      has_split = true, sizes = ints_of(t);
    }
    const int64_t num = first.opset >= 18 && first.attr("num_outputs") ? first.attr_int("num_outputs", -1) : -1;
    auto got = ops::split_sizes(has_split, sizes, num, static_cast<int64_t>(first.outputs.size()), c);
    if (!got.ok()) return false;
    for (const std::string& o : first.outputs)
      if (o.empty()) return false;
    *split = *got, *outs = first.outputs, *nodes = {readers[0]};
    return true;
  }
  std::vector<std::pair<int64_t, int>> parts;  // (start, index into readers)
  std::vector<int64_t> lens(readers.size());
  for (size_t k = 0; k < readers.size(); ++k) {
    const ir::Node& s = g.nodes[static_cast<size_t>(readers[k])];
    int64_t start = 0;
    if (!is_onnx(s, "Slice") || s.inputs[0] != y || s.outputs.size() != 1 ||
        !channel_slice(g, s, r, c, &start, &lens[k]))
      return false;
    parts.emplace_back(start, static_cast<int>(k));
  }
  std::sort(parts.begin(), parts.end());
  int64_t at = 0;
  for (const auto& [start, k] : parts) {
    if (start != at) return false;  // a gap or an overlap
    at += lens[static_cast<size_t>(k)];
    split->push_back(lens[static_cast<size_t>(k)]);
    outs->push_back(g.nodes[static_cast<size_t>(readers[static_cast<size_t>(k)])].outputs[0]);
    nodes->push_back(readers[static_cast<size_t>(k)]);
  }
  return at == c;
}

bool try_shuffle(ir::Graph& g, const ir::UseIndex& uses, int ti) {
  const ir::Node& t = g.nodes[static_cast<size_t>(ti)];
  if (!is_onnx(t, "Transpose") || t.inputs.size() != 1 || t.outputs.size() != 1) return false;
  const int r1 = uses.producer(t.inputs[0]);
  if (r1 < 0 || !uses.single_use(t.inputs[0]) || !uses.single_use(t.outputs[0])) return false;
  const ir::Node& reshape1 = g.nodes[static_cast<size_t>(r1)];
  const int r2 = fusion::sole_consumer(uses, t.outputs[0]);
  if (!is_onnx(reshape1, "Reshape") || r2 < 0 || !is_onnx(g.nodes[static_cast<size_t>(r2)], "Reshape")) return false;
  const ir::Node& reshape2 = g.nodes[static_cast<size_t>(r2)];
  const std::string& x = reshape1.inputs[0];
  const ir::TypeInfo* xt = fusion::type_of(g, x);
  const ir::TypeInfo* st = fusion::type_of(g, t.inputs[0]);
  if (!xt || !st || !xt->shape.rank_known || !st->shape.rank_known || xt->elem == DataType::kString) return false;
  const SymShape& xs = xt->shape;
  const SymShape& ss = st->shape;
  const size_t r = xs.rank();
  if (r < 2 || ss.rank() != r + 1 || !xs.dims[1].known() || !ss.dims[1].known() || !ss.dims[2].known()) return false;
  const int64_t c = xs.dims[1].value, groups = ss.dims[1].value;
  if (groups < 2 || groups * ss.dims[2].value != c || !fusion::same_dim(ss.dims[0], xs.dims[0])) return false;
  for (size_t k = 2; k < r; ++k)
    if (!fusion::same_dim(ss.dims[k + 1], xs.dims[k])) return false;
  std::vector<int64_t> perm = t.attr_ints("perm");
  std::vector<int64_t> want(r + 1);
  for (size_t k = 0; k <= r; ++k) want[k] = static_cast<int64_t>(k);
  std::swap(want[1], want[2]);
  if (perm != want || !fusion::same_type(g, reshape2.outputs[0], x)) return false;

  std::set<int> group = {r1, ti, r2};
  std::vector<std::string> inputs = {x};
  const int ci = uses.producer(x);
  if (ci >= 0 && uses.single_use(x)) {
    const ir::Node& cat = g.nodes[static_cast<size_t>(ci)];
    const int64_t axis = cat.attr_int("axis", cat.opset < 4 ? 1 : 0);
    bool all = is_onnx(cat, "Concat") && (axis == 1 || axis == 1 - static_cast<int64_t>(r));
    for (const std::string& in : cat.inputs) all = all && !in.empty();
    if (all) inputs = cat.inputs, group.insert(ci);
  }
  const std::string& y = reshape2.outputs[0];
  std::vector<int64_t> split;
  std::vector<std::string> outs;
  std::vector<int> parts;
  if (channel_parts(g, uses, y, static_cast<int64_t>(r), c, &split, &outs, &parts))
    group.insert(parts.begin(), parts.end());
  else
    split = {c}, outs = {y};
  ir::Node f = fusion::kiln_node("ChannelShuffle", reshape2.name);
  f.inputs = inputs;
  f.outputs = outs;
  fusion::set_int(f, "groups", groups);
  f.attrs["split"] = ir::attr_ints(split);
  // In the second Reshape's place: what the group reads exists by then, and the readers of the
  // Split or Slices come after it.
  fusion::replace_group(g, group, std::move(f), r2);
  return true;
}

}  // namespace

Result<int> fuse_channel_shuffle(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_shuffle); }

Result<int> fuse_channel_shuffle_for(ir::Graph& g, const Target& target) {
  return target.device.kind == DeviceKind::kCPU ? fuse_channel_shuffle(g) : 0;
}

}  // namespace kiln::passes

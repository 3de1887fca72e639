// layout_fuse_conv_dw: a channel-blocked 1x1 conv whose output only feeds a depthwise 3x3 conv
// (mobilenet's expansion + depthwise pair) becomes one kiln.BlockedConvDw, so that the wide
// intermediate tensor (6x the block's channels) is never written out and read back: oneDNN computes
// the depthwise conv from rows of the 1x1 conv's output while they are in cache.
//
// Matches (after layout_blocked): kiln.BlockedConv A with a blocked X, a 1x1 constant kernel, stride
// 1, no pads, group 1, no residual, whose output has no other reader and is no graph output; followed by
// kiln.BlockedConv B reading it, depthwise (group = channels), 3x3, stride 1 or 2, pads 1, dilation 1,
// no residual, same block. The fused node keeps A's attributes and B's prefixed "dw."; its reference
// kernel runs the two BlockedConv reference kernels, so the result is the same by construction.
// Leaves alone everything else (other kernels, residuals, strided 1x1 convs, shared intermediates).
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_kiln;

bool ints_are(const ir::Node& n, const char* a, std::vector<int64_t> want, std::vector<int64_t> dflt) {
  return n.attr_ints(a, dflt) == want;
}

bool plain_padding(const ir::Node& n, int64_t p) {
  std::string ap = n.attr_string("auto_pad", "NOTSET");
  if (ap == "VALID") return p == 0;
  return ap == "NOTSET" && ints_are(n, "pads", {p, p, p, p}, {0, 0, 0, 0});
}

bool no_residual(const ir::Node& n) { return !n.has_input(3); }

// A: 1x1, stride 1, unpadded, group 1, constant weights.
bool is_pointwise(const ir::Graph& g, const ir::Node& n) {
  if (!is_kiln(n, "BlockedConv") || n.outputs.size() != 1 || !no_residual(n)) return false;
  const Tensor* w = n.inputs.size() > 1 ? ir::constant_value(g, n.inputs[1]) : nullptr;
  if (!w || w->rank() != 4 || w->dim(2) != 1 || w->dim(3) != 1) return false;
  if (n.has_input(2) && !ir::is_constant(g, n.inputs[2])) return false;
  return n.attr_int("group", 1) == 1 && ints_are(n, "strides", {1, 1}, {1, 1}) &&
         ints_are(n, "dilations", {1, 1}, {1, 1}) && plain_padding(n, 0);
}

// B: depthwise 3x3, stride 1 or 2, pads 1, constant weights.
bool is_depthwise3x3(const ir::Graph& g, const ir::Node& n) {
  if (!is_kiln(n, "BlockedConv") || n.outputs.size() != 1 || !no_residual(n)) return false;
  const Tensor* w = n.inputs.size() > 1 ? ir::constant_value(g, n.inputs[1]) : nullptr;
  if (!w || w->rank() != 4 || w->dim(1) != 1 || w->dim(2) != 3 || w->dim(3) != 3) return false;
  if (n.has_input(2) && !ir::is_constant(g, n.inputs[2])) return false;
  auto st = n.attr_ints("strides", {1, 1});
  return n.attr_int("group", 1) == w->dim(0) &&
         (st == std::vector<int64_t>{1, 1} || st == std::vector<int64_t>{2, 2}) &&
         ints_are(n, "dilations", {1, 1}, {1, 1}) && plain_padding(n, 1);
}

bool try_fuse_dw(ir::Graph& g, const ir::UseIndex& uses, int bi) {
  const ir::Node& b = g.nodes[static_cast<size_t>(bi)];
  if (!is_depthwise3x3(g, b)) return false;
  int ai = uses.producer(b.inputs[0]);
  if (ai < 0 || !uses.single_use(b.inputs[0])) return false;
  const ir::Node& a = g.nodes[static_cast<size_t>(ai)];
  if (!is_pointwise(g, a) || a.attr_int("block", 0) != b.attr_int("block", 0)) return false;
  const ir::TypeInfo* x = fusion::type_of(g, a.inputs[0]);  // a blocked X (not a network's plain image)
  if (!x || !x->shape.rank_known || x->shape.rank() != 5) return false;
  if (ir::constant_value(g, a.inputs[1])->dim(0) != ir::constant_value(g, b.inputs[1])->dim(0)) return false;
  ir::Node f = fusion::kiln_node("BlockedConvDw", b.name);
  for (const auto& [k, v] : a.attrs)
    if (k.rfind("kiln.", 0) != 0) f.attrs[k] = v;
  for (const auto& [k, v] : b.attrs)
    if (k.rfind("kiln.", 0) != 0 && k != "block") f.attrs["dw." + k] = v;
  for (const char* k : {"kiln.plain_value", "kiln.plain_channels"})
    if (const ir::Attribute* v = b.attr(k)) f.attrs[k] = *v;
  f.inputs = {a.inputs[0], a.inputs[1], a.has_input(2) ? a.inputs[2] : "", b.inputs[1],
              b.has_input(2) ? b.inputs[2] : ""};
  if (f.inputs[4].empty()) f.inputs.pop_back();
  f.outputs = b.outputs;
  fusion::replace_group(g, {ai, bi}, std::move(f));  // the provenance of both
  return true;
}

}  // namespace

Result<int> layout_fuse_conv_dw(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_fuse_dw); }

}  // namespace kiln::passes

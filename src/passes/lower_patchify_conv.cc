// lower_patchify_conv: a convolution whose kernel equals its stride (no padding, no dilation, one
// group) cuts the image into non-overlapping patches: it is a matrix product of the patches, each
// flattened to C*KH*KW values, by the weights. Vision transformers embed their patches this way (ViT's
// 32x32 / 16x16 "conv_proj", ConvNeXt's and Swin's 4x4 stems) and read the result as tokens at once
// (Reshape / Flatten / Transpose). As a conv it runs in the channel-blocked layout and pays a
// reorder back to plain NCHW plus the model's own transposes to [N, tokens, channels]; as a MatMul
// it writes [N, OH*OW, OC] directly, and the transposes around it cancel (remove_noop_ops; a reader
// that permutes to channels-last gets a Reshape of the tokens instead).
//
// Rewrite, for x [N, C, H, W] with H = OH*KH, W = OW*KW and a constant weight W [OC, C, KH, KW]:
//   Reshape(x, [0, C, OH, KH, OW, KW]) -> Transpose(0,2,4,1,3,5) -> Reshape([0, OH*OW, C*KH*KW])
//   -> MatMul(W^T [C*KH*KW, OC]) (+ bias) -> Transpose(0,2,1) -> Reshape([0, OC, OH, OW]) = y.
// Exact up to float rounding (the same products, summed in another order). Only where every reader
// of y moves data (Reshape, Flatten, Transpose): a conv feeding convs, pools or normalizations stays a
// conv in whatever layout the layout pass picks.
#include "ir/attribute_builders.h"
#include "ir/rewrite.h"
#include "passes/fusion_util.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

bool all_equal(const std::vector<int64_t>& v, int64_t x) {
  for (int64_t e : v)
    if (e != x) return false;
  return true;
}

// The conv's geometry when it is a patch embedding this pass can lower.
struct Patchify {
  int64_t c = 0, oc = 0, kh = 0, kw = 0, oh = 0, ow = 0;
};

bool match(const ir::Graph& g, const ir::UseIndex& uses, const ir::Node& n, Patchify* p) {
  if (!n.domain.empty() || n.op_type != "Conv" || n.outputs.size() != 1 || n.inputs.size() < 2) return false;
  if (n.inputs[0].empty() || n.inputs[1].empty() || uses.is_graph_output(n.outputs[0])) return false;
  const Tensor* w = ir::constant_value(g, n.inputs[1]);
  if (!w || w->dtype() != DataType::kFloat32 || w->rank() != 4) return false;
  if (n.has_input(2)) {
    const Tensor* b = ir::constant_value(g, n.inputs[2]);
    if (!b || b->dtype() != DataType::kFloat32 || b->numel() != w->dim(0)) return false;
  }
  const ir::TypeInfo* xt = fusion::type_of(g, n.inputs[0]);
  if (!xt || !xt->is_tensor() || xt->elem != DataType::kFloat32 || !xt->shape.rank_known || xt->shape.rank() != 4)
    return false;
  for (size_t d = 1; d < 4; ++d)  // the batch may be symbolic
    if (!xt->shape.dims[d].known()) return false;
  p->oc = w->dim(0), p->c = w->dim(1), p->kh = w->dim(2), p->kw = w->dim(3);
  if (n.attr_int("group", 1) != 1 || xt->shape.dims[1].value != p->c || p->kh * p->kw < 2) return false;
  const std::vector<int64_t> ks = n.attr_ints("kernel_shape");
  if (!ks.empty() && ks != std::vector<int64_t>{p->kh, p->kw}) return false;
  if (n.attr_ints("strides") != std::vector<int64_t>{p->kh, p->kw}) return false;
  if (!all_equal(n.attr_ints("dilations"), 1) || !all_equal(n.attr_ints("pads"), 0)) return false;
  const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID") return false;
  const int64_t h = xt->shape.dims[2].value, wd = xt->shape.dims[3].value;
  if (h % p->kh != 0 || wd % p->kw != 0) return false;
  p->oh = h / p->kh, p->ow = wd / p->kw;
  for (int c : uses.consumers(n.outputs[0])) {
    const ir::Node& r = g.nodes[static_cast<size_t>(c)];
    if (!r.domain.empty() || (r.op_type != "Reshape" && r.op_type != "Flatten" && r.op_type != "Transpose"))
      return false;
  }
  return !uses.consumers(n.outputs[0]).empty();
}

Tensor ints(const std::vector<int64_t>& v) {
  Tensor t(DataType::kInt64, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
  return t;
}

}  // namespace

Result<int> lower_patchify_conv(ir::Graph& g) {
  int changed = 0;
  std::vector<ir::Node> added;
  std::set<int> removed;
  {
    ir::UseIndex uses(g);
    auto opset_it = g.opset_imports.find("");
    const int opset = opset_it == g.opset_imports.end() ? 13 : opset_it->second;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const ir::Node& conv = g.nodes[i];
      Patchify p;
      if (!match(g, uses, conv, &p)) continue;
      const std::string base = conv.name.empty() ? conv.outputs[0] : conv.name;
      auto value = [&](const std::string& suffix) { return ir::unique_name(g, base + suffix); };
      auto constant = [&](const std::string& suffix, Tensor t) {
        std::string name = value(suffix);
        g.initializers[name] = std::move(t);
        return name;
      };
      auto node = [&](const std::string& op, const std::string& suffix, std::vector<std::string> in,
                      std::string out) -> ir::Node& {
        ir::Node m;
        m.name = suffix.empty() ? conv.name : ir::unique_name(g, base + suffix);  // the conv goes
        m.op_type = op;
        m.opset = opset;
        m.inputs = std::move(in);
        m.outputs = {std::move(out)};
        ir::add_sources(m, conv);
        added.push_back(std::move(m));
        return added.back();
      };
      const int64_t k = p.c * p.kh * p.kw;
      const Tensor& w = *ir::constant_value(g, conv.inputs[1]);
      Tensor wt(DataType::kFloat32, {k, p.oc});
      for (int64_t o = 0; o < p.oc; ++o)
        for (int64_t j = 0; j < k; ++j) wt.data<float>()[j * p.oc + o] = w.data<float>()[o * k + j];

      const std::string x6 = value("/patches6"), xt = value("/patches_t"), xm = value("/patches");
      node("Reshape", "/patch_split",
           {conv.inputs[0], constant("/patch_split_shape", ints({0, p.c, p.oh, p.kh, p.ow, p.kw}))}, x6);
      node("Transpose", "/patch_gather", {x6}, xt).attrs["perm"] = ir::attr_ints({0, 2, 4, 1, 3, 5});
      node("Reshape", "/patch_flatten", {xt, constant("/patch_flatten_shape", ints({0, p.oh * p.ow, k}))}, xm);
      std::string tokens = value("/tokens");
      node("MatMul", "", {xm, constant("/weight_t", std::move(wt))}, tokens);
      if (conv.has_input(2)) {
        std::string biased = value("/tokens_biased");
        node("Add", "/bias", {tokens, conv.inputs[2]}, biased);
        tokens = biased;
      }
      // A reader that permutes to channels-last (ConvNeXt's and Swin's LayerNorm over channels) takes
      // the tokens as [N, OH, OW, OC] directly.
      for (int r : uses.consumers(conv.outputs[0])) {
        ir::Node& t = g.nodes[static_cast<size_t>(r)];
        if (t.op_type != "Transpose" || t.attr_ints("perm") != std::vector<int64_t>{0, 2, 3, 1}) continue;
        node("Reshape", "/to_channels_last", {tokens, constant("/channels_last_shape", ints({0, p.oh, p.ow, p.oc}))},
             t.outputs[0]);
        removed.insert(r);
      }
      const std::string chw = value("/channels_first");
      node("Transpose", "/to_channels_first", {tokens}, chw).attrs["perm"] = ir::attr_ints({0, 2, 1});
      node("Reshape", "/to_image", {chw, constant("/image_shape", ints({0, p.oc, p.oh, p.ow}))}, conv.outputs[0]);
      removed.insert(static_cast<int>(i));
      ++changed;
    }
  }
  if (!changed) return 0;
  ir::remove_nodes(g, removed);
  for (ir::Node& m : added) g.nodes.push_back(std::move(m));
  KILN_RETURN_IF_ERROR(g.topological_sort());
  return changed;
}

}  // namespace kiln::passes

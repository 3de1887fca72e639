// layout_blocked: keeps convolution activations in the channel-blocked layout (oneDNN's nChw16c /
// nChw8c, see ops/kiln_layout.h) from one layer to the next, so that the fast convolutions do not
// reorder their input and output around every layer; reorders remain only at the boundaries.
//
// Matches: 2-D Conv and kiln.FusedConv with a constant float32 W (and constant B), group 1,
// depthwise (group = C = M) or groups of whole blocks (C / group and M / group multiples of the
// block), a 4-D float32 X, and a residual of the output's shape; each becomes a
// kiln.BlockedConv. A MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool (without Indices)
// whose input is already blocked becomes a kiln.BlockedPool (pools never pull a value into the
// layout on their own). Then the boundaries:
//   - a plain value read blocked gets one kiln.ReorderToBlocked, shared by all its blocked readers,
//     except the X of a conv with fewer channels than a block (a network's 3-channel image: the
//     conv reads NCHW directly, oneDNN's first-layer kernels do, and nothing is padded);
//   - a blocked value read by anything else (or a graph output) gets one kiln.ReorderFromBlocked,
//     which produces it under its original name, so later nodes, graph outputs and kiln compare
//     see the same values as before. Blocked values get new names ("<value>.blocked"); each
//     blocked node names the plain value it stands for (kiln.plain_value, kiln.plain_channels),
//     so kiln compare still checks every layer against the reference.
// A Concat along the channels of blocked values, all but the last filling whole blocks, stays the
// same Concat on their blocked forms (along the channel blocks).
// Leaves alone: other grouped convs, 1-D/3-D convs, non-constant weights, other dtypes, convs and
// pools with a pad as large as their window (no blocked tactic takes them), and every other op.
//
// The cost of the reorders decides (layout_blocked; layout_blocked_with_block with decide_by_cost):
// the blocked nodes form islands (connected through the blocked values they pass each other and the
// ReorderToBlocked they share), and an island stays blocked only when what its convs gain is at least
// what its boundary reorders cost, both counted in bytes a reorder moves:
//   - cost: each ReorderToBlocked / ReorderFromBlocked reads a map and writes it once: 2 x its bytes;
//   - gain of a conv: the blocked kernels are faster than the plain ones (kiln build with and without
//     this pass, AMD EPYC, 2 threads, a loaded machine: mobilenet_v2 15-27% slower plain, resnext50
//     17-23%), counted as
//     kBlockedComputeGain of the conv's FLOPs at kReorderBytesPerFlop (a reorder moves ~15 GB/s where
//     the convs run ~450 GFLOP/s); and a conv that kiln's plain NCHW kernels do not take directly
//     (those take unpadded 1x1 group-1 convs, conv2d_kiln_1x1, and depthwise ones,
//     conv2d_kiln_depthwise) would, left plain, run oneDNN's blocked kernel between reorders of its
//     own (conv2d_onednn_blocked): 2 x the bytes of its X (unless a plain X with fewer channels than a
//     block), of its residual and of its Y.
// So a backbone stays blocked (its reorders are at its two ends), and a lone depthwise or 1x1 conv
// between layers that cannot run blocked (ConvNeXt's 7x7 depthwise conv between its residual Add
// and a Transpose, ResNeXt's 1x1 convs around grouped convs of fewer channels than a block) stays
// plain instead of paying a reorder on each side. An island with a map of unknown size (symbolic
// dims) stays blocked, as every island did before the cost model.
// The block is the target's (Target::layout_block, kiln build --layout-block): by default the vector
// width in floats of the target's instruction set, 16 with AVX-512, 8 with AVX2; 0 (the pass changes
// nothing) without either or without oneDNN, whose kernels are the point (backends/cpu/tactic_list.h).
#include <map>

#include "ops/interpreter.h"
#include "ops/op_traits.h"
#include "passes/fusion_util.h"
#include "passes/layout_islands.h"

namespace kiln::passes {

namespace {

using fusion::is_kiln;
using fusion::is_onnx;
using fusion::no_sources;

bool is_f32_rank(const ir::Graph& g, const std::string& v, size_t rank) {
  const ir::TypeInfo* t = fusion::type_of(g, v);
  return t && t->elem == DataType::kFloat32 && t->shape.rank_known && t->shape.rank() == rank;
}

// A conv the blocked kernels take; `channels` receives its input channels C.
bool is_blockable_conv(const ir::Graph& g, const ir::Node& n, int64_t block, int64_t* channels) {
  bool onnx = is_onnx(n, "Conv"), fusedc = is_kiln(n, "FusedConv");
  if (!(onnx || fusedc) || n.outputs.size() != 1 || n.outputs[0].empty()) return false;
  if (n.inputs.size() < 2 || n.inputs.size() > (fusedc ? 4u : 3u) || n.inputs[0].empty()) return false;
  const Tensor* w = ir::constant_value(g, n.inputs[1]);
  if (!w || w->dtype() != DataType::kFloat32 || w->rank() != 4) return false;
  if (n.has_input(2) && !ir::is_constant(g, n.inputs[2])) return false;
  if (!is_f32_rank(g, n.inputs[0], 4) || !is_f32_rank(g, n.outputs[0], 4)) return false;
  const ir::TypeInfo* x = fusion::type_of(g, n.inputs[0]);
  const int64_t group = n.attr_int("group", 1), c = w->dim(1) * group, m = w->dim(0);
  if (!x->shape.dims[1].known() || x->shape.dims[1].value != c || c <= 0 || m <= 0) return false;
  // Grouped: when each group is whole blocks (oneDNN's blocked kernels take those).
  if (!(group == 1 || (group == c && group == m) || ((c / group) % block == 0 && (m / group) % block == 0)))
    return false;
  if (n.has_input(3) && !fusion::same_type(g, n.inputs[3], n.outputs[0])) return false;
  // Pads as large as the (dilated) kernel: the blocked kernels decline them (onednn_conv.cc's
  // resolve_conv), the plain tactics too; no blocked layer would run on the reference kernel.
  const std::vector<int64_t> pads = n.attr_ints("pads"), dil = n.attr_ints("dilations", {1, 1});
  for (size_t i = 0; i < pads.size(); ++i) {
    const size_t d = i % 2;
    if (dil.size() == 2 && pads[i] >= (w->dim(static_cast<int64_t>(d) + 2) - 1) * dil[d] + 1) return false;
  }
  *channels = c;
  return true;
}

bool is_blockable_pool(const ir::Graph& g, const ir::Node& n) {
  bool pool = is_onnx(n, "MaxPool") || is_onnx(n, "AveragePool") || is_onnx(n, "GlobalAveragePool") ||
              is_onnx(n, "GlobalMaxPool");
  if (!pool || n.inputs.size() != 1 || n.outputs.empty() || n.outputs[0].empty()) return false;
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (!n.outputs[i].empty()) return false;  // MaxPool's Indices are positions in the plain layout
  if (n.attr("kernel_shape") && n.attr_ints("kernel_shape").size() != 2) return false;
  // Pads as large as the window: the blocked pool declines them (onednn_pool.cc; the undilated
  // window here, the smaller: such a pool stays plain, on a plain tactic).
  const std::vector<int64_t> ks = n.attr_ints("kernel_shape"), pads = n.attr_ints("pads");
  for (size_t i = 0; i < pads.size() && ks.size() == 2; ++i)
    if (pads[i] >= ks[i % 2]) return false;
  return is_f32_rank(g, n.inputs[0], 4) && is_f32_rank(g, n.outputs[0], 4);
}

// Elementwise ops (ops::trait::kElementwiseUnary / kElementwiseBroadcast: the set fuse_elementwise
// merges, and its kiln.FusedElementwise) compute the same on the blocked layout as on the plain one
// when no operand broadcasts, when one broadcasts only over the plane (H, W: a squeeze-excite block's
// channel scale stays blocked, no reorders around it), or when the only constants that broadcast are
// per-channel ones and the channels are whole blocks (a BatchNormalization left as Mul/Add, DenseNet's
// pre-activations): those become [1, C / B, 1, 1, B] constants.
bool is_elementwise_op(const ir::Node& n) {
  if (n.outputs.size() != 1 || n.outputs[0].empty() || n.inputs.empty()) return false;
  if (!ops::has_trait(n, ops::trait::kElementwiseUnary | ops::trait::kElementwiseBroadcast)) return false;
  return !n.domain.empty() || n.opset >= 7;
}

// f(0, ..., 0) == 0 (constant operands as they are): the padding lanes of a blocked result stay zero.
// Sigmoid, Exp, Add of a constant... fail it. Declared by kKeepsZero ops, else checked by running
// the node on one-element zeros.
bool preserves_zero(const ir::Graph& g, const ir::Node& n) {
  if (ops::has_trait(n, ops::trait::kKeepsZero)) return true;  // whatever its attributes
  auto sub = std::make_shared<ir::Graph>();
  sub->name = "zero_check";
  sub->opset_imports = g.opset_imports;
  ir::Node c = n;
  std::map<std::string, ops::Value> feeds;
  for (auto& in : c.inputs) {
    if (in.empty()) continue;
    if (const Tensor* t = ir::constant_value(g, in)) {
      sub->initializers[in] = *t;
    } else if (!feeds.count(in)) {
      sub->inputs.push_back({in, ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims({1, 1, 1, 1}))});
      feeds[in] = ops::Value(Tensor(DataType::kFloat32, {1, 1, 1, 1}));
    }
  }
  sub->outputs.push_back({c.outputs[0], ir::TypeInfo()});
  sub->nodes.push_back(std::move(c));
  ops::Interpreter interp(sub);
  auto r = interp.run(feeds);
  if (!r.ok() || r.value().size() != 1 || !r.value()[0].is_tensor()) return false;
  const Tensor& y = r.value()[0].tensor;
  return y.dtype() == DataType::kFloat32 && y.numel() == 1 && y.data<float>()[0] == 0.0f;
}

constexpr double kBlockedComputeGain = 0.15;  // share of a conv's time the blocked kernels save
constexpr double kReorderBytesPerFlop = 1.0 / 30;

// An unpadded 1x1 group-1 conv or a depthwise conv: kiln's plain NCHW kernels take it as it is.
bool has_direct_plain_kernel(const ir::Graph& g, const ir::Node& n) {
  const Tensor* w = ir::constant_value(g, n.inputs[1]);
  const int64_t group = n.attr_int("group", 1);
  if (group > 1 && group == w->dim(0) && w->dim(1) == 1) return true;
  if (group != 1 || w->dim(2) != 1 || w->dim(3) != 1 || n.attr_string("auto_pad", "NOTSET") != "NOTSET") return false;
  for (int64_t p : n.attr_ints("pads"))
    if (p != 0) return false;
  return true;
}

class Rewriter {
 public:
  Rewriter(ir::Graph& g, int64_t block, bool decide_by_cost) : g_(g), block_(block), decide_by_cost_(decide_by_cost) {
    for (const auto& n : g.nodes) {
      taken_.insert(n.name);
      for (const auto& o : n.outputs) taken_.insert(o);
    }
    for (const auto& i : g.inputs) taken_.insert(i.name);
    for (const auto& [k, v] : g.initializers) taken_.insert(k);
    for (const auto& [k, v] : g.value_types) taken_.insert(k);
  }

  int run() {
    ir::UseIndex uses(g_);
    const size_t count = g_.nodes.size();
    std::set<size_t> plain_convs;  // blockable convs the cost model keeps plain
    int changed = decide(plain_convs);
    if (decide_by_cost_ && changed) {
      for (const layout::Island& is : islands(uses))
        if (is.goes_plain()) plain_convs.insert(is.convs.begin(), is.convs.end());
      if (!plain_convs.empty()) changed = decide(plain_convs);
    }
    if (!changed) return 0;
    std::map<std::string, bool> needs_plain;
    for (const auto& [v, c] : blocked_channels_) needs_plain[v] = needs_plain_form(v, uses);
    std::map<std::string, int64_t>& blocked_channels = blocked_channels_;
    std::vector<ir::Node> out;
    out.reserve(count + 8);
    for (size_t i = 0; i < count; ++i) {
      ir::Node n = g_.nodes[i];  // a copy: reads_blocked() looks at the original
      if (kind_[i] == Kind::kPlain) {
        out.push_back(std::move(n));
        continue;
      }
      const std::string y = n.outputs[0];
      std::string yb = fresh(y + ".blocked");
      ir::Node b;
      if (kind_[i] == Kind::kElementwise || kind_[i] == Kind::kConcat) {
        b = std::move(n);  // the same op, on blocked operands
        for (size_t j = 0; j < b.inputs.size(); ++j) {
          if (reads_blocked(i, j)) {
            b.inputs[j] = blocked_form(b.inputs[j], out);
          } else if (kind_[i] == Kind::kElementwise && !b.inputs[j].empty()) {
            if (const Tensor* t = ir::constant_value(g_, b.inputs[j]); t && t->numel() != 1)
              b.inputs[j] = blocked_constant(b.inputs[j]);
          }
        }
        if (kind_[i] == Kind::kConcat) fusion::set_int(b, "axis", 1);  // the channel blocks of [N, Cb, H, W, B]
      } else {
        b = fusion::kiln_node(kind_[i] == Kind::kConv ? "BlockedConv" : "BlockedPool", n.name);
        b.attrs = n.attrs;
        b.inputs = n.inputs;
        for (size_t j = 0; j < b.inputs.size(); ++j)
          if (reads_blocked(i, j)) b.inputs[j] = blocked_form(b.inputs[j], out);
        if (kind_[i] == Kind::kPool) {
          fusion::set_string(b, "pool", n.op_type);
          fusion::set_int(b, "pool_opset", n.opset);
        }
        fusion::set_int(b, "block", block_);
        // What it stands for in the plain graph, so kiln compare can check it against the reference.
        fusion::set_string(b, "kiln.plain_value", y);
        fusion::set_int(b, "kiln.plain_channels", blocked_channels[y]);
      }
      b.outputs = {yb};
      out.push_back(std::move(b));
      made_blocked_[y] = yb;
      if (needs_plain[y]) {
        ir::Node r = fusion::kiln_node("ReorderFromBlocked", fresh(y + "/from_blocked"));
        r.inputs = {yb};
        r.outputs = {y};
        fusion::set_int(r, "block", block_);
        fusion::set_int(r, "channels", blocked_channels[y]);
        no_sources(r);
        out.push_back(std::move(r));
      }
    }
    g_.nodes = std::move(out);
    return changed;
  }

 private:
  enum class Kind { kPlain, kConv, kPool, kElementwise, kConcat };

  // Which nodes go blocked, in order (convs but those in `plain_convs`; pools and elementwise ops
  // follow their producers' decisions); fills kind_, blocked_channels_ and made_or_blocked_. Returns
  // how many nodes go blocked.
  int decide(const std::set<size_t>& plain_convs) {
    const size_t count = g_.nodes.size();
    kind_.assign(count, Kind::kPlain);
    blocked_channels_.clear();
    made_or_blocked_.clear();
    int changed = 0;
    for (size_t i = 0; i < count; ++i) {
      const ir::Node& n = g_.nodes[i];
      int64_t c = 0;
      if (!plain_convs.count(i) && is_blockable_conv(g_, n, block_, &c)) {
        kind_[i] = Kind::kConv;
        blocked_channels_[n.outputs[0]] = ir::constant_value(g_, n.inputs[1])->dim(0);
      } else if (is_blockable_pool(g_, n) && blocked_channels_.count(n.inputs[0])) {
        kind_[i] = Kind::kPool;
        blocked_channels_[n.outputs[0]] = blocked_channels_[n.inputs[0]];
      } else if (int64_t ch = elementwise_channels(n, blocked_channels_); ch > 0) {
        kind_[i] = Kind::kElementwise;
        blocked_channels_[n.outputs[0]] = ch;
      } else if (int64_t cc = concat_channels(n, blocked_channels_); cc > 0) {
        kind_[i] = Kind::kConcat;
        blocked_channels_[n.outputs[0]] = cc;
      }
      if (kind_[i] != Kind::kPlain) ++changed, made_or_blocked_.insert(n.outputs[0]);
    }
    return changed;
  }

  // A blocked value needs its plain form when a graph output or read by a plain node (or by a
  // blocked one in a position it reads plain: W, B, a subgraph).
  bool needs_plain_form(const std::string& v, const ir::UseIndex& uses) const {
    return layout::needs_plain_form(g_, uses, v, [&](size_t k, size_t j) { return reads_blocked(k, j); });
  }

  // Bytes of a float32 value; -1 when a dim is not known.
  double value_bytes(const std::string& v) const { return layout::value_bytes(g_, v, 4); }

  // What conv i gains blocked, in bytes a reorder moves (see the comment on top): its compute share,
  // and the reorders its plain form would make on its own.
  double conv_gain(size_t i) const {
    const ir::Node& n = g_.nodes[i];
    const Tensor* w = ir::constant_value(g_, n.inputs[1]);
    // 2 x (multiply-adds per output element) x output elements.
    const double flops = 2.0 * static_cast<double>(w->numel() / w->dim(0)) * value_bytes(n.outputs[0]) / 4;
    const double compute = kBlockedComputeGain * kReorderBytesPerFlop * flops;
    if (has_direct_plain_kernel(g_, n)) return compute;
    double bytes = value_bytes(n.outputs[0]);
    if (reads_blocked(i, 0)) bytes += value_bytes(n.inputs[0]);
    if (n.has_input(3)) bytes += value_bytes(n.inputs[3]);
    return compute + 2 * bytes;
  }

  // The islands of the decided blocked nodes, with their gain and the cost of their boundary reorders.
  std::vector<layout::Island> islands(const ir::UseIndex& uses) const {
    return layout::islands(
        g_, [&](size_t i) { return kind_[i] != Kind::kPlain; }, [&](size_t i) { return kind_[i] == Kind::kConv; },
        [&](size_t i, size_t j) { return reads_blocked(i, j); }, [&](const std::string& v) { return value_bytes(v); },
        [&](size_t i) { return conv_gain(i); }, [&](const std::string& v) { return needs_plain_form(v, uses); });
  }

  // Whether node i (decided blocked) reads input j in the blocked layout: a conv its X (unless a
  // plain X with fewer channels than a block) and residual, a pool its X, an elementwise op every
  // operand but its constants.
  bool reads_blocked(size_t i, size_t j) const {
    const ir::Node& n = g_.nodes[i];
    if (j >= n.inputs.size() || n.inputs[j].empty()) return false;
    switch (kind_[i]) {
      case Kind::kConv:
        if (j == 3) return true;
        if (j != 0) return false;
        return made_or_blocked_.count(n.inputs[0]) ||
               ir::constant_value(g_, n.inputs[1])->dim(1) * n.attr_int("group", 1) >= block_;
      case Kind::kPool: return j == 0;
      case Kind::kElementwise: return !ir::is_constant(g_, n.inputs[j]);
      case Kind::kConcat: return true;
      default: return false;
    }
  }

  // The channels of an elementwise node the layout can carry (0: none): every non-constant operand
  // is a blocked value of the output's shape, or of its batch and channels with a 1 x 1 plane (see
  // broadcasts_over_plane), constants are scalars or, with whole blocks, per channel, and f(0) = 0
  // unless whole blocks leave no padding lanes.
  int64_t elementwise_channels(const ir::Node& n, const std::map<std::string, int64_t>& blocked_channels) {
    if (!is_elementwise_op(n) || !is_f32_rank(g_, n.outputs[0], 4)) return 0;
    int64_t ch = 0;
    std::vector<const Tensor*> per_channel;
    for (const auto& in : n.inputs) {
      if (in.empty()) continue;
      if (const Tensor* t = ir::constant_value(g_, in)) {
        if (t->numel() != 1) per_channel.push_back(t);
        continue;
      }
      auto it = blocked_channels.find(in);
      if (it == blocked_channels.end() || (ch && it->second != ch) || !broadcasts_over_plane(in, n.outputs[0]))
        return 0;
      ch = it->second;
    }
    if (!ch) return 0;
    for (const Tensor* t : per_channel)
      if (ch % block_ != 0 || !is_per_channel(*t, ch)) return 0;
    // Whole blocks have no padding lanes to keep at zero.
    if (ch % block_ != 0 && !preserves_zero(g_, n)) return 0;
    return ch;
  }

  // A constant of shape [C, 1, 1] or [1, C, 1, 1]: one value per channel of a 4-D operand.
  static bool is_per_channel(const Tensor& t, int64_t channels) {
    if (t.dtype() != DataType::kFloat32 || t.rank() < 3 || t.rank() > 4) return false;
    const int64_t r = t.rank();
    return t.dim(r - 3) == channels && t.dim(r - 2) == 1 && t.dim(r - 1) == 1 && (r == 3 || t.dim(0) == 1);
  }

  // The blocked form of a per-channel constant (whole blocks only): [1, C / B, 1, 1, B], the same
  // values in the same order, broadcasting against [N, C / B, H, W, B] as [C, 1, 1] did against NCHW.
  std::string blocked_constant(const std::string& v) {
    if (auto it = blocked_constants_.find(v); it != blocked_constants_.end()) return it->second;
    const Tensor* t = ir::constant_value(g_, v);
    const int64_t c = t->dim(t->rank() - 3);
    std::string vb = fresh(v + ".blocked");
    g_.initializers[vb] = t->reshaped({1, c / block_, 1, 1, block_});
    blocked_constants_[v] = vb;
    return vb;
  }

  // `in` has `out`'s dtype, batch and channels, and its spatial dims are `out`'s or 1: then its
  // blocked form [N, Cb, H|1, W|1, B] broadcasts against `out`'s [N, Cb, H, W, B] as the plain forms
  // do (a squeeze-excite block's channel scale [N, C, 1, 1] times the feature map [N, C, H, W]).
  bool broadcasts_over_plane(const std::string& in, const std::string& out) const {
    if (fusion::same_type(g_, in, out)) return true;
    const ir::TypeInfo* a = fusion::type_of(g_, in);
    const ir::TypeInfo* b = fusion::type_of(g_, out);
    if (!a || !b || a->elem != b->elem || !is_f32_rank(g_, in, 4)) return false;
    const auto& da = a->shape.dims;
    const auto& db = b->shape.dims;
    if (!fusion::same_dim(da[0], db[0]) || !fusion::same_dim(da[1], db[1])) return false;
    for (size_t d = 2; d < 4; ++d)
      if (!fusion::same_dim(da[d], db[d]) && !(da[d].known() && da[d].value == 1)) return false;
    return true;
  }

  // The channels of a channel Concat the layout can carry (0: none): every input a blocked value,
  // all but the last filling whole blocks, so the blocked inputs concatenated along their channel
  // blocks are the blocked output, its padding lanes (the last input's) at the end. SqueezeNet's
  // fire modules end so: without it, two ReorderFromBlocked and a ReorderToBlocked per module.
  int64_t concat_channels(const ir::Node& n, const std::map<std::string, int64_t>& blocked_channels) {
    if (!is_onnx(n, "Concat") || n.outputs.size() != 1 || n.outputs[0].empty() || n.inputs.empty()) return 0;
    const int64_t axis = n.attr_int("axis", 1);
    if ((axis != 1 && axis != -3) || !is_f32_rank(g_, n.outputs[0], 4)) return 0;
    int64_t ch = 0;
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      auto it = blocked_channels.find(n.inputs[j]);
      if (it == blocked_channels.end() || !is_f32_rank(g_, n.inputs[j], 4)) return 0;
      if (j + 1 < n.inputs.size() && it->second % block_ != 0) return 0;
      ch += it->second;
    }
    return ch;
  }

  // The blocked name of `v`: made by a blocked node, or through one shared ReorderToBlocked
  // (appended to `out` at its first use).
  std::string blocked_form(const std::string& v, std::vector<ir::Node>& out) {
    if (auto it = made_blocked_.find(v); it != made_blocked_.end()) return it->second;
    std::string vb = fresh(v + ".blocked");
    ir::Node r = fusion::kiln_node("ReorderToBlocked", fresh(v + "/to_blocked"));
    r.inputs = {v};
    r.outputs = {vb};
    fusion::set_int(r, "block", block_);
    no_sources(r);
    out.push_back(std::move(r));
    made_blocked_[v] = vb;
    return vb;
  }

  std::string fresh(const std::string& base) {
    std::string s = base;
    for (int k = 1; taken_.count(s); ++k) s = base + "_" + std::to_string(k);
    taken_.insert(s);
    return s;
  }

  ir::Graph& g_;
  int64_t block_;
  bool decide_by_cost_;
  std::vector<Kind> kind_;                                // per node of the original order
  std::map<std::string, int64_t> blocked_channels_;       // value -> channels, for values made blocked
  std::set<std::string> made_or_blocked_;                 // values blocked nodes produce
  std::map<std::string, std::string> made_blocked_;       // plain value -> its blocked form
  std::map<std::string, std::string> blocked_constants_;  // per-channel constant -> its blocked form
  std::set<std::string> taken_;                           // every name in the graph and every name made here
};

}  // namespace

Result<int> layout_blocked_with_block(ir::Graph& g, int64_t block, bool decide_by_cost) {
  if (block <= 0) return 0;
  return Rewriter(g, block, decide_by_cost).run();
}

Result<int> layout_blocked(ir::Graph& g, const Target& target) {
  // A CPU target keeping activations channels-last (the AMX bfloat16 path, engine/target.cc) leaves the
  // convolutions to layout_nhwc.
  const bool cpu_blocked = target.device.kind == DeviceKind::kCPU && !target.channels_last;
  return layout_blocked_with_block(g, cpu_blocked ? target.layout_block : 0, true);
}

}  // namespace kiln::passes

// layout_nhwc: on CUDA targets that compute in float16 or bfloat16, keeps 2-D convolution and pooling
// activations channels-last ([N, H, W, C], ops/kiln_layout.h) from one layer to the next, so cuDNN's
// tensor-core kernels (NHWC-native) run without converting their input and output around every
// layer; Transposes remain only at the boundaries (run by the CUDA backend's transpose tactic).
//
// Matches: Conv and kiln.FusedConv with a constant 4-D W (and constant B), a 4-D float32 X and a
// residual of the output's shape. An unpadded, unit-stride 1x1 group-1 conv becomes a kiln.FusedMatMul
// ([N*H*W, C] x [C, M]: X channels-last times the transposed weights, bias, residual and activation
// in the matmul's epilogue; cuBLASLt runs it); any other conv a kiln.NhwcConv (cuDNN, NHWC descriptors).
// A MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool (2-D, without Indices) whose input is
// channels-last becomes a kiln.NhwcPool; an elementwise op whose non-constant operands are all
// channels-last values of its output's shape and whose constants are scalars stays the same op on
// them; a Concat along the channels of channels-last values becomes a Concat along the last axis.
// Boundaries:
//   - a plain value read channels-last gets one Transpose (perm 0,2,3,1) shared by all its readers;
//   - a channels-last value read by anything else (or a graph output) gets one Transpose (perm
//     0,3,1,2) producing it under its original name, so later nodes, graph outputs and kiln compare
//     see the same values; a pooled [N, 1, 1, C] is a view of [N, C, 1, 1]: a Reshape instead.
//     Channels-last values are named "<value>.nhwc"; each node making one names the plain value it
//     stands for (kiln.plain_value, kiln.plain_layout "nhwc") for kiln compare.
// The cost decides, per island (nodes connected through the channels-last values they pass and the
// Transposes they share), in bytes moved: a float16 conv cuDNN runs on NCHW converts X and Y (and the
// residual) to NHWC and back inside the call, so each conv gains 2 x the bytes of those; each boundary
// Transpose costs 2 x the bytes of its value. An island stays channels-last when its gain is at least
// its cost (maps of unknown size: it stays).
// Float32 builds are left alone: without tensor cores cuDNN's NCHW FMA kernels are its fast ones (and
// NHWC's win is the tensor cores' native layout); TF32 builds too, untested here.
#include <map>
#include <set>

#include "ir/attribute_builders.h"
#include "ir/rewrite.h"
#include "ops/op_traits.h"
#include "passes/fusion_util.h"
#include "passes/layout_islands.h"

namespace kiln::passes {

namespace {

using fusion::is_kiln;
using fusion::is_onnx;
using fusion::no_sources;

bool is_f32_4d(const ir::Graph& g, const std::string& v) {
  const ir::TypeInfo* t = fusion::type_of(g, v);
  return t && t->elem == DataType::kFloat32 && t->shape.rank_known && t->shape.rank() == 4;
}

bool is_nhwc_conv(const ir::Graph& g, const ir::Node& n) {
  bool onnx = is_onnx(n, "Conv"), fusedc = is_kiln(n, "FusedConv");
  if (!(onnx || fusedc) || n.outputs.size() != 1 || n.outputs[0].empty()) return false;
  if (n.inputs.size() < 2 || n.inputs.size() > (fusedc ? 4u : 3u) || n.inputs[0].empty()) return false;
  const Tensor* w = ir::constant_value(g, n.inputs[1]);
  if (!w || w->dtype() != DataType::kFloat32 || w->rank() != 4) return false;
  if (n.has_input(2) && !ir::is_constant(g, n.inputs[2])) return false;
  if (!is_f32_4d(g, n.inputs[0]) || !is_f32_4d(g, n.outputs[0])) return false;
  const ir::TypeInfo* x = fusion::type_of(g, n.inputs[0]);
  const int64_t group = n.attr_int("group", 1);
  if (group <= 0 || !x->shape.dims[1].known() || x->shape.dims[1].value != w->dim(1) * group) return false;
  return !n.has_input(3) || fusion::same_type(g, n.inputs[3], n.outputs[0]);
}

// An unpadded unit-stride 1x1 group-1 conv: a matrix product over the channels.
bool is_unpadded_pointwise(const ir::Graph& g, const ir::Node& n) {
  const Tensor* w = ir::constant_value(g, n.inputs[1]);
  if (n.attr_int("group", 1) != 1 || w->dim(2) != 1 || w->dim(3) != 1) return false;
  const std::string ap = n.attr_string("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "VALID") return false;
  for (int64_t p : n.attr_ints("pads"))
    if (p != 0) return false;
  for (int64_t s : n.attr_ints("strides"))
    if (s != 1) return false;
  return true;
}

bool is_nhwc_pool(const ir::Graph& g, const ir::Node& n) {
  bool pool = is_onnx(n, "MaxPool") || is_onnx(n, "AveragePool") || is_onnx(n, "GlobalAveragePool") ||
              is_onnx(n, "GlobalMaxPool");
  if (!pool || n.inputs.size() != 1 || n.outputs.empty() || n.outputs[0].empty()) return false;
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (!n.outputs[i].empty()) return false;  // MaxPool's Indices are positions in the NCHW layout
  if (n.attr("kernel_shape") && n.attr_ints("kernel_shape").size() != 2) return false;
  return is_f32_4d(g, n.inputs[0]) && is_f32_4d(g, n.outputs[0]);
}

class Rewriter {
 public:
  explicit Rewriter(ir::Graph& g) : g_(g) {
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
    std::set<size_t> plain;
    int changed = decide(plain);
    if (changed) {
      for (const auto& is : islands(uses))
        if (is.goes_plain()) plain.insert(is.convs.begin(), is.convs.end());
      if (!plain.empty()) changed = decide(plain);
    }
    if (!changed) return 0;
    std::map<std::string, bool> needs_plain;
    for (const auto& v : made_) needs_plain[v] = needs_plain_form(v, uses);
    const int opset = fusion::onnx_opset(g_);
    std::vector<ir::Node> out;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      ir::Node n = g_.nodes[i];
      if (kind_[i] == Kind::kPlain) {
        out.push_back(std::move(n));
        continue;
      }
      const std::string y = n.outputs[0], yl = fresh(y + ".nhwc");
      ir::Node b;
      if (kind_[i] == Kind::kElementwise || kind_[i] == Kind::kConcat) {
        b = std::move(n);
        for (size_t j = 0; j < b.inputs.size(); ++j)
          if (reads_nhwc(i, j)) b.inputs[j] = nhwc_form(b.inputs[j], out, opset);
        if (kind_[i] == Kind::kConcat) fusion::set_int(b, "axis", 3);
      } else if (kind_[i] == Kind::kConv && is_unpadded_pointwise(g_, n)) {
        b = fusion::kiln_node("FusedMatMul", n.name);
        for (const auto& [k, v] : n.attrs)
          if (k.rfind("activation", 0) == 0 || k == "kiln.sources") b.attrs[k] = v;
        b.inputs = {nhwc_form(n.inputs[0], out, opset), matmul_weights(n.inputs[1]), n.has_input(2) ? n.inputs[2] : "",
                    n.has_input(3) ? nhwc_form(n.inputs[3], out, opset) : ""};
        while (!b.inputs.empty() && b.inputs.back().empty()) b.inputs.pop_back();
      } else {
        b = fusion::kiln_node(kind_[i] == Kind::kConv ? "NhwcConv" : "NhwcPool", n.name);
        b.attrs = n.attrs;
        b.inputs = n.inputs;
        for (size_t j = 0; j < b.inputs.size(); ++j)
          if (reads_nhwc(i, j)) b.inputs[j] = nhwc_form(b.inputs[j], out, opset);
        if (kind_[i] == Kind::kPool) {
          fusion::set_string(b, "pool", n.op_type);
          fusion::set_int(b, "pool_opset", n.opset);
        }
      }
      if (kind_[i] != Kind::kElementwise && kind_[i] != Kind::kConcat) {
        fusion::set_string(b, "kiln.plain_value", y);
        fusion::set_string(b, "kiln.plain_layout", "nhwc");
      }
      b.outputs = {yl};
      out.push_back(std::move(b));
      made_nhwc_[y] = yl;
      if (needs_plain[y]) out.push_back(to_plain(yl, y, opset));
    }
    g_.nodes = std::move(out);
    return changed;
  }

 private:
  enum class Kind { kPlain, kConv, kPool, kElementwise, kConcat };

  int decide(const std::set<size_t>& plain) {
    kind_.assign(g_.nodes.size(), Kind::kPlain);
    made_.clear();
    int changed = 0;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const ir::Node& n = g_.nodes[i];
      if (!plain.count(i) && is_nhwc_conv(g_, n))
        kind_[i] = Kind::kConv;
      else if (is_nhwc_pool(g_, n) && made_.count(n.inputs[0]))
        kind_[i] = Kind::kPool;
      else if (is_elementwise(n))
        kind_[i] = Kind::kElementwise;
      else if (is_channel_concat(n))
        kind_[i] = Kind::kConcat;
      if (kind_[i] != Kind::kPlain) ++changed, made_.insert(n.outputs[0]);
    }
    return changed;
  }

  // Every non-constant operand channels-last and of the output's type, every constant a scalar.
  bool is_elementwise(const ir::Node& n) const {
    if (n.outputs.size() != 1 || n.outputs[0].empty() || n.inputs.empty()) return false;
    if (!ops::has_trait(n, ops::trait::kElementwiseUnary | ops::trait::kElementwiseBroadcast)) return false;
    if ((n.domain.empty() && n.opset < 7) || !is_f32_4d(g_, n.outputs[0])) return false;
    int operands = 0;
    for (const auto& in : n.inputs) {
      if (in.empty()) continue;
      if (const Tensor* t = ir::constant_value(g_, in)) {
        if (t->numel() != 1) return false;
        continue;
      }
      if (!made_.count(in) || !fusion::same_type(g_, in, n.outputs[0])) return false;
      ++operands;
    }
    return operands > 0;
  }

  bool is_channel_concat(const ir::Node& n) const {
    if (!is_onnx(n, "Concat") || n.outputs.size() != 1 || n.outputs[0].empty() || n.inputs.empty()) return false;
    const int64_t axis = n.attr_int("axis", 1);
    if ((axis != 1 && axis != -3) || !is_f32_4d(g_, n.outputs[0])) return false;
    for (const auto& in : n.inputs)
      if (!made_.count(in) || !is_f32_4d(g_, in)) return false;
    return true;
  }

  bool reads_nhwc(size_t i, size_t j) const {
    const ir::Node& n = g_.nodes[i];
    if (j >= n.inputs.size() || n.inputs[j].empty()) return false;
    switch (kind_[i]) {
      case Kind::kConv: return j == 0 || j == 3;
      case Kind::kPool: return j == 0;
      case Kind::kElementwise: return !ir::is_constant(g_, n.inputs[j]);
      case Kind::kConcat: return true;
      default: return false;
    }
  }

  bool needs_plain_form(const std::string& v, const ir::UseIndex& uses) const {
    return layout::needs_plain_form(g_, uses, v, [&](size_t k, size_t j) { return reads_nhwc(k, j); });
  }

  double value_bytes(const std::string& v) const { return layout::value_bytes(g_, v, 2); }  // float16 / bfloat16

  // A conv gains the conversions cuDNN would do inside an NCHW call (see the comment on top).
  std::vector<layout::Island> islands(const ir::UseIndex& uses) const {
    return layout::islands(
        g_, [&](size_t i) { return kind_[i] != Kind::kPlain; }, [&](size_t i) { return kind_[i] == Kind::kConv; },
        [&](size_t i, size_t j) { return reads_nhwc(i, j); }, [&](const std::string& v) { return value_bytes(v); },
        [&](size_t i) {
          const ir::Node& n = g_.nodes[i];
          return 2 * (value_bytes(n.outputs[0]) + value_bytes(n.inputs[0]) +
                      (n.has_input(3) ? value_bytes(n.inputs[3]) : 0));
        },
        [&](const std::string& v) { return needs_plain_form(v, uses); });
  }

  // [M, C, 1, 1] -> [C, M] (a new float32 initializer, one per weight).
  std::string matmul_weights(const std::string& w) {
    if (auto it = matmul_weights_.find(w); it != matmul_weights_.end()) return it->second;
    const Tensor* t = ir::constant_value(g_, w);
    const int64_t m = t->dim(0), c = t->dim(1);
    Tensor wt(DataType::kFloat32, {c, m});
    const float* src = t->data<float>();
    float* dst = wt.data<float>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 0; k < c; ++k) dst[k * m + i] = src[i * c + k];
    std::string name = fresh(w + ".cm");
    g_.initializers[name] = std::move(wt);
    matmul_weights_[w] = name;
    return name;
  }

  ir::Node transpose(const std::string& name, const std::string& in, const std::string& out_name,
                     std::vector<int64_t> perm, int opset) {
    ir::Node t;
    t.name = name;
    t.op_type = "Transpose";
    t.opset = opset;
    t.inputs = {in};
    t.outputs = {out_name};
    t.attrs["perm"] = ir::attr_ints(std::move(perm));
    no_sources(t);
    return t;
  }

  // The channels-last name of `v`: made by a rewritten node, or through one shared Transpose.
  std::string nhwc_form(const std::string& v, std::vector<ir::Node>& out, int opset) {
    if (auto it = made_nhwc_.find(v); it != made_nhwc_.end()) return it->second;
    std::string vl = fresh(v + ".nhwc");
    out.push_back(transpose(fresh(v + "/to_nhwc"), v, vl, {0, 2, 3, 1}, opset));
    made_nhwc_[v] = vl;
    return vl;
  }

  // The plain form of channels-last `vl` under its original name `v`: a Transpose, or a Reshape of a
  // [N, 1, 1, C] (the same bytes as [N, C, 1, 1]).
  ir::Node to_plain(const std::string& vl, const std::string& v, int opset) {
    const ir::TypeInfo* t = fusion::type_of(g_, v);
    const auto& d = t->shape.dims;
    if (d[1].known() && d[2].known() && d[3].known() && d[2].value == 1 && d[3].value == 1) {
      ir::Node r;
      r.name = fresh(v + "/from_nhwc");
      r.op_type = "Reshape";
      r.opset = opset;
      std::string shape = fresh(v + "/from_nhwc_shape");
      g_.initializers[shape] = Tensor::from_vector<int64_t>(DataType::kInt64, {4}, {0, d[1].value, 1, 1});
      r.inputs = {vl, shape};
      r.outputs = {v};
      no_sources(r);
      return r;
    }
    return transpose(fresh(v + "/from_nhwc"), vl, v, {0, 3, 1, 2}, opset);
  }

  std::string fresh(const std::string& base) {
    std::string s = base;
    for (int k = 1; taken_.count(s); ++k) s = base + "_" + std::to_string(k);
    taken_.insert(s);
    return s;
  }

  ir::Graph& g_;
  std::vector<Kind> kind_;
  std::set<std::string> made_;                         // values the rewritten nodes produce
  std::map<std::string, std::string> made_nhwc_;       // plain value -> its channels-last form
  std::map<std::string, std::string> matmul_weights_;  // conv weight -> its [C, M] form
  std::set<std::string> taken_;
};

}  // namespace

Result<int> layout_nhwc_always(ir::Graph& g) { return Rewriter(g).run(); }

Result<int> layout_nhwc(ir::Graph& g, const Target& target) {
  if (!target.channels_last) return 0;  // CUDA reduced-float builds, CPU bfloat16 builds with AMX
  return layout_nhwc_always(g);
}

}  // namespace kiln::passes

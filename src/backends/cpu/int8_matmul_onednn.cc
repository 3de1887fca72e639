// INT8 linear layers on oneDNN's u8 x s8 -> s32 matmul (VNNI where the CPU has it):
//   matmul_integer_onednn_u8s8s32: ONNX MatMulInteger with a uint8 activation A (scalar zero point, a
//     constant or computed at run time) and a constant 2-D int8 B (zero point a constant scalar or
//     per column), int32 out;
//   qlinear_matmul_onednn_u8s8s32: ONNX QLinearMatMul with uint8 A (per-tensor scale and zero point),
//     constant 2-D int8 B (scale and zero point per tensor or per column), uint8 or int8 out,
//     requantized in double as the reference does;
//   dyn_q_matmul_onednn_u8s8s32: kiln.DynQMatMul (src/ops/dyn_quant_matmul.cc): X quantized at run
//     time by kiln's quantizer, the product, then the dequantizing epilogue (scales, bias, residual,
//     activation) in kiln's own code;
//   q_matmul_onednn_u8s8s32: kiln.QMatMul, the same with X's scale and zero point fixed at build time
//     (float X quantized by kiln's QuantizeLinear kernel, or uint8 X read as it is).
// B is reordered once into oneDNN's blocked layout and its column sums kept, so the zero points are
// applied afterwards as integer corrections (int8_matmul_kernels.h): oneDNN computes the plain
// product sum a*b, which VNNI's u8 x s8 instruction does without saturation, and the results equal
// the reference bit for bit (the int32 accumulators; the float output up to the activation).
#if defined(KILN_HAVE_ONEDNN)
#include <algorithm>
#include <cstring>

#include "backends/cpu/int8_matmul_kernels.h"
#include "backends/cpu/int8_matmul_tactics.h"
#include "backends/cpu/onednn_common.h"

namespace kiln::backends::cpu::onednn {
namespace {

class PreparedInt8Matmul : public PreparedLayer {
 public:
  std::string name;
  bool dynamic = false;  // kiln.DynQMatMul (float X in) vs MatMulInteger / QLinearMatMul (uint8 A in)
  bool qlinear = false;  // QLinearMatMul
  bool fixed = false;    // kiln.QMatMul (dynamic: its epilogue; X's parameters fixed)
  bool fixed_float_x = false;
  float fixed_scale = 1.f;
  uint8_t fixed_zp = 0;
  DataType out_dtype = DataType::kInt32;
  Isa isa = Isa::kScalar;
  int64_t m = 0, k = 0, n = 0;
  Dims out_shape;
  // The product runs in blocks of `mb` rows (the last one `m % mb` rows: pd_tail), each followed by
  // its epilogue, so the int32 block is still in cache when the epilogue reads it.
  int64_t mb = 0;
  dnnl::matmul::primitive_desc pd, pd_tail;
  dnnl::matmul prim, prim_tail;
  memory::desc src_md, dst_md, src_tail_md, dst_tail_md;
  memory weights;
  std::vector<int32_t> colsum, b_zp;  // [n]
  bool any_b_zp = false;
  std::vector<float> w_scale, bias;  // [n] (DynQMatMul; bias empty when absent)
  bool has_residual = false;
  Activation act;

  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  std::vector<DataType> output_dtypes() const override { return {out_dtype}; }
  size_t workspace_bytes(int) const override {
    size_t mk = static_cast<size_t>(m * k), mn = static_cast<size_t>(m * n), nn = static_cast<size_t>(n);
    (void)mn;
    return workspace_piece(scratch_bytes()) + workspace_piece(dynamic && (!fixed || fixed_float_x) ? mk : 0) +
           workspace_piece(static_cast<size_t>(mb * n) * 4) +
           workspace_piece(any_b_zp ? static_cast<size_t>(m) * 4 : 0) + workspace_piece(nn * 4) +
           workspace_piece(dynamic || qlinear ? nn * 4 : 0);
  }

  size_t scratch_bytes() const {
    size_t b = pd.scratchpad_desc().get_size();
    if (m % mb) b = std::max(b, pd_tail.scratchpad_desc().get_size());
    return b;
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    WorkspaceSlicer ws(ctx);
    void* scratch = ws.take(scratch_bytes());
    uint8_t* q = static_cast<uint8_t*>(ws.take(dynamic && (!fixed || fixed_float_x) ? static_cast<size_t>(m * k) : 0));
    int32_t* acc = static_cast<int32_t*>(ws.take(static_cast<size_t>(mb * n) * 4));
    int32_t* rowsum = static_cast<int32_t*>(ws.take(any_b_zp ? static_cast<size_t>(m) * 4 : 0));
    int32_t* comp = static_cast<int32_t*>(ws.take(static_cast<size_t>(n) * 4));
    float* scale = static_cast<float*>(ws.take(dynamic || qlinear ? static_cast<size_t>(n) * 4 : 0));
    int32_t a_zp = 0;
    float a_scale = 1.f;
    if (fixed) {
      if (fixed_float_x)
        quantize_static_u8(isa, in[0]->data<float>(), m * k, fixed_scale, fixed_zp, q);
      else
        q = const_cast<uint8_t*>(in[0]->data<uint8_t>());
      a_scale = fixed_scale, a_zp = fixed_zp;
      if (any_b_zp) row_sums_u8(q, m, k, rowsum);
    } else if (dynamic) {
      uint8_t z = 0;
      KILN_RETURN_IF_ERROR(quantize_dynamic_u8(isa, in[0]->data<float>(), m, k, q, any_b_zp ? rowsum : nullptr,
                                               &a_scale, &z, name.c_str()));
      a_zp = z;
    } else if (qlinear) {
      q = const_cast<uint8_t*>(in[0]->data<uint8_t>());
      a_scale = in[1]->data<float>()[0];
      if (in[2]) a_zp = in[2]->data<uint8_t>()[0];
    } else {
      q = const_cast<uint8_t*>(in[0]->data<uint8_t>());
      if (in.size() > 2 && in[2]) a_zp = in[2]->data<uint8_t>()[0];
    }
    float y_scale = qlinear ? in[6]->data<float>()[0] : 1.f;
    if (any_b_zp && !dynamic) row_sums_u8(q, m, k, rowsum);
    for (int64_t j = 0; j < n; ++j) {
      uint32_t c =
          static_cast<uint32_t>(a_zp) * static_cast<uint32_t>(colsum[static_cast<size_t>(j)]) -
          static_cast<uint32_t>(k) * static_cast<uint32_t>(a_zp) * static_cast<uint32_t>(b_zp[static_cast<size_t>(j)]);
      comp[j] = static_cast<int32_t>(c);
      if (dynamic) scale[j] = a_scale * w_scale[static_cast<size_t>(j)];              // Mul(s, BScale), as the graph
      if (qlinear) scale[j] = (a_scale * w_scale[static_cast<size_t>(j)]) / y_scale;  // in float, as the reference
    }
    int32_t y_zp = 0;
    if (qlinear && in[7]) y_zp = out_dtype == DataType::kInt8 ? in[7]->data<int8_t>()[0] : in[7]->data<uint8_t>()[0];
    for (int64_t r0 = 0; r0 < m; r0 += mb) {
      const int64_t rows = std::min(mb, m - r0);
      const bool tail = rows != mb;
      Status st = guarded(name, [&]() -> Status {
        auto& eng = cpu_engine();
        std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(tail ? src_tail_md : src_md, eng, q + r0 * k)},
                                             {DNNL_ARG_DST, memory(tail ? dst_tail_md : dst_md, eng, acc)},
                                             {DNNL_ARG_WEIGHTS, weights}};
        const dnnl::matmul::primitive_desc& d = tail ? pd_tail : pd;
        execute(tail ? prim_tail : prim, d.scratchpad_desc(), scratch, std::move(args));
        return Status::Ok();
      });
      KILN_RETURN_IF_ERROR(st);
      Int8Epilogue e;
      e.comp = comp;
      e.b_zp = any_b_zp ? b_zp.data() : nullptr;
      e.rowsum = any_b_zp ? rowsum + r0 : nullptr;
      if (qlinear) {
        const size_t es = out_dtype == DataType::kInt8 ? sizeof(int8_t) : sizeof(uint8_t);
        int8_epilogue_requantize(acc, rows, n, e, scale, y_zp, out_dtype == DataType::kInt8,
                                 static_cast<uint8_t*>(out[0]->raw()) + static_cast<size_t>(r0 * n) * es);
      } else if (!dynamic) {
        int8_epilogue_s32(isa, acc, rows, n, e, out[0]->data<int32_t>() + r0 * n);
      } else {
        e.scale = scale;
        e.bias = bias.empty() ? nullptr : bias.data();
        e.residual = has_residual ? in[5]->data<float>() + r0 * n : nullptr;
        e.act = act;
        int8_epilogue_f32(isa, acc, rows, n, e, out[0]->data<float>() + r0 * n);
      }
    }
    return Status::Ok();
  }
};

// A scalar or [n] constant as n int32 / float values.
template <typename T>
std::vector<T> per_column(const Tensor* t, int64_t n, T fill) {
  std::vector<T> v(static_cast<size_t>(n), fill);
  if (!t) return v;
  for (int64_t j = 0; j < n; ++j) {
    int64_t i = t->numel() == 1 ? 0 : j;
    if constexpr (std::is_same_v<T, float>)
      v[static_cast<size_t>(j)] = static_cast<float>(t->get_f64(i));
    else
      v[static_cast<size_t>(j)] = static_cast<T>(t->get_i64(i));
  }
  return v;
}

bool scalar_or_columns(const TensorSig& t, int64_t n) {
  if (!t.constant) return false;
  if (t.constant->numel() == 1) return t.constant->rank() <= 1;
  return t.constant->rank() == 1 && t.constant->numel() == n;
}

enum class Mode { kInteger, kQLinear, kDynamic, kStatic };

// An optional scalar input (absent, or one value of `dtype`), checked at run time by the reference too.
bool scalar_of(const LayerSignature& sig, size_t i, DataType dtype, bool required) {
  if (!sig.has_input(i)) return !required;
  const TensorSig& t = sig.inputs[i];
  if (t.dtype != dtype) return false;
  for (int64_t d : t.shape)
    if (d != 1) return false;
  return t.shape.size() <= 1;
}

class OnednnInt8Matmul : public Tactic {
 public:
  explicit OnednnInt8Matmul(Mode mode) : mode_(mode) {}
  std::string name() const override {
    switch (mode_) {
      case Mode::kDynamic: return "dyn_q_matmul_onednn_u8s8s32";
      case Mode::kStatic: return "q_matmul_onednn_u8s8s32";
      case Mode::kQLinear: return "qlinear_matmul_onednn_u8s8s32";
      case Mode::kInteger: break;
    }
    return "matmul_integer_onednn_u8s8s32";
  }
  TacticInfo info() const override {
    const bool dyn = mode_ == Mode::kDynamic || mode_ == Mode::kStatic;
    std::vector<DataType> out = {DataType::kInt32};
    if (dyn) out = {DataType::kFloat32};
    if (mode_ == Mode::kQLinear) out = {DataType::kUInt8, DataType::kInt8};
    std::vector<DataType> in = {dyn ? DataType::kFloat32 : DataType::kUInt8};
    if (mode_ == Mode::kStatic) in = {DataType::kFloat32, DataType::kUInt8};
    return {DeviceKind::kCPU, kIsaPortable, DataType::kInt8, in, out};
  }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    switch (mode_) {
      case Mode::kDynamic: return {{"kiln", "DynQMatMul"}};
      case Mode::kStatic: return {{"kiln", "QMatMul"}};
      case Mode::kQLinear: return {{"", "QLinearMatMul"}};
      case Mode::kInteger: break;
    }
    return {{"", "MatMulInteger"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    const bool fixed = mode_ == Mode::kStatic;
    const bool dyn = mode_ == Mode::kDynamic || fixed, ql = mode_ == Mode::kQLinear;
    const size_t bi = ql ? 3 : 1, bzp = dyn ? 2 : ql ? 5 : 3;
    if (!sig.has_input(0) || !sig.has_input(bi)) return "missing A or B";
    const TensorSig& a = sig.inputs[0];
    const TensorSig& b = sig.inputs[bi];
    if (fixed) {
      if (a.dtype != DataType::kFloat32 && a.dtype != DataType::kUInt8) return "X is not float32 or uint8";
    } else if (a.dtype != (dyn ? DataType::kFloat32 : DataType::kUInt8)) {
      return dyn ? "X is not float32" : "A is not uint8 (int8 activations are not implemented)";
    }
    if (a.shape.size() < 2) return "A has rank < 2";
    if (!b.constant || b.shape.size() != 2) return "B is not a 2-D constant (activation x activation products)";
    if (b.dtype != DataType::kInt8) return "B is not int8 (uint8 weights are not implemented)";
    if (a.shape.back() >= 0 && a.shape.back() != b.shape[0]) return "A's last dim is not B's rows";
    const int64_t n = b.shape[1];
    if (sig.has_input(bzp) && !scalar_or_columns(sig.inputs[bzp], n))
      return "B's zero point is not a constant scalar or [N]";
    if (mode_ == Mode::kInteger) {
      if (!scalar_of(sig, 2, DataType::kUInt8, false))
        return "A's zero point is not a uint8 scalar (per-row zero points are not implemented)";
      return "";
    }
    if (ql) {
      if (!scalar_of(sig, 1, DataType::kFloat32, true) || !scalar_of(sig, 2, DataType::kUInt8, false))
        return "A's scale / zero point are not float32 / uint8 scalars (per-row ones are not implemented)";
      if (!sig.has_input(4) || !scalar_or_columns(sig.inputs[4], n) || sig.inputs[4].dtype != DataType::kFloat32)
        return "B's scale is not a float32 constant scalar or [N]";
      if (!scalar_of(sig, 6, DataType::kFloat32, true)) return "y's scale is not a float32 scalar";
      if (sig.has_input(7) && !scalar_of(sig, 7, DataType::kUInt8, false) && !scalar_of(sig, 7, DataType::kInt8, false))
        return "y's zero point is not a uint8 or int8 scalar";
      if (b.shape[0] > 33000) return "K over 33000 (the int32 accumulator could overflow)";
      return "";
    }
    if (!sig.has_input(3) || !scalar_or_columns(sig.inputs[3], n) || sig.inputs[3].dtype != DataType::kFloat32)
      return "BScale is not a float32 constant scalar or [N]";
    if (fixed && b.shape[0] > 33000) return "K over 33000 (the int32 accumulator could overflow)";
    if (sig.has_input(4) &&
        (!sig.inputs[4].constant || sig.inputs[4].dtype != DataType::kFloat32 || sig.inputs[4].constant->numel() != n))
      return "Bias is not a float32 constant [N]";
    if (sig.has_input(5)) {
      const TensorSig& r = sig.inputs[5];
      Dims want = a.shape;
      want.back() = n;
      if (r.dtype != DataType::kFloat32 || r.shape != want) return "Residual is not float32 of the output's shape";
    }
    Activation act;
    if (std::string e = parse_activation(*sig.node, &act); !e.empty()) return e + " is not supported";
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    const bool fixed = mode_ == Mode::kStatic;
    const bool dyn = mode_ == Mode::kDynamic || fixed, ql = mode_ == Mode::kQLinear;
    const size_t bi = ql ? 3 : 1, bzp = dyn ? 2 : ql ? 5 : 3;
    auto p = std::make_unique<PreparedInt8Matmul>();
    p->name = name();
    p->dynamic = dyn;
    p->fixed = fixed;
    if (fixed) {
      p->fixed_float_x = sig.inputs[0].dtype == DataType::kFloat32;
      p->fixed_scale = sig.node->attr_float("x_scale", 1);
      p->fixed_zp = static_cast<uint8_t>(sig.node->attr_int("x_zero_point", 0));
    }
    p->qlinear = ql;
    p->out_dtype = dyn ? DataType::kFloat32 : DataType::kInt32;
    if (ql) p->out_dtype = sig.has_input(7) ? sig.inputs[7].dtype : DataType::kUInt8;
    p->isa = cpu_isa(sig.isa);
    const Dims& a = sig.inputs[0].shape;
    const Tensor& b = *sig.inputs[bi].constant;
    p->k = b.dim(0), p->n = b.dim(1);
    p->m = 1;
    for (size_t i = 0; i + 1 < a.size(); ++i) p->m *= a[i];
    p->out_shape = a;
    p->out_shape.back() = p->n;
    if (p->m == 0 || p->k == 0 || p->n == 0) return Unsupported(name(), ": empty operand");
    p->b_zp = per_column<int32_t>(sig.has_input(bzp) ? sig.inputs[bzp].constant : nullptr, p->n, 0);
    for (int32_t z : p->b_zp) p->any_b_zp |= z != 0;
    p->colsum.assign(static_cast<size_t>(p->n), 0);
    const int8_t* pb = b.data<int8_t>();
    for (int64_t r = 0; r < p->k; ++r)
      for (int64_t j = 0; j < p->n; ++j) p->colsum[static_cast<size_t>(j)] += pb[r * p->n + j];
    if (ql) p->w_scale = per_column<float>(sig.inputs[4].constant, p->n, 1.f);
    if (dyn) {
      p->w_scale = per_column<float>(sig.inputs[3].constant, p->n, 1.f);
      if (sig.has_input(4)) p->bias = per_column<float>(sig.inputs[4].constant, p->n, 0.f);
      p->has_residual = sig.has_input(5);
      (void)parse_activation(*sig.node, &p->act);
    }
    Status st = guarded(name(), [&]() -> Status {
      auto& eng = cpu_engine();
      const int64_t m = p->m, k = p->k, n = p->n;
      // Blocks of 128 rows (a BERT sequence): the int32 block (128 x N) stays in the caches between
      // oneDNN's product and kiln's epilogue. Fewer rows than 256: one block.
      p->mb = m < 256 ? m : 128;
      const int64_t tail_rows = m % p->mb;
      p->src_md = memory::desc({p->mb, k}, dt::u8, tag::ab);
      p->dst_md = memory::desc({p->mb, n}, dt::s32, tag::ab);
      memory::desc wei_user({k, n}, dt::s8, tag::ab), wei_any({k, n}, dt::s8, tag::any);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      p->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(p->src_md, wei_any, p->dst_md), attr, eng);
      p->prim = dnnl::matmul(p->pd);
      if (tail_rows) {  // the same packed weights (their layout fixed by the block's primitive)
        p->src_tail_md = memory::desc({tail_rows, k}, dt::u8, tag::ab);
        p->dst_tail_md = memory::desc({tail_rows, n}, dt::s32, tag::ab);
        p->pd_tail = dnnl::matmul::primitive_desc(
            dnnl::matmul::desc(p->src_tail_md, p->pd.weights_desc(), p->dst_tail_md), attr, eng);
        p->prim_tail = dnnl::matmul(p->pd_tail);
      }
      p->weights = memory(p->pd.weights_desc(), eng);
      reorder_into(wei_user, b.raw(), p->pd.weights_desc(), p->weights.get_data_handle());
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  Mode mode_;
};

}  // namespace

const Tactic* matmul_integer_onednn_u8s8s32() {
  static const OnednnInt8Matmul t(Mode::kInteger);
  return &t;
}
const Tactic* qlinear_matmul_onednn_u8s8s32() {
  static const OnednnInt8Matmul t(Mode::kQLinear);
  return &t;
}
const Tactic* dyn_q_matmul_onednn_u8s8s32() {
  static const OnednnInt8Matmul t(Mode::kDynamic);
  return &t;
}
const Tactic* q_matmul_onednn_u8s8s32() {
  static const OnednnInt8Matmul t(Mode::kStatic);
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN

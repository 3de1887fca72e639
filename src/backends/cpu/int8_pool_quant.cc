// kiln's own INT8 kernels around the quantized CNN layers: kiln.QPool on channels-last 8-bit
// values (the channels of a pixel are contiguous, so the window loop runs over whole channel runs),
// and per-tensor QuantizeLinear / DequantizeLinear where float values enter and leave the INT8
// region. Each computes with the reference kernel's formula (same operations in the same
// precision): bit-exact with it (tests/unit/backends/int8_tactic_test.cc).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backends/cpu/int8_matmul_kernels.h"
#include "backends/cpu/onednn_int8_tactics.h"
#include "core/parallel.h"
#include "ir/rewrite.h"
#include "ops/conv_util.h"
#include "ops/kiln_quantized.h"

namespace kiln::backends::cpu {

namespace {

bool is_8bit(DataType t) { return t == DataType::kInt8 || t == DataType::kUInt8; }

template <typename T>
int64_t saturate_round(double q, int64_t zp, int64_t lo, int64_t hi) {
  if (std::isnan(q)) q = 0;
  q = std::nearbyint(q) + static_cast<double>(zp);
  return static_cast<int64_t>(std::min<double>(static_cast<double>(hi), std::max<double>(static_cast<double>(lo), q)));
}

struct PoolGeometry {
  int64_t n = 0, h = 0, w = 0, c = 0, oh = 1, ow = 1, kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, ph = 0, pw = 0;
};

class PreparedQPool : public PreparedLayer {
 public:
  PoolGeometry g;
  ops::QuantizedLayerParams q;
  bool max = false, same_params = false;
  DataType x_type = DataType::kUInt8;

  std::vector<Dims> output_shapes() const override { return {{g.n, g.oh, g.ow, g.c}}; }
  std::vector<DataType> output_dtypes() const override { return {q.y_type}; }

  // The window's taps that lie inside the input, for output pixel (oy, ox): calls tap(pointer to its
  // channel run) for each and returns how many there were.
  template <typename TX, typename F>
  int64_t for_taps(const TX* x, int64_t b, int64_t oy, int64_t ox, int64_t c0, F&& tap) const {
    int64_t count = 0;
    for (int64_t a = 0; a < g.kh; ++a) {
      const int64_t yy = oy * g.sh + a * g.dh - g.ph;
      if (yy < 0 || yy >= g.h) continue;
      for (int64_t e = 0; e < g.kw; ++e) {
        const int64_t xx = ox * g.sw + e * g.dw - g.pw;
        if (xx < 0 || xx >= g.w) continue;
        tap(x + ((b * g.h + yy) * g.w + xx) * g.c + c0);
        ++count;
      }
    }
    return count;
  }

  template <typename TX, typename TY>
  void run_typed(const TX* x, TY* y) const {
    constexpr int64_t kBlock = 64;
    const int64_t cblocks = (g.c + kBlock - 1) / kBlock;
    const int64_t items = g.n * g.oh * g.ow * cblocks;
    const int64_t lo = q.y_min(), hi = q.y_max();
    parallel_for(items, 16, [&](int64_t begin, int64_t end) {
      int32_t acc[kBlock];
      TX best[kBlock];
      for (int64_t it = begin; it < end; ++it) {
        const int64_t cb = it % cblocks, pix = it / cblocks;
        const int64_t ox = pix % g.ow, oy = (pix / g.ow) % g.oh, b = pix / (g.ow * g.oh);
        const int64_t c0 = cb * kBlock, cn = std::min(kBlock, g.c - c0);
        TY* py = y + ((b * g.oh + oy) * g.ow + ox) * g.c + c0;
        if constexpr (std::is_same_v<TX, TY>) {
          if (max && same_params) {  // the max of the integers: vector max over the channel run
            for (int64_t k = 0; k < kBlock; ++k) best[k] = std::numeric_limits<TX>::min();
            for_taps(x, b, oy, ox, c0, [&](const TX* px) {
              for (int64_t k = 0; k < cn; ++k) best[k] = std::max(best[k], px[k]);
            });
            for (int64_t k = 0; k < cn; ++k) py[k] = best[k];
            continue;
          }
        }
        for (int64_t k = 0; k < kBlock; ++k) acc[k] = max ? std::numeric_limits<int32_t>::min() : 0;
        const int64_t count = for_taps(x, b, oy, ox, c0, [&](const TX* px) {
          if (max)
            for (int64_t k = 0; k < cn; ++k) acc[k] = std::max<int32_t>(acc[k], px[k]);
          else
            for (int64_t k = 0; k < cn; ++k) acc[k] += px[k];
        });
        for (int64_t k = 0; k < cn; ++k) {
          double v = 0;
          if (count) {
            const int64_t centered = max ? acc[k] - q.x_zero_point : acc[k] - count * q.x_zero_point;
            v = max ? static_cast<double>(centered) * q.x_scale
                    : static_cast<double>(centered) * q.x_scale / static_cast<double>(count);
          }
          py[k] = static_cast<TY>(saturate_round<TY>(v / static_cast<double>(q.y_scale), q.y_zero_point, lo, hi));
        }
      }
    });
  }

  Status run(const RunContext&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) const override {
    const bool xs = x_type == DataType::kInt8, ys = q.y_type == DataType::kInt8;
    if (xs && ys) run_typed(in[0]->data<int8_t>(), out[0]->data<int8_t>());
    if (xs && !ys) run_typed(in[0]->data<int8_t>(), out[0]->data<uint8_t>());
    if (!xs && ys) run_typed(in[0]->data<uint8_t>(), out[0]->data<int8_t>());
    if (!xs && !ys) run_typed(in[0]->data<uint8_t>(), out[0]->data<uint8_t>());
    return Status::Ok();
  }
};

class KilnQPool : public Tactic {
 public:
  std::string name() const override { return "pool2d_kiln_int8_nhwc"; }
  TacticInfo info() const override { return TacticInfo::cpu_int8(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "QPool"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    const auto q = ops::quantized_layer_params(*sig.node);
    if (!q.channels_last || sig.inputs[0].shape.size() != 4) return "x is not channels-last [N, H, W, C]";
    if (q.mode == "AveragePool" && sig.node->attr_int("count_include_pad", 0)) return "count_include_pad";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedQPool>();
    p->q = ops::quantized_layer_params(*sig.node);
    p->x_type = sig.inputs[0].dtype;
    p->max = p->q.mode == "MaxPool";
    p->same_params = p->q.x_scale == p->q.y_scale && p->q.x_zero_point == p->q.y_zero_point && p->x_type == p->q.y_type;
    const Dims& x = sig.inputs[0].shape;
    PoolGeometry& g = p->g;
    g.n = x[0], g.h = x[1], g.w = x[2], g.c = x[3];
    if (p->q.mode == "GlobalAveragePool") {
      g.kh = g.h, g.kw = g.w;
    } else {
      auto win = ops::resolve_window(*sig.node, ops::to_channels_first(x), nullptr, ops::window_options(p->q.mode, 19));
      if (!win.ok()) return Unsupported(name(), ": ", win.status().message());
      if (win->rank() != 2) return Unsupported(name(), ": not a 2-D pool");
      g.kh = win->kernel[0], g.kw = win->kernel[1], g.sh = win->strides[0], g.sw = win->strides[1];
      g.dh = win->dilations[0], g.dw = win->dilations[1], g.ph = win->pad_begin[0], g.pw = win->pad_begin[1];
      g.oh = win->out[0], g.ow = win->out[1];
      if (p->q.mode == "AveragePool" && (win->pad_begin[0] || win->pad_begin[1] || win->pad_end[0] || win->pad_end[1]))
        return Unsupported(name(), ": AveragePool with pads");
    }
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// Per-tensor QuantizeLinear (float32 -> 8-bit) and DequantizeLinear (8-bit -> float32) with constant
// scale and zero point.
class PreparedQuantize : public PreparedLayer {
 public:
  bool quantize = true;
  DataType q_type = DataType::kUInt8;
  float scale = 1;
  int64_t zero_point = 0;
  Dims shape;
  Isa isa = Isa::kScalar;

  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {quantize ? q_type : DataType::kFloat32}; }

  template <typename T>
  void run_typed(const Tensor& in, Tensor& out) const {
    const int64_t n = in.numel();
    const float s = scale, z = static_cast<float>(zero_point);
    const float lo = q_type == DataType::kInt8 ? -128.f : 0.f, hi = q_type == DataType::kInt8 ? 127.f : 255.f;
    if (quantize) {
      const float* x = in.data<float>();
      T* y = out.data<T>();
      parallel_for(n, 1 << 17, [x, y, s, z, lo, hi](int64_t b, int64_t e) {
#pragma omp simd
        for (int64_t i = b; i < e; ++i) y[i] = static_cast<T>(ops::quantize_value(x[i], s, z, lo, hi));
      });
    } else {
      const T* x = in.data<T>();
      float* y = out.data<float>();
      const int32_t zi = static_cast<int32_t>(zero_point);
      parallel_for(n, 1 << 17, [x, y, s, zi](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) y[i] = static_cast<float>(static_cast<int32_t>(x[i]) - zi) * s;
      });
    }
  }

  Status run(const RunContext&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) const override {
    if (quantize && q_type == DataType::kUInt8 && zero_point >= 0 && zero_point <= 255) {
      // The vector quantizer of the INT8 linear layers (the same steps: int8_matmul_kernels.h).
      quantize_static_u8(isa, in[0]->data<float>(), in[0]->numel(), scale, static_cast<uint8_t>(zero_point),
                         out[0]->data<uint8_t>());
      return Status::Ok();
    }
    if (q_type == DataType::kInt8)
      run_typed<int8_t>(*in[0], *out[0]);
    else
      run_typed<uint8_t>(*in[0], *out[0]);
    return Status::Ok();
  }
};

class KilnQuantizeLinear : public Tactic {
 public:
  std::string name() const override { return "quantize_linear_kiln"; }
  // Converts between float32 and 8 bits: the precision is the graph's (any build).
  TacticInfo info() const override { return TacticInfo::cpu_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "QuantizeLinear"}, {"", "DequantizeLinear"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    const bool quantize = sig.op() == "QuantizeLinear";
    if (!sig.has_input(1) || !sig.inputs[1].constant || sig.inputs[1].constant->numel() != 1 ||
        sig.inputs[1].dtype != DataType::kFloat32)
      return "scale is not a float32 scalar constant";
    if (sig.has_input(2) && (!sig.inputs[2].constant || sig.inputs[2].constant->numel() != 1))
      return "zero point is not a scalar constant";
    if (sig.node->attr_int("block_size", 0) != 0) return "blocked quantization";
    const DataType q =
        quantize ? (sig.outputs.empty() ? DataType::kUndefined : sig.outputs[0].dtype) : sig.inputs[0].dtype;
    if (!is_8bit(q)) return "not 8-bit";
    if ((quantize ? sig.inputs[0].dtype : (sig.outputs.empty() ? DataType::kUndefined : sig.outputs[0].dtype)) !=
        DataType::kFloat32)
      return "the float side is not float32";
    if (quantize && (sig.node->attr_int("saturate", 1) != 1 || sig.node->attr_int("precision", 0) != 0))
      return "saturate / precision attributes";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedQuantize>();
    p->quantize = sig.op() == "QuantizeLinear";
    p->q_type = p->quantize ? sig.outputs[0].dtype : sig.inputs[0].dtype;
    p->scale = static_cast<float>(sig.inputs[1].constant->get_f64(0));
    p->zero_point = sig.has_input(2) ? sig.inputs[2].constant->get_i64(0) : 0;
    p->shape = sig.inputs[0].shape;
    p->isa = cpu_isa(sig.isa);
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// kiln.QuantizeChannelsLast: float32 [N, C, H, W] -> 8-bit [N, H, W, C], one row of the output at a time.
class PreparedQuantizeChannelsLast : public PreparedLayer {
 public:
  ops::QuantizedLayerParams q;
  int64_t n = 0, c = 0, h = 0, w = 0;

  std::vector<Dims> output_shapes() const override { return {{n, h, w, c}}; }
  std::vector<DataType> output_dtypes() const override { return {q.y_type}; }
  template <typename T>
  void run_typed(const float* x, T* y) const {
    const float s = q.y_scale, z = static_cast<float>(q.y_zero_point);
    const float lo = static_cast<float>(q.y_min()), hi = static_cast<float>(q.y_max());
    const int64_t C = c, H = h, W = w;
    parallel_for(n * h, 8, [=](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / H, row = r % H;
        T* py = y + r * W * C;
        for (int64_t ch = 0; ch < C; ++ch) {
          const float* px = x + ((b * C + ch) * H + row) * W;
#pragma omp simd
          for (int64_t col = 0; col < W; ++col)
            py[col * C + ch] = static_cast<T>(ops::quantize_value(px[col], s, z, lo, hi));
        }
      }
    });
  }
  Status run(const RunContext&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) const override {
    if (q.y_type == DataType::kInt8)
      run_typed(in[0]->data<float>(), out[0]->data<int8_t>());
    else
      run_typed(in[0]->data<float>(), out[0]->data<uint8_t>());
    return Status::Ok();
  }
};

class KilnQuantizeChannelsLast : public Tactic {
 public:
  std::string name() const override { return "quantize_channels_last_kiln"; }
  TacticInfo info() const override { return TacticInfo::cpu_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "QuantizeChannelsLast"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.inputs[0].dtype != DataType::kFloat32 || sig.inputs[0].shape.size() != 4) return "x is not float32 4-D";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedQuantizeChannelsLast>();
    p->q = ops::quantized_layer_params(*sig.node);
    const Dims& x = sig.inputs[0].shape;
    p->n = x[0], p->c = x[1], p->h = x[2], p->w = x[3];
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* quantize_channels_last_kiln() {
  static const KilnQuantizeChannelsLast t;
  return &t;
}

const Tactic* pool2d_kiln_int8_nhwc() {
  static const KilnQPool t;
  return &t;
}
const Tactic* quantize_linear_kiln() {
  static const KilnQuantizeLinear t;
  return &t;
}

}  // namespace kiln::backends::cpu

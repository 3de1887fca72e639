// Activation functions: Relu, LeakyRelu, Elu, Selu, Celu, Sigmoid, HardSigmoid, HardSwish,
// Softplus, Softsign, Tanh, ThresholdedRelu, Shrink, Mish, Gelu, Swish, PRelu, Clip.
// Float kernels compute in double (float16/bfloat16 via float32) and round once.
#include <cmath>
#include <limits>

#include "ops/elementwise_util.h"
#include "ops/op_traits.h"

namespace kiln::ops {
namespace {

double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  double e = std::exp(x);
  return e / (1.0 + e);
}
// log(1 + exp(x)) without overflow for large x.
double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

Status relu_kernel(KernelContext& ctx) {
  return unary_numeric(ctx, [](auto x) {
    using T = decltype(x);
    return x < T(0) ? T(0) : x;  // NaN stays NaN
  });
}

Status leaky_relu_kernel(KernelContext& ctx) {
  double alpha = ctx.node.attr_float("alpha", 0.01f);
  return unary_float(ctx, [=](double x) { return x < 0 ? alpha * x : x; });
}

Status elu_kernel(KernelContext& ctx) {
  double alpha = ctx.node.attr_float("alpha", 1.0f);
  return unary_float(ctx, [=](double x) { return x < 0 ? alpha * (std::exp(x) - 1.0) : x; });
}

Status selu_kernel(KernelContext& ctx) {
  double alpha = ctx.node.attr_float("alpha", 1.67326319217681884765625f);
  double gamma = ctx.node.attr_float("gamma", 1.05070102214813232421875f);
  return unary_float(ctx, [=](double x) { return x > 0 ? gamma * x : gamma * (alpha * std::exp(x) - alpha); });
}

Status celu_kernel(KernelContext& ctx) {
  double alpha = ctx.node.attr_float("alpha", 1.0f);
  if (alpha == 0) return ctx.error("attribute alpha must not be 0");
  return unary_float(ctx,
                     [=](double x) { return std::max(0.0, x) + std::min(0.0, alpha * (std::exp(x / alpha) - 1)); });
}

Status sigmoid_kernel(KernelContext& ctx) { return unary_float(ctx, sigmoid); }

Status hard_sigmoid_kernel(KernelContext& ctx) {
  double alpha = ctx.node.attr_float("alpha", 0.2f);
  double beta = ctx.node.attr_float("beta", 0.5f);
  return unary_float(ctx, [=](double x) { return std::max(0.0, std::min(1.0, alpha * x + beta)); });
}

Status hard_swish_kernel(KernelContext& ctx) {
  return unary_float(ctx, [](double x) { return x * std::max(0.0, std::min(1.0, x / 6.0 + 0.5)); });
}

Status softplus_kernel(KernelContext& ctx) { return unary_float(ctx, softplus); }

Status softsign_kernel(KernelContext& ctx) {
  return unary_float(ctx, [](double x) { return x / (1.0 + std::fabs(x)); });
}

Status tanh_kernel(KernelContext& ctx) {
  return unary_float(ctx, [](double x) { return std::tanh(x); });
}

Status thresholded_relu_kernel(KernelContext& ctx) {
  double alpha = ctx.node.attr_float("alpha", 1.0f);
  return unary_float(ctx, [=](double x) { return x > alpha ? x : 0.0; });
}

Status mish_kernel(KernelContext& ctx) {
  return unary_float(ctx, [](double x) { return x * std::tanh(softplus(x)); });
}

Status gelu_kernel(KernelContext& ctx) {
  std::string approx = ctx.node.attr_string("approximate", "none");
  if (approx == "none")
    return unary_float(ctx, [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); });
  if (approx == "tanh") {
    return unary_float(ctx, [](double x) {
      const double k = std::sqrt(2.0 / M_PI);
      return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
    });
  }
  return ctx.error(str_cat("attribute approximate must be \"none\" or \"tanh\", got \"", approx, "\""));
}

Status swish_kernel(KernelContext& ctx) {
  double alpha = ctx.node.attr_float("alpha", 1.0f);
  return unary_float(ctx, [=](double x) { return x * sigmoid(alpha * x); });
}

// Shrink: x + bias below -lambd, x - bias above lambd, else 0. Integer inputs round toward zero.
Status shrink_kernel(KernelContext& ctx) {
  double lambd = ctx.node.attr_float("lambd", 0.5f);
  double bias = ctx.node.attr_float("bias", 0.0f);
  return unary_numeric(ctx, [=](auto x) {
    using T = decltype(x);
    auto v = static_cast<double>(x);
    double r = v < -lambd ? v + bias : (v > lambd ? v - bias : 0.0);
    if constexpr (std::is_floating_point_v<T>)
      return static_cast<T>(r);
    else
      return float_to_int<T>(r);
  });
}

// PRelu: slope * x where x < 0. Slope broadcasts onto X (unidirectionally). Before opset 7 the
// slope was either one value or one per channel (X's axis 1).
Result<Dims> prelu_slope_shape(int opset, const Dims& x, const Dims& slope) {
  Dims s = slope;
  if (opset < 7 && dims_numel(slope) != 1 && slope.size() == 1 && x.size() >= 2 && slope[0] == x[1]) {
    s.assign(x.size() - 1, 1);
    s[0] = slope[0];
  }
  auto out = broadcast_dims(x, s);
  if (!out.ok() || *out != x)
    return InvalidArgument("slope ", dims_str(slope), " does not broadcast onto X ", dims_str(x));
  return s;
}

// The kernel's slope check where both shapes are known: a build refuses what a run would.
Status infer_prelu(InferContext& ctx) {
  const SymShape &x = ctx.input_shape(0), &slope = ctx.input_shape(1);
  if (x.fully_known() && slope.fully_known()) {
    auto s = prelu_slope_shape(ctx.opset(), x.concrete(), slope.concrete());
    if (!s.ok()) return ctx.error(s.status().message());
  }
  return infer_same_as_input0(ctx);
}

Status prelu_kernel(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(check_same_dtype(ctx, 0, 1));
  const Tensor& x0 = ctx.input(0);
  Tensor x = upcast_float(x0), slope = upcast_float(ctx.input(1));
  if (!dtype_is_builtin(x.dtype()) || x.dtype() == DataType::kBool)
    return ctx.unsupported(str_cat("dtype ", dtype_name(x0.dtype()), " is not supported"));
  auto sshape = prelu_slope_shape(ctx.opset(), x.shape(), slope.shape());
  if (!sshape.ok()) return ctx.error(sshape.status().message());
  BroadcastIndex is(*sshape, x.shape());
  Tensor out(x.dtype(), x.shape());
  dispatch_builtin(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      const T* px = x.data<T>();
      const T* ps = slope.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < x.numel(); ++i)
        po[i] = px[i] < T(0) ? wrap_op(ps[is(i)], px[i], [](auto a, auto b) { return a * b; }) : px[i];
    }
  });
  ctx.set_output(0, downcast_float(out, x0.dtype()));
  return Status::Ok();
}

// Clip: min/max are attributes before opset 11, optional scalar inputs after. When min > max
// every value becomes max (min is applied first).
Status clip_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  // float16/bfloat16 compute in float32 and round once; other types are read in place and the output
  // renewed over the node's last one, so that a steady-state run allocates nothing (tests/noalloc).
  const bool low = is_low_precision_float(x0.dtype());
  Tensor x_up = low ? upcast_float(x0) : Tensor();
  const Tensor& x = low ? x_up : x0;
  if (!dtype_is_builtin(x.dtype()) || x.dtype() == DataType::kBool)
    return ctx.unsupported(str_cat("dtype ", dtype_name(x0.dtype()), " is not supported"));
  Tensor lo, hi;                // held when converted (opset < 11 or a low-precision bound)
  const Tensor* plo = nullptr;  // nullptr: no bound
  const Tensor* phi = nullptr;
  if (ctx.opset() < 11) {
    if (!dtype_is_float(x0.dtype()))
      return ctx.unsupported(str_cat("dtype ", dtype_name(x0.dtype()), " needs opset 12 or later"));
    // The defaults are float32's finite limits (so Inf is clipped to them too, as specified).
    float fmax = std::numeric_limits<float>::max();
    lo = Tensor::scalar<double>(DataType::kFloat64, ctx.node.attr_float("min", -fmax)).cast(x.dtype()).value();
    hi = Tensor::scalar<double>(DataType::kFloat64, ctx.node.attr_float("max", fmax)).cast(x.dtype()).value();
    plo = &lo;
    phi = &hi;
  } else {
    for (size_t i = 1; i <= 2; ++i) {
      if (!ctx.has_input(i)) continue;
      const Tensor& b = ctx.input(i);
      if (b.dtype() != x0.dtype())
        return ctx.error(
            str_cat(i == 1 ? "min " : "max ", b.describe(), " must have the input's dtype ", dtype_name(x0.dtype())));
      if (b.numel() != 1)
        return ctx.error(str_cat(i == 1 ? "min " : "max ", b.describe(), " must be a scalar (one element)"));
      Tensor& held = i == 1 ? lo : hi;
      if (low) held = upcast_float(b);
      (i == 1 ? plo : phi) = low ? &held : &b;
    }
  }
  Tensor fresh;
  Tensor& out = !low && !ctx.outputs.empty() ? ctx.outputs[0].tensor : fresh;
  out.renew(x.dtype(), x.shape());
  dispatch_builtin(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      T vlo = plo ? plo->data<T>()[0] : T(0);
      T vhi = phi ? phi->data<T>()[0] : T(0);
      const T* px = x.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < x.numel(); ++i) {
        T v = px[i];
        if (plo && v < vlo) v = vlo;
        if (phi && v > vhi) v = vhi;
        po[i] = v;
      }
    }
  });
  if (&out == &fresh)
    ctx.set_output(0, downcast_float(out, x0.dtype()));
  else
    ctx.outputs[0].kind = Value::Kind::kTensor;
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Relu, 1, infer_same_as_input0, relu_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", LeakyRelu, 1, infer_same_as_input0, leaky_relu_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Elu, 1, infer_same_as_input0, elu_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Selu, 1, infer_same_as_input0, selu_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Celu, 12, infer_same_as_input0, celu_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Sigmoid, 1, infer_same_as_input0, sigmoid_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", HardSigmoid, 1, infer_same_as_input0, hard_sigmoid_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", HardSwish, 14, infer_same_as_input0, hard_swish_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Softplus, 1, infer_same_as_input0, softplus_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Softsign, 1, infer_same_as_input0, softsign_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Tanh, 1, infer_same_as_input0, tanh_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", ThresholdedRelu, 1, infer_same_as_input0, thresholded_relu_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Shrink, 9, infer_same_as_input0, shrink_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Mish, 18, infer_same_as_input0, mish_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Gelu, 20, infer_same_as_input0, gelu_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Swish, 24, infer_same_as_input0, swish_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", PRelu, 1, infer_prelu, prelu_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Clip, 1, infer_same_as_input0, clip_kernel, 1, 3);

// Traits (registry.h). Celu and Mish are elementwise too but declare only kInPlace / kKeepsZero:
// fuse_elementwise and layout_blocked have never taken them (declaring it changes what fuses);
// ThresholdedRelu, Shrink and Swish declare none yet. Epilogues are the activations kiln.Fused*
// runs (kiln_fused.cc), with the oneDNN eltwise post-op onednn_common.cc maps them to.
constexpr uint32_t kUnaryInPlace = trait::kElementwiseUnary | trait::kInPlace;
KILN_OP_TRAITS_ONEDNN("", Relu, kUnaryInPlace | trait::kKeepsZero | trait::kEpilogue, "eltwise_relu");
KILN_OP_TRAITS_ONEDNN("", LeakyRelu, kUnaryInPlace | trait::kKeepsZero | trait::kEpilogue, "eltwise_relu");
KILN_OP_TRAITS("", Elu, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS("", Selu, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS("", Celu, trait::kInPlace | trait::kKeepsZero);
KILN_OP_TRAITS_ONEDNN("", Sigmoid, kUnaryInPlace | trait::kEpilogue, "eltwise_logistic");
// oneDNN 2.6 has no hardsigmoid: two post-ops, clip(alpha x + beta, 0, 1) (onednn_common.cc).
KILN_OP_TRAITS_ONEDNN("", HardSigmoid, kUnaryInPlace | trait::kEpilogue, "eltwise_linear+eltwise_clip");
KILN_OP_TRAITS_ONEDNN("", HardSwish, kUnaryInPlace | trait::kKeepsZero | trait::kEpilogue, "eltwise_hardswish");
KILN_OP_TRAITS("", Softplus, kUnaryInPlace);
KILN_OP_TRAITS("", Softsign, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS_ONEDNN("", Tanh, kUnaryInPlace | trait::kKeepsZero | trait::kEpilogue, "eltwise_tanh");
KILN_OP_TRAITS("", Mish, trait::kInPlace | trait::kKeepsZero);
// approximate "none" (erf); "tanh" maps to eltwise_gelu_tanh.
KILN_OP_TRAITS_ONEDNN("", Gelu, kUnaryInPlace | trait::kKeepsZero | trait::kEpilogue, "eltwise_gelu_erf");
KILN_OP_TRAITS("", PRelu, trait::kElementwiseBroadcast | trait::kInPlace);
// Not kKeepsZero: the bounds may exclude 0.
KILN_OP_TRAITS_ONEDNN("", Clip, kUnaryInPlace | trait::kEpilogue, "eltwise_clip_v2");

}  // namespace kiln::ops

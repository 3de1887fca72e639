// Cast / CastLike between the common numeric dtypes, Where, the comparisons (Equal, Less, Greater,
// LessOrEqual, GreaterOrEqual), the logical ops (And, Or, Xor, Not), IsNaN / IsInf and integer arithmetic (Add, Sub,
// Mul, Div, Max, Min over int64 / int32: the shape arithmetic of control-flow bodies): broadcasting elementwise ops
// whose inputs or outputs are not float32 (bool outputs, int64 / int32 / bool inputs, Where over any 1/2/4/8-byte
// dtype). The broadcast is planned as for the float programs (xf_plan_rows: rows of `inner` contiguous elements, each
// input contiguous along the row or one value per row); each row is one tight typed loop, the chunks of rows split over
// threads.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backends/cpu/xformer_tactics.h"
#include "core/parallel.h"

namespace kiln::backends::cpu {
namespace {

constexpr int64_t kChunk = 4096;  // elements of a row per work item
// Elements a thread gets at least: a parallel region costs about 0.1 ms (see elementwise_tactic.cc).
constexpr int64_t kGrainElements = int64_t{1} << 19;

enum class Kind {
  kWhere,
  kEqual,
  kLess,
  kGreater,
  kLessEq,
  kGreaterEq,
  kAnd,
  kOr,
  kXor,
  kNot,
  kIsNaN,
  kIsInf,
  kAdd,  // the integer arithmetic from here on
  kSub,
  kMul,
  kDiv,
  kMax,
  kMin
};
bool is_arith(Kind k) { return k >= Kind::kAdd; }

bool kind_of(const std::string& op, Kind* k) {
  static const std::pair<const char*, Kind> kOps[] = {{"Where", Kind::kWhere},
                                                      {"Equal", Kind::kEqual},
                                                      {"Less", Kind::kLess},
                                                      {"Greater", Kind::kGreater},
                                                      {"LessOrEqual", Kind::kLessEq},
                                                      {"GreaterOrEqual", Kind::kGreaterEq},
                                                      {"And", Kind::kAnd},
                                                      {"Or", Kind::kOr},
                                                      {"Xor", Kind::kXor},
                                                      {"Not", Kind::kNot},
                                                      {"IsNaN", Kind::kIsNaN},
                                                      {"IsInf", Kind::kIsInf},
                                                      {"Add", Kind::kAdd},
                                                      {"Sub", Kind::kSub},
                                                      {"Mul", Kind::kMul},
                                                      {"Div", Kind::kDiv},
                                                      {"Max", Kind::kMax},
                                                      {"Min", Kind::kMin}};
  for (const auto& [name, kind] : kOps)
    if (op == name) return *k = kind, true;
  return false;
}

// out[i] = f(a[i * sa], b[i * sb], c[i * sc]) over one piece of a row (s*: 1 along the row, 0
// broadcast); the all-contiguous case separate so that it vectorizes.
template <class TO, class TA, class TB, class TC, class F>
inline void row_loop(TO* out, const TA* a, int64_t sa, const TB* b, int64_t sb, const TC* c, int64_t sc, int64_t n,
                     F f) {
  if (sa && sb && sc) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i], c[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i * sa], b[i * sb], c[i * sc]);
  }
}

class PreparedLogic : public PreparedLayer {
 public:
  Kind kind = Kind::kEqual;
  DataType in_dtype = DataType::kFloat32;  // the compared / selected dtype
  DataType out_dtype = DataType::kBool;
  bool detect_neg = true, detect_pos = true;  // IsInf
  xf::EltProgram rows;
  Dims out;

  std::vector<Dims> output_shapes() const override { return {out}; }
  std::vector<DataType> output_dtypes() const override { return {out_dtype}; }

  // Calls piece(row offsets of each input, output offset, n) for the row pieces of units [u0, u1).
  template <class F>
  void for_pieces(int64_t u0, int64_t u1, F piece) const {
    const int64_t chunks = (rows.inner + kChunk - 1) / kChunk;
    const size_t nin = static_cast<size_t>(rows.n_inputs);
    int64_t off[3] = {0, 0, 0};
    int64_t last_row = -1;
    for (int64_t u = u0; u < u1; ++u) {
      int64_t row = u / chunks, c0 = (u % chunks) * kChunk, n = std::min(kChunk, rows.inner - c0);
      if (row != last_row) {
        for (size_t i = 0; i < nin; ++i) {
          int64_t o = 0, rest = row;
          for (size_t d = rows.outer_dims.size(); d-- > 0;) {
            o += (rest % rows.outer_dims[d]) * rows.in_strides[i][d];
            rest /= rows.outer_dims[d];
          }
          off[i] = o;
        }
        last_row = row;
      }
      int64_t at[3];
      for (size_t i = 0; i < nin; ++i) at[i] = off[i] + (rows.in_varies[i] ? c0 : 0);
      piece(at, row * rows.inner + c0, n);
    }
  }

  int64_t stride(int i) const { return rows.in_varies[static_cast<size_t>(i)] ? 1 : 0; }

  template <class T>
  void where(const uint8_t* c, const void* x, const void* y, void* o, int64_t u0, int64_t u1) const {
    for_pieces(u0, u1, [&](const int64_t* at, int64_t oo, int64_t n) {
      row_loop(static_cast<T*>(o) + oo, c + at[0], stride(0), static_cast<const T*>(x) + at[1], stride(1),
               static_cast<const T*>(y) + at[2], stride(2), n, [](uint8_t cv, T xv, T yv) { return cv ? xv : yv; });
    });
  }

  template <class T>
  void compare(const void* a, const void* b, uint8_t* o, int64_t u0, int64_t u1) const {
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    auto go = [&](auto f) {
      for_pieces(u0, u1, [&](const int64_t* at, int64_t oo, int64_t n) {
        row_loop(o + oo, pa + at[0], stride(0), pb + at[1], stride(1), pa, 0, n,
                 [&](T x, T y, T) { return static_cast<uint8_t>(f(x, y)); });
      });
    };
    switch (kind) {
      case Kind::kEqual: return go([](T x, T y) { return x == y; });
      case Kind::kLess: return go([](T x, T y) { return x < y; });
      case Kind::kGreater: return go([](T x, T y) { return x > y; });
      case Kind::kLessEq: return go([](T x, T y) { return x <= y; });
      case Kind::kGreaterEq: return go([](T x, T y) { return x >= y; });
      default: return;
    }
  }

  // Integer arithmetic as the reference kernel does it: Add / Sub / Mul wrap (computed unsigned), Div
  // truncates toward zero (INT_MIN / -1 wraps to INT_MIN). Returns false on a division by zero.
  template <class T>
  bool arith(const void* a, const void* b, void* o, int64_t u0, int64_t u1) const {
    using U = std::make_unsigned_t<T>;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(o);
    bool ok = true;
    auto go = [&](auto f) {
      for_pieces(u0, u1, [&](const int64_t* at, int64_t oo, int64_t n) {
        row_loop(po + oo, pa + at[0], stride(0), pb + at[1], stride(1), pa, 0, n, [&](T x, T y, T) { return f(x, y); });
      });
    };
    switch (kind) {
      case Kind::kAdd: go([](T x, T y) { return static_cast<T>(static_cast<U>(x) + static_cast<U>(y)); }); break;
      case Kind::kSub: go([](T x, T y) { return static_cast<T>(static_cast<U>(x) - static_cast<U>(y)); }); break;
      case Kind::kMul: go([](T x, T y) { return static_cast<T>(static_cast<U>(x) * static_cast<U>(y)); }); break;
      case Kind::kMax: go([](T x, T y) { return x < y ? y : x; }); break;
      case Kind::kMin: go([](T x, T y) { return y < x ? y : x; }); break;
      case Kind::kDiv:
        go([&](T x, T y) -> T {
          if (y == 0) return ok = false, T(0);
          if (y == T(-1)) return static_cast<T>(U(0) - static_cast<U>(x));
          return static_cast<T>(x / y);
        });
        break;
      default: break;
    }
    return ok;
  }

  // bool inputs: bytes read as 0 / non-zero, as the reference does.
  void logical(const uint8_t* a, const uint8_t* b, uint8_t* o, int64_t u0, int64_t u1) const {
    auto go = [&](auto f) {
      for_pieces(u0, u1, [&](const int64_t* at, int64_t oo, int64_t n) {
        row_loop(o + oo, a + at[0], stride(0), (b ? b : a) + at[b ? 1 : 0], b ? stride(1) : stride(0), a, 0, n,
                 [&](uint8_t x, uint8_t y, uint8_t) { return static_cast<uint8_t>(f(x != 0, y != 0)); });
      });
    };
    switch (kind) {
      case Kind::kAnd: return go([](bool x, bool y) { return x && y; });
      case Kind::kOr: return go([](bool x, bool y) { return x || y; });
      case Kind::kXor: return go([](bool x, bool y) { return x != y; });
      case Kind::kNot: return go([](bool x, bool) { return !x; });
      case Kind::kEqual: return go([](bool x, bool y) { return x == y; });
      case Kind::kLess: return go([](bool x, bool y) { return x < y; });
      case Kind::kGreater: return go([](bool x, bool y) { return x > y; });
      case Kind::kLessEq: return go([](bool x, bool y) { return x <= y; });
      case Kind::kGreaterEq: return go([](bool x, bool y) { return x >= y; });
      default: return;
    }
  }

  void classify(const float* a, uint8_t* o, int64_t u0, int64_t u1) const {
    const float inf = INFINITY;
    const bool neg = detect_neg, pos = detect_pos;
    for_pieces(u0, u1, [&](const int64_t* at, int64_t oo, int64_t n) {
      if (kind == Kind::kIsNaN)
        row_loop(o + oo, a + at[0], stride(0), a, 0, a, 0, n,
                 [](float x, float, float) { return static_cast<uint8_t>(x != x); });
      else
        row_loop(o + oo, a + at[0], stride(0), a, 0, a, 0, n,
                 [&](float x, float, float) { return static_cast<uint8_t>((pos && x == inf) || (neg && x == -inf)); });
    });
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& outs) const override {
    if (rows.inner == 0) return Status::Ok();
    const int64_t units = rows.outer() * ((rows.inner + kChunk - 1) / kChunk);
    const int64_t grain = std::max<int64_t>(1, kGrainElements / std::min(kChunk, rows.inner));
    void* o = outs[0]->raw();
    auto* ob = static_cast<uint8_t*>(o);
    const size_t es = dtype_size(in_dtype);
    if (is_arith(kind)) {
      std::atomic<bool> by_zero{false};
      parallel_for(units, grain, [&](int64_t u0, int64_t u1) {
        bool ok = in_dtype == DataType::kInt64 ? arith<int64_t>(in[0]->raw(), in[1]->raw(), o, u0, u1)
                                               : arith<int32_t>(in[0]->raw(), in[1]->raw(), o, u0, u1);
        if (!ok) by_zero = true;
      });
      if (by_zero) return InvalidArgument("integer division by zero");
      return Status::Ok();
    }
    parallel_for(units, grain, [&](int64_t u0, int64_t u1) {
      switch (kind) {
        case Kind::kWhere: {
          const auto* c = static_cast<const uint8_t*>(in[0]->raw());
          const void *x = in[1]->raw(), *y = in[2]->raw();
          if (es == 1) where<uint8_t>(c, x, y, o, u0, u1);
          if (es == 2) where<uint16_t>(c, x, y, o, u0, u1);
          if (es == 4) where<uint32_t>(c, x, y, o, u0, u1);
          if (es == 8) where<uint64_t>(c, x, y, o, u0, u1);
          return;
        }
        case Kind::kIsNaN:
        case Kind::kIsInf: return classify(in[0]->data<float>(), ob, u0, u1);
        case Kind::kAnd:
        case Kind::kOr:
        case Kind::kXor:
        case Kind::kNot:
          return logical(static_cast<const uint8_t*>(in[0]->raw()),
                         kind == Kind::kNot ? nullptr : static_cast<const uint8_t*>(in[1]->raw()), ob, u0, u1);
        default: break;
      }
      const void *a = in[0]->raw(), *b = in[1]->raw();
      switch (in_dtype) {
        case DataType::kFloat32: return compare<float>(a, b, ob, u0, u1);
        case DataType::kFloat64: return compare<double>(a, b, ob, u0, u1);
        case DataType::kInt64: return compare<int64_t>(a, b, ob, u0, u1);
        case DataType::kInt32: return compare<int32_t>(a, b, ob, u0, u1);
        case DataType::kBool:
          return logical(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), ob, u0, u1);
        default: return;
      }
    });
    return Status::Ok();
  }
};

class LogicKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_any_dtype(); }
  std::string name() const override { return "logic_kiln"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    std::vector<std::pair<std::string, std::string>> v;
    for (const char* op : {"Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor",
                           "Not", "IsNaN", "IsInf", "Add", "Sub", "Mul", "Div", "Max", "Min"})
      v.emplace_back("", op);
    return v;
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
    Kind k;
    if (!kind_of(sig.op(), &k)) return "op " + sig.op();
    if (sig.node->opset < 7) return "opset " + std::to_string(sig.node->opset) + " (legacy broadcast attributes)";
    size_t nin = k == Kind::kWhere ? 3 : (k == Kind::kNot || k == Kind::kIsNaN || k == Kind::kIsInf) ? 1 : 2;
    if (sig.inputs.size() != nin) return "expects " + std::to_string(nin) + " inputs";
    for (size_t i = 0; i < nin; ++i)
      if (!sig.has_input(i)) return "input " + std::to_string(i) + " is missing";
    DataType a = sig.inputs[0].dtype, b = nin > 1 ? sig.inputs[1].dtype : a;
    switch (k) {
      case Kind::kWhere: {
        DataType x = sig.inputs[1].dtype;
        if (a != DataType::kBool) return "condition is not bool";
        if (x != sig.inputs[2].dtype) return "X and Y differ in dtype";
        size_t es = x == DataType::kString ? 0 : dtype_size(x);
        if ((es != 1 && es != 2 && es != 4 && es != 8) || x == DataType::kString)
          return std::string("X is ") + dtype_name(x) + " (1, 2, 4 or 8-byte dtypes)";
        break;
      }
      case Kind::kIsNaN:
      case Kind::kIsInf:
        if (a != DataType::kFloat32) return std::string("input is ") + dtype_name(a) + ", not float32";
        break;
      case Kind::kAnd:
      case Kind::kOr:
      case Kind::kXor:
      case Kind::kNot:
        if (a != DataType::kBool || b != DataType::kBool) return "inputs are not bool";
        break;
      case Kind::kAdd:
      case Kind::kSub:
      case Kind::kMul:
      case Kind::kDiv:
      case Kind::kMax:
      case Kind::kMin:
        if (a != b) return "inputs differ in dtype";
        if (a != DataType::kInt64 && a != DataType::kInt32)
          return std::string("arithmetic on ") + dtype_name(a) + " (int64, int32; float32 is fused_elementwise_kiln's)";
        if ((k == Kind::kMax || k == Kind::kMin) && sig.node->opset < 12) return "integer Max / Min before opset 12";
        break;
      default:
        if (a != b) return "inputs differ in dtype";
        if (a != DataType::kFloat32 && a != DataType::kFloat64 && a != DataType::kInt64 && a != DataType::kInt32 &&
            a != DataType::kBool)
          return std::string("compares ") + dtype_name(a) + " (float32, float64, int64, int32, bool)";
    }
    if (!sig.fully_known()) return "";
    std::vector<Dims> shapes;
    for (size_t i = 0; i < nin; ++i) shapes.push_back(sig.inputs[i].shape);
    xf::EltProgram p;
    Dims out;
    return xf_plan_rows(shapes, &p, &out);
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedLogic>();
    kind_of(sig.op(), &p->kind);
    std::vector<Dims> shapes;
    for (const TensorSig& t : sig.inputs) shapes.push_back(t.shape);
    p->rows.n_inputs = static_cast<int>(shapes.size());
    if (auto e = xf_plan_rows(shapes, &p->rows, &p->out); !e.empty()) return Unsupported(name(), ": ", e);
    p->in_dtype = p->kind == Kind::kWhere ? sig.inputs[1].dtype : sig.inputs[0].dtype;
    p->out_dtype = p->kind == Kind::kWhere || is_arith(p->kind) ? p->in_dtype : DataType::kBool;
    p->detect_neg = sig.node->attr_int("detect_negative", 1) != 0;
    p->detect_pos = sig.node->attr_int("detect_positive", 1) != 0;
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// ---- Cast ----

// The conversion Tensor::cast does (core/tensor.cc), element by element: integers to floats
// through double, floats to integers truncated and clamped (NaN: 0), anything to bool as != 0,
// integers to integers wrapping.
template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(static_cast<double>(v));
  } else if constexpr (std::is_floating_point_v<From>) {
    double d = static_cast<double>(v);
    if (std::isnan(d)) return To(0);
    double t = std::trunc(d);
    if (t <= static_cast<double>(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    if (t >= static_cast<double>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(t);
  } else {
    return static_cast<To>(static_cast<int64_t>(v));
  }
}

// Calls f(T{}) for the dtypes the cast takes; false for the others.
template <class F>
bool with_cast_type(DataType dt, F f) {
  switch (dt) {
    case DataType::kFloat32: return f(float{}), true;
    case DataType::kFloat64: return f(double{}), true;
    case DataType::kInt64: return f(int64_t{}), true;
    case DataType::kInt32: return f(int32_t{}), true;
    case DataType::kInt16: return f(int16_t{}), true;
    case DataType::kInt8: return f(int8_t{}), true;
    case DataType::kUInt8: return f(uint8_t{}), true;
    case DataType::kBool: return f(bool{}), true;
    default: return false;
  }
}

bool is_bf16_pair(DataType from, DataType to) {
  return (from == DataType::kFloat32 && to == DataType::kBFloat16) ||
         (from == DataType::kBFloat16 && to == DataType::kFloat32);
}
void floats_to_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bfloat16(x[i]);
}
void bf16_to_floats(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(x[i]) << 16;
    if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;  // a NaN comes out quiet, as the reference's
    std::memcpy(&y[i], &u, 4);
  }
}

class PreparedCast : public PreparedLayer {
 public:
  DataType from = DataType::kFloat32, to = DataType::kFloat32;
  Dims shape;

  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {to}; }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& outs) const override {
    const int64_t n = in[0]->numel();
    const void* x = in[0]->raw();
    void* y = outs[0]->raw();
    if (from == to) {
      std::memcpy(y, x, static_cast<size_t>(n) * dtype_size(to));
      return Status::Ok();
    }
    if (is_bf16_pair(from, to)) {  // where bfloat16 storage meets float32 (engine/storage_dtypes.cc)
      parallel_for(n, kGrainElements, [&](int64_t b, int64_t e) {
        if (from == DataType::kFloat32)
          floats_to_bf16(static_cast<const float*>(x) + b, static_cast<uint16_t*>(y) + b, e - b);
        else
          bf16_to_floats(static_cast<const uint16_t*>(x) + b, static_cast<float*>(y) + b, e - b);
      });
      return Status::Ok();
    }
    with_cast_type(from, [&](auto f) {
      using F = decltype(f);
      with_cast_type(to, [&](auto t) {
        using T = decltype(t);
        const F* px = static_cast<const F*>(x);
        T* py = static_cast<T*>(y);
        parallel_for(n, kGrainElements, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) py[i] = convert<T>(px[i]);
        });
      });
    });
    return Status::Ok();
  }
};

class CastKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_any_dtype(); }
  std::string name() const override { return "cast_kiln"; }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Cast"}, {"", "CastLike"}}; }

  static bool target(const LayerSignature& sig, DataType* to) {
    if (sig.op() == "CastLike") {
      if (!sig.has_input(1)) return false;
      *to = sig.inputs[1].dtype;
      return true;
    }
    const ir::Attribute* a = sig.node->attr("to");
    if (!a || a->type != ir::Attribute::Type::kInt || !dtype_is_known(static_cast<int32_t>(a->i))) return false;
    *to = static_cast<DataType>(a->i);
    return true;
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
    if (!sig.has_input(0)) return "no input";
    DataType to;
    if (!target(sig, &to)) return "the target dtype is not an integer attribute 'to'";
    auto any = [](auto) {};
    if (is_bf16_pair(sig.inputs[0].dtype, to)) return "";
    if (!with_cast_type(sig.inputs[0].dtype, any)) return std::string("casts from ") + dtype_name(sig.inputs[0].dtype);
    if (!with_cast_type(to, any)) return std::string("casts to ") + dtype_name(to);
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedCast>();
    p->from = sig.inputs[0].dtype;
    target(sig, &p->to);
    p->shape = sig.inputs[0].shape;
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* cast_kiln() {
  static const CastKiln t;
  return &t;
}

const Tactic* logic_kiln() {
  static const LogicKiln t;
  return &t;
}

}  // namespace kiln::backends::cpu

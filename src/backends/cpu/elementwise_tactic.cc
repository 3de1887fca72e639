// kiln.FusedElementwise, single ONNX elementwise ops and Gelu as vectorized programs. At prepare time the body's nodes
// become a straight-line list of vector instructions (xf::EltInstr) over the node's inputs and per-thread temporaries;
// the kernel runs the whole list on a chunk of 512 elements at a time, so each intermediate lives in L1 and the output
// is written once. Broadcasting: the output's dims are merged where every input agrees (all of them full or broadcast),
// the last merged dim is the contiguous row, and each input is either contiguous along the row or one value per row,
// with any broadcast among the outer dims (strides of 0), or repeating a short period along the row (a per-channel
// constant against the channel-blocked layout: one vector of B channels, repeated H * W times per block).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <map>

#include "backends/cpu/xformer_kernels.h"
#include "backends/cpu/xformer_tactics.h"
#include "core/parallel.h"

namespace kiln::backends::cpu {
namespace {

using xf::EltInstr;
using xf::EltOp;

constexpr int kMaxInputs = 16;
// Elements a thread gets at least (about 0.2 ms of work). These kernels stream memory at a few
// GB/s per core, and measured on BERT (2 threads) a region for one [128, 768] LayerNormalization cost
// 0.1 ms instead of the 0.03 ms of running it on one thread; on a busy machine a region can also wait
// milliseconds for a descheduled worker.
constexpr int64_t kGrainElements = int64_t{1} << 20;
// kiln.BlockedConcatElementwise's threaded variant splits from 32K elements a thread (128 KB in,
// 128 KB out): DenseNet's at batch 1 (25K-800K elements) never reached kGrainElements and ran on one
// thread. Whether the split pays for the region it costs depends on the layer and the machine, so
// the tuner times it against the single-thread variant.
constexpr int64_t kConcatGrainElements = int64_t{1} << 15;

const ir::Graph* body_of(const ir::Node& n) {
  const ir::Attribute* a = n.attr("body");
  return a && a->g ? a->g.get() : nullptr;
}

// The instruction of a unary body node; "" or why not.
std::string unary_instr(const ir::Node& n, EltInstr* in) {
  static const std::map<std::string, EltOp> kPlain = {
      {"Abs", EltOp::kAbs},         {"Neg", EltOp::kNeg},           {"Exp", EltOp::kExp},
      {"Sqrt", EltOp::kSqrt},       {"Reciprocal", EltOp::kRecip},  {"Relu", EltOp::kRelu},
      {"Sigmoid", EltOp::kSigmoid}, {"Tanh", EltOp::kTanh},         {"Erf", EltOp::kErf},
      {"Floor", EltOp::kFloor},     {"Ceil", EltOp::kCeil},         {"Round", EltOp::kRound},
      {"Sign", EltOp::kSign},       {"Softsign", EltOp::kSoftsign}, {"Mish", EltOp::kMish}};
  const std::string& op = n.op_type;
  if (auto it = kPlain.find(op); it != kPlain.end()) {
    in->op = it->second;
  } else if (op == "LeakyRelu") {
    in->op = EltOp::kLeakyRelu, in->p0 = n.attr_float("alpha", 0.01f);
  } else if (op == "Elu") {
    in->op = EltOp::kElu, in->p0 = n.attr_float("alpha", 1.0f);
  } else if (op == "Selu") {
    in->op = EltOp::kSelu, in->p0 = n.attr_float("alpha", 1.67326319217681884765625f);
    in->p1 = n.attr_float("gamma", 1.05070102214813232421875f);
  } else if (op == "HardSigmoid") {
    in->op = EltOp::kHardSigmoid, in->p0 = n.attr_float("alpha", 0.2f), in->p1 = n.attr_float("beta", 0.5f);
  } else if (op == "HardSwish") {
    in->op = EltOp::kHardSwish, in->p0 = 1.f / 6.f, in->p1 = 0.5f;
  } else if (op == "Celu") {
    float alpha = n.attr_float("alpha", 1.0f);
    if (alpha == 0) return "Celu alpha 0";
    in->op = EltOp::kCelu, in->p0 = alpha, in->p1 = 1.f / alpha;
  } else if (op == "ThresholdedRelu") {
    in->op = EltOp::kThresholdedRelu, in->p0 = n.attr_float("alpha", 1.0f);
  } else if (op == "Swish") {
    in->op = EltOp::kSwish, in->p0 = n.attr_float("alpha", 1.0f);
  } else if (op == "Gelu") {
    std::string a = n.attr_string("approximate", "none");
    if (a != "none" && a != "tanh") return "Gelu approximate '" + a + "'";
    in->op = a == "none" ? EltOp::kGeluErf : EltOp::kGeluTanh;
  } else {
    return "op " + op + " has no vector form";
  }
  return "";
}

struct Compiled {
  xf::EltProgram prog;
  std::vector<bool> float_input;  // inputs read as float32 (not only as Pow exponents)
  Dims out;
  std::string error;
};

// Compiles the body. With `sig` shapes unknown only the ops are checked.
// A single ONNX elementwise node as a one-node body: inputs "x0".., output "y" (a missing
// optional input stays missing).
std::shared_ptr<ir::Graph> single_node_body(const ir::Node& n) {
  auto body = std::make_shared<ir::Graph>();
  ir::Node copy = n;
  copy.attrs.erase("kiln.sources");
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    body->inputs.push_back({"x" + std::to_string(i), ir::TypeInfo()});
    if (!copy.inputs[i].empty()) copy.inputs[i] = body->inputs.back().name;
  }
  copy.outputs = {"y"};
  body->nodes.push_back(std::move(copy));
  body->outputs.push_back({"y", ir::TypeInfo()});
  return body;
}

// Mul into a temporary that only the next instruction, an Add, reads: one kMulAdd (a b + c), one pass
// over the chunk instead of two (BatchNormalization lowered to Mul and Add).
void fuse_mul_add(std::vector<EltInstr>* code) {
  std::vector<EltInstr>& v = *code;
  for (size_t i = 0; i + 1 < v.size(); ++i) {
    const EltInstr& m = v[i];
    EltInstr& add = v[i + 1];
    if (m.op != EltOp::kMul || add.op != EltOp::kAdd || m.dst == xf::kEltOut) continue;
    if ((add.a == m.dst) == (add.b == m.dst)) continue;  // reads it once
    bool read_later = false;
    for (size_t j = i + 2; j < v.size(); ++j)
      read_later |= v[j].a == m.dst || (elt_is_binary(v[j].op) && v[j].b == m.dst) ||
                    (v[j].op == EltOp::kMulAdd && (v[j].b == m.dst || v[j].c == m.dst));
    if (read_later) continue;
    EltInstr f = add;
    f.op = EltOp::kMulAdd;
    f.c = add.a == m.dst ? add.b : add.a;
    f.a = m.a, f.b = m.b;
    add = f;
    v.erase(v.begin() + static_cast<int64_t>(i));
  }
}

Compiled compile(const LayerSignature& sig) {
  Compiled c;
  const ir::Node& node = *sig.node;
  bool fused = node.domain == "kiln" && node.op_type == "FusedElementwise";
  std::shared_ptr<ir::Graph> single;
  const ir::Graph* body = fused ? body_of(node) : (single = single_node_body(node)).get();
  if (!body) return c.error = "no body", c;
  if (node.outputs.size() != 1) return c.error = "more than one output", c;
  size_t nin = node.inputs.size();
  if (body->inputs.size() != nin || body->outputs.size() != 1) return c.error = "body inputs/outputs", c;
  if (nin > kMaxInputs) return c.error = "more than 16 inputs", c;
  for (size_t i = 0; i < nin; ++i)
    if (!sig.has_input(i) && (fused || !node.inputs[i].empty())) return c.error = "a missing input", c;
  std::map<std::string, int> id;
  for (size_t i = 0; i < nin; ++i) id[body->inputs[i].name] = static_cast<int>(i);
  c.float_input.assign(nin, false);
  xf::EltProgram& p = c.prog;
  p.n_inputs = static_cast<int>(nin);
  int next = p.n_inputs;
  auto operand = [&](const std::string& v, int* out) {
    auto it = id.find(v);
    if (it == id.end()) return false;
    *out = it->second;
    if (*out < p.n_inputs) c.float_input[static_cast<size_t>(*out)] = true;
    return true;
  };
  // A body input that is a constant scalar of the outer graph.
  auto constant_scalar = [&](const std::string& v, double* value) {
    auto it = id.find(v);
    if (it == id.end() || it->second >= p.n_inputs) return false;
    const TensorSig& t = sig.inputs[static_cast<size_t>(it->second)];
    if (!t.constant || t.constant->numel() != 1) return false;
    *value = t.constant->get_f64(0);
    return true;
  };
  for (const ir::Node& n : body->nodes) {
    bool kiln_gelu = n.domain == "kiln" && n.op_type == "Gelu";
    if ((!n.domain.empty() && !kiln_gelu) || n.outputs.size() != 1) return c.error = "node " + n.op_type, c;
    if (!kiln_gelu && n.opset < 7) return c.error = n.op_type + " below opset 7", c;
    const std::string& op = n.op_type;
    EltInstr in;
    in.dst = next;
    static const std::map<std::string, EltOp> kBinary = {
        {"Add", EltOp::kAdd}, {"Sum", EltOp::kAdd}, {"Sub", EltOp::kSub}, {"Mul", EltOp::kMul},
        {"Div", EltOp::kDiv}, {"Max", EltOp::kMax}, {"Min", EltOp::kMin}, {"PRelu", EltOp::kPRelu}};
    if (auto it = kBinary.find(op); it != kBinary.end()) {
      if (n.inputs.size() != 2 || !operand(n.inputs[0], &in.a) || !operand(n.inputs[1], &in.b))
        return c.error = op + " operands", c;
      in.op = it->second;
      p.code.push_back(in);
    } else if (op == "Pow") {
      double e;
      if (n.inputs.size() != 2 || !operand(n.inputs[0], &in.a) || !constant_scalar(n.inputs[1], &e))
        return c.error = "Pow without a constant scalar exponent", c;
      if (e == 0)
        in.op = EltOp::kFill, in.p0 = 1.f;
      else if (e == 0.5)
        in.op = EltOp::kSqrt;
      else if (e == 1)
        in.op = EltOp::kCopy;
      else if (e == 2)
        in.op = EltOp::kSquare;
      else if (e == 3)
        in.op = EltOp::kCube;
      else if (e == -1)
        in.op = EltOp::kRecip;
      else
        return c.error = "Pow exponent " + std::to_string(e), c;
      p.code.push_back(in);
    } else if (op == "Clip") {
      if (n.inputs.empty() || !operand(n.inputs[0], &in.a)) return c.error = "Clip operands", c;
      in.op = EltOp::kClip;
      in.p0 = -FLT_MAX, in.p1 = FLT_MAX;
      if (n.opset < 11) {
        in.p0 = n.attr_float("min", -FLT_MAX), in.p1 = n.attr_float("max", FLT_MAX);
        p.code.push_back(in);
      } else {
        // Constant bounds become immediates; others a Max / Min with the bound's operand.
        int cur = in.a;
        for (size_t k = 1; k <= 2; ++k) {
          if (!n.has_input(k)) continue;
          double v;
          if (constant_scalar(n.inputs[k], &v)) {
            (k == 1 ? in.p0 : in.p1) = static_cast<float>(v);
            continue;
          }
          EltInstr mm;
          mm.op = k == 1 ? EltOp::kMax : EltOp::kMin;
          mm.a = cur;
          if (!operand(n.inputs[k], &mm.b)) return c.error = "Clip operands", c;
          mm.dst = next++;
          p.code.push_back(mm);
          cur = mm.dst;
        }
        in.a = cur;
        in.dst = next;
        p.code.push_back(in);
      }
    } else {
      if (n.inputs.size() != 1 || !operand(n.inputs[0], &in.a)) return c.error = op + " operands", c;
      if (auto e = unary_instr(n, &in); !e.empty()) return c.error = e, c;
      p.code.push_back(in);
    }
    id[n.outputs[0]] = next++;
  }
  int result;
  if (!operand(body->outputs[0].name, &result)) return c.error = "body output is not computed", c;
  if (!p.code.empty() && p.code.back().dst == result) {
    p.code.back().dst = xf::kEltOut;
  } else {
    EltInstr cp;
    cp.op = EltOp::kCopy, cp.a = result, cp.dst = xf::kEltOut;
    p.code.push_back(cp);
  }
  p.n_temps = next - p.n_inputs;
  if (p.n_temps > 64) return c.error = "body over 64 nodes", c;
  fuse_mul_add(&p.code);
  return c;
}

class PreparedProgram : public PreparedLayer {
 public:
  const xf::Kernels* k = nullptr;
  xf::EltProgram prog;
  Dims out;

  std::vector<Dims> output_shapes() const override { return {out}; }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& outs) const override {
    const float* ptrs[kMaxInputs];
    for (int i = 0; i < prog.n_inputs; ++i) {  // a missing optional input is never read
      const Tensor* t = static_cast<size_t>(i) < in.size() ? in[static_cast<size_t>(i)] : nullptr;
      ptrs[i] = t ? t->data<float>() : nullptr;
    }
    float* y = outs[0]->data<float>();
    int64_t chunk = std::min(prog.inner, xf::kEltChunk);
    if (chunk == 0) return Status::Ok();
    int64_t units = prog.outer() * ((prog.inner + xf::kEltChunk - 1) / xf::kEltChunk);
    parallel_for(units, std::max<int64_t>(1, kGrainElements / chunk),
                 [&](int64_t b, int64_t e) { k->eltwise(prog, ptrs, y, b, e); });
    return Status::Ok();
  }
};

class FusedElementwiseKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "fused_elementwise_kiln"; }
  int revision() const override { return 2; }  // 2: periodic operands (per-channel constants, blocked), a b + c
  std::vector<std::pair<std::string, std::string>> ops() const override {
    std::vector<std::pair<std::string, std::string>> v = {{"kiln", "FusedElementwise"}};
    for (const char* op :
         {"Add",       "Sub",  "Mul",  "Div",         "Max",       "Min",   "Sum",        "PRelu",
          "Pow",       "Clip", "Abs",  "Neg",         "Exp",       "Sqrt",  "Reciprocal", "Relu",
          "Sigmoid",   "Tanh", "Erf",  "Floor",       "Ceil",      "Round", "Sign",       "Softsign",
          "LeakyRelu", "Elu",  "Selu", "HardSigmoid", "HardSwish", "Mish",  "Celu",       "ThresholdedRelu",
          "Swish"})
      v.emplace_back("", op);
    return v;
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU || sig.compute != DataType::kFloat32) return "not a float32 CPU layer";
    Compiled c = compile(sig);
    if (!c.error.empty()) return c.error;
    for (size_t i = 0; i < sig.inputs.size(); ++i)
      if (c.float_input[i] && sig.inputs[i].dtype != DataType::kFloat32) return "an input is not float32";
    if (sig.has_input(0) && sig.inputs[0].dtype != DataType::kFloat32) return "not float32";
    if (!sig.fully_known()) return "";
    std::vector<Dims> shapes;
    for (const auto& t : sig.inputs) shapes.push_back(t.present ? t.shape : Dims{});
    xf::EltProgram p;
    Dims out;
    return xf_plan_rows(shapes, &p, &out, true);
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto prep = std::make_unique<PreparedProgram>();
    prep->k = &xf::kernels(cpu_isa(sig.isa));
    prep->prog = compile(sig).prog;
    std::vector<Dims> shapes;
    for (const auto& t : sig.inputs) shapes.push_back(t.present ? t.shape : Dims{});
    if (auto e = xf_plan_rows(shapes, &prep->prog, &prep->out, true); !e.empty()) return Unsupported(name(), ": ", e);
    return std::unique_ptr<PreparedLayer>(std::move(prep));
  }
};

class GeluKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "gelu_kiln"; }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Gelu"}, {"kiln", "Gelu"}}; }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = xf_float32_layer(sig); !e.empty()) return e;
    if (!sig.has_input(0)) return "no input";
    EltInstr in;
    return unary_instr(*sig.node, &in);
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto prep = std::make_unique<PreparedProgram>();
    prep->k = &xf::kernels(cpu_isa(sig.isa));
    EltInstr in;
    unary_instr(*sig.node, &in);
    in.a = 0, in.dst = xf::kEltOut;
    prep->prog.code = {in};
    prep->prog.n_inputs = 1;
    prep->out = sig.inputs[0].shape;
    xf_plan_rows({prep->out}, &prep->prog, &prep->out);
    return std::unique_ptr<PreparedLayer>(std::move(prep));
  }
};

// kiln.BlockedConcatElementwise: the fused program run on each concatenated input in place. Every input
// is whole channel blocks of the output ([N, Cbp, H, W, B] of [N, Cb, H, W, B]), so each one's rows are
// a program of their own (its share of the per-channel operands, [1, Cbp, 1, 1, B]) writing a range of
// the output's channel blocks: the concatenation is never written out.
class PreparedConcatProgram : public PreparedLayer {
 public:
  struct Piece {
    xf::EltProgram prog;
    int64_t block_begin = 0, units = 0;  // its first channel block in the output; work units per image
  };
  const xf::Kernels* k = nullptr;
  std::vector<Piece> pieces;
  std::vector<bool> per_channel;         // per operand after the pieces: [.., Cb, 1, 1, B] (else one value)
  int64_t n = 0, blocks = 0, plane = 0;  // images, output channel blocks, H * W * B
  bool single_thread = false;            // all on the calling thread (else from kConcatGrainElements a thread)
  Dims out;

  std::vector<Dims> output_shapes() const override { return {out}; }

  Status run(const RunContext& /*ctx*/, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& outs) const override {
    float* y = outs[0]->data<float>();
    const size_t np = pieces.size();
    int64_t total = 0;
    for (const Piece& p : pieces) total += n * p.units;
    const int64_t grain =
        single_thread ? total : std::max<int64_t>(1, kConcatGrainElements / std::min(plane, xf::kEltChunk));
    parallel_for(total, grain, [&](int64_t b, int64_t e) {
      const float* ptrs[kMaxInputs];
      int64_t at = 0;  // first unit of (image i, piece p)
      for (int64_t i = 0; i < n; ++i)
        for (size_t p = 0; p < np; ++p) {
          const Piece& pc = pieces[p];
          const int64_t lo = std::max(b, at), hi = std::min(e, at + pc.units);
          if (lo < hi) {
            const int64_t piece_blocks = in[p]->dim(1);
            ptrs[0] = in[p]->data<float>() + i * piece_blocks * plane;
            for (size_t j = 0; j < per_channel.size(); ++j) {
              const Tensor* t = in[np + j];
              ptrs[j + 1] = t->data<float>() + (per_channel[j] ? pc.block_begin * out[4] : 0);
            }
            k->eltwise(pc.prog, ptrs, y + (i * blocks + pc.block_begin) * plane, lo - at, hi - at);
          }
          at += pc.units;
        }
    });
    return Status::Ok();
  }
};

class BlockedConcatElementwiseKiln : public Tactic {
 public:
  explicit BlockedConcatElementwiseKiln(bool single_thread) : single_thread_(single_thread) {}
  std::string name() const override {
    return single_thread_ ? "concat_elementwise_blocked_kiln_single_thread" : "concat_elementwise_blocked_kiln";
  }
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"kiln", "BlockedConcatElementwise"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU || sig.compute != DataType::kFloat32) return "not a float32 CPU layer";
    const int64_t k = sig.node->attr_int("pieces", 0);
    if (k < 1 || static_cast<size_t>(k) > sig.inputs.size()) return "attribute 'pieces' out of range";
    if (sig.inputs.size() - static_cast<size_t>(k) + 1 > kMaxInputs) return "more than 16 operands";
    for (const auto& t : sig.inputs)
      if (!t.present || t.dtype != DataType::kFloat32) return "an input is missing or not float32";
    for (int64_t i = 0; i < k; ++i)
      if (sig.inputs[static_cast<size_t>(i)].shape.size() != 5) return "a concatenated input is not 5-D blocked";
    ir::Node fe;
    LayerSignature fsig = element_signature(sig, &fe, {});
    Compiled c = compile(fsig);
    if (!c.error.empty()) return c.error;
    if (!sig.fully_known()) return "";
    const Dims& a = sig.inputs[0].shape;
    int64_t blocks = 0;
    for (int64_t i = 0; i < k; ++i) {
      const Dims& d = sig.inputs[static_cast<size_t>(i)].shape;
      if (d[0] != a[0] || d[2] != a[2] || d[3] != a[3] || d[4] != a[4])
        return "concatenated inputs differ outside axis 1";
      blocks += d[1];
    }
    for (size_t j = static_cast<size_t>(k); j < sig.inputs.size(); ++j) {
      const TensorSig& t = sig.inputs[j];
      if (shape_numel(t.shape) != 1 && !is_per_block(t.shape, blocks, a[4]))
        return "an operand is neither one value nor per channel ([1, Cb, 1, 1, B])";
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto prep = std::make_unique<PreparedConcatProgram>();
    prep->k = &xf::kernels(cpu_isa(sig.isa));
    const size_t k = static_cast<size_t>(sig.node->attr_int("pieces", 0));
    const Dims& a = sig.inputs[0].shape;
    for (size_t i = 0; i < k; ++i) prep->blocks += sig.inputs[i].shape[1];
    prep->n = a[0];
    prep->plane = a[2] * a[3] * a[4];
    prep->single_thread = single_thread_;
    prep->out = {a[0], prep->blocks, a[2], a[3], a[4]};
    for (size_t j = k; j < sig.inputs.size(); ++j) prep->per_channel.push_back(shape_numel(sig.inputs[j].shape) != 1);
    int64_t at = 0;
    for (size_t i = 0; i < k; ++i) {
      const int64_t pb = sig.inputs[i].shape[1];
      // The program of one image of this piece: operands cut to its channel blocks.
      std::vector<Dims> shapes = {{1, pb, a[2], a[3], a[4]}};
      for (size_t j = k; j < sig.inputs.size(); ++j)
        shapes.push_back(prep->per_channel[j - k] ? Dims{1, pb, 1, 1, a[4]} : Dims{});
      ir::Node fe;
      Compiled c = compile(element_signature(sig, &fe, shapes));
      PreparedConcatProgram::Piece piece;
      piece.prog = c.prog;
      Dims out;
      if (auto e = xf_plan_rows(shapes, &piece.prog, &out, true); !e.empty()) return Unsupported(name(), ": ", e);
      piece.block_begin = at;
      piece.units = piece.prog.outer() * ((piece.prog.inner + xf::kEltChunk - 1) / xf::kEltChunk);
      prep->pieces.push_back(std::move(piece));
      at += pb;
    }
    return std::unique_ptr<PreparedLayer>(std::move(prep));
  }

 private:
  bool single_thread_;
  static int64_t shape_numel(const Dims& d) {
    int64_t n = 1;
    for (int64_t x : d) n *= x;
    return n;
  }
  static bool is_per_block(const Dims& d, int64_t blocks, int64_t block) {
    if (d.size() == 5) return d[0] == 1 && d[1] == blocks && d[2] == 1 && d[3] == 1 && d[4] == block;
    return d.size() == 4 && d[0] == blocks && d[1] == 1 && d[2] == 1 && d[3] == block;
  }
  // The signature of the FusedElementwise the node runs per piece: input 0 the piece (shape
  // shapes[0]), then the operands (shapes[1..], or theirs when `shapes` is empty); `fe` holds the node.
  static LayerSignature element_signature(const LayerSignature& sig, ir::Node* fe, const std::vector<Dims>& shapes) {
    const size_t k = static_cast<size_t>(sig.node->attr_int("pieces", 0));
    fe->name = sig.node->name;
    fe->domain = "kiln";
    fe->op_type = "FusedElementwise";
    fe->opset = 1;
    fe->attrs = sig.node->attrs;
    fe->outputs = sig.node->outputs;
    fe->inputs = {sig.node->inputs[0]};
    LayerSignature f = sig;
    f.node = fe;
    f.inputs = {sig.inputs[0]};
    for (size_t j = k; j < sig.inputs.size(); ++j) {
      fe->inputs.push_back(sig.node->inputs[j]);
      f.inputs.push_back(sig.inputs[j]);
    }
    for (size_t j = 0; j < shapes.size() && j < f.inputs.size(); ++j) f.inputs[j].shape = shapes[j];
    return f;
  }
};

}  // namespace

std::string xf_plan_rows(const std::vector<Dims>& in, xf::EltProgram* p, Dims* out, bool periodic) {
  Dims o;
  for (const Dims& d : in)
    if (!xf_broadcast(o, d, &o)) return "inputs do not broadcast";
  *out = o;
  size_t n = in.size(), r = o.size();
  // Per output dim (size > 1), which inputs are full along it.
  std::vector<int64_t> sizes;
  std::vector<std::vector<bool>> full;
  for (size_t d = 0; d < r; ++d) {
    if (o[d] == 1) continue;
    std::vector<bool> f(n);
    for (size_t i = 0; i < n; ++i) {
      size_t rank = in[i].size();
      f[i] = d + rank >= r && in[i][d + rank - r] != 1;
    }
    if (!sizes.empty() && full.back() == f) {
      sizes.back() *= o[d];
    } else {
      sizes.push_back(o[d]);
      full.push_back(f);
    }
  }
  if (sizes.empty()) sizes.push_back(1), full.push_back(std::vector<bool>(n, true));
  // A last group that every input takes whole, after one that some inputs broadcast along (the
  // blocked [N, C/B, H, W, B] against a [1, C/B, 1, 1, B] constant): the two merge into one row in
  // which those inputs repeat the last group's values, when that period divides the chunk.
  std::vector<int64_t> period(n, 0);
  if (size_t m = sizes.size(); periodic && m >= 2 && sizes[m - 1] > 0 && xf::kEltChunk % sizes[m - 1] == 0) {
    bool merge = true;
    for (size_t i = 0; i < n; ++i) merge = merge && full[m - 1][i];
    if (merge) {
      for (size_t i = 0; i < n; ++i)
        if (!full[m - 2][i]) period[i] = sizes[m - 1];
      sizes[m - 2] *= sizes[m - 1];
      full[m - 2] = full[m - 1];  // every input is now full along the row (the strides below)
      sizes.pop_back(), full.pop_back();
    }
  }
  size_t m = sizes.size();
  p->inner = sizes.back();
  p->outer_dims.assign(sizes.begin(), sizes.end() - 1);
  p->in_varies.assign(n, 0);
  p->in_strides.assign(n, std::vector<int64_t>(m - 1, 0));
  p->in_period = period;
  for (size_t i = 0; i < n; ++i) {
    p->in_varies[i] = period[i] ? 2 : full[m - 1][i] ? 1 : 0;
    int64_t s = period[i] ? period[i] : full[m - 1][i] ? sizes[m - 1] : 1;
    for (size_t d = m - 1; d-- > 0;) {
      if (!full[d][i]) continue;
      p->in_strides[i][d] = s;
      s *= sizes[d];
    }
  }
  return "";
}

const Tactic* fused_elementwise_kiln() {
  static const FusedElementwiseKiln t;
  return &t;
}
const Tactic* concat_elementwise_blocked_kiln() {
  static const BlockedConcatElementwiseKiln t(false);
  return &t;
}
const Tactic* concat_elementwise_blocked_kiln_single_thread() {
  static const BlockedConcatElementwiseKiln t(true);
  return &t;
}
const Tactic* gelu_kiln() {
  static const GeluKiln t;
  return &t;
}

}  // namespace kiln::backends::cpu

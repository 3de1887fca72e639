// Control flow: If, Loop, Scan (opset 8 with batch axis and sequence_lens; opset 9+ with scan
// axes and directions). Bodies run through the interpreter's SubgraphRunner, which makes values
// of enclosing graphs visible inside them.
#include <memory>

#include "ops/common.h"
#include "ops/control_flow_util.h"
#include "ops/deadline.h"
#include "ops/interpreter.h"

namespace kiln::ops {
namespace {

// ---------------------------------------------------------------------------------------------
// Tensor helpers: taking one index along an axis, and stacking along a new axis.

// t with axis `axis` removed, at position `idx` along it.
Tensor take_along(const Tensor& t, int64_t axis, int64_t idx) {
  Dims shape = t.shape();
  int64_t outer = 1, inner = 1, dim = shape[static_cast<size_t>(axis)];
  for (int64_t i = 0; i < axis; ++i) outer *= shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(axis) + 1; i < shape.size(); ++i) inner *= shape[i];
  shape.erase(shape.begin() + axis);
  Tensor out(t.dtype(), shape);
  for (int64_t o = 0; o < outer; ++o) copy_elements(t, (o * dim + idx) * inner, out, o * inner, inner);
  return out;
}

// Stacks `n` equally shaped tensors along a new axis `axis` of `out` (0 <= axis <= rank), renewed in
// place: its shape vector and the shape scratch keep their capacity from run to run.
void stack_into(const Tensor* items, size_t count, int64_t axis, Tensor& out) {
  thread_local Dims shape;
  const Tensor& first = items[0];
  shape = first.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(axis); i < shape.size(); ++i) inner *= shape[i];
  int64_t n = static_cast<int64_t>(count);
  shape.insert(shape.begin() + axis, n);
  out.renew(first.dtype(), shape);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t o = 0; o < outer; ++o)
      copy_elements(items[static_cast<size_t>(k)], o * inner, out, (o * n + k) * inner, inner);
}
Tensor stack_along(const std::vector<Tensor>& items, int64_t axis) {
  Tensor out;
  stack_into(items.data(), items.size(), axis, out);
  return out;
}

// An empty scan output when the body never ran: [0] inserted at `axis` into the body output's
// static shape (unknown dims as 0, since the tensor holds no element anyway).
Result<Tensor> empty_scan_output(const ir::Node& node, const ir::ValueInfo& body_out, int64_t axis, Dims prefix = {}) {
  const ir::TypeInfo& t = body_out.type;
  if (!t.is_tensor() || t.elem == DataType::kUndefined || !t.shape.rank_known)
    return Unsupported(node.where(), "the body never ran and the type of scan output '", body_out.name,
                       "' is not known statically, so its empty value cannot be built");
  Dims d;
  for (const Dim& x : t.shape.dims) d.push_back(x.known() ? x.value : 0);
  int64_t r = static_cast<int64_t>(d.size()) + 1;
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r)
    return InvalidModel(node.where(), "scan output axis ", axis, " is out of range for rank ", r);
  d.insert(d.begin() + axis, 0);
  d.insert(d.begin(), prefix.begin(), prefix.end());
  return Tensor(t.elem, d);
}

Status check_same_shape(const KernelContext& ctx, const Tensor& first, const Tensor& t, const std::string& what) {
  if (t.dtype() != first.dtype() || t.shape() != first.shape())
    return ctx.error(str_cat(what, " changed from ", first.describe(), " to ", t.describe(), " between iterations"));
  return Status::Ok();
}

// Shape with a dim inserted at `axis` (rank-relative, negative counts from the back of the result).
SymShape insert_dim(const SymShape& s, int64_t axis, Dim d) {
  if (!s.rank_known) return SymShape();
  int64_t r = static_cast<int64_t>(s.rank()) + 1;
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) return SymShape();
  std::vector<Dim> dims = s.dims;
  dims.insert(dims.begin() + axis, d);
  return SymShape(dims);
}

SymShape remove_dim(const SymShape& s, int64_t axis) {
  if (!s.rank_known || axis < 0 || axis >= static_cast<int64_t>(s.rank())) return SymShape();
  std::vector<Dim> dims = s.dims;
  dims.erase(dims.begin() + axis);
  return SymShape(dims);
}

// ---------------------------------------------------------------------------------------------
// If

Status infer_if(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::Graph* then_g, cf::graph_attr(ctx.node, "then_branch"));
  KILN_ASSIGN_OR_RETURN(const ir::Graph* else_g, cf::graph_attr(ctx.node, "else_branch"));
  if (!ctx.infer_subgraph) return Status::Ok();
  const Tensor* c = ctx.constant(0);
  int known = c && c->numel() == 1 ? (c->get_f64(0) != 0 ? 1 : 0) : -1;  // -1: decided at run time
  // A branch that cannot run (its inference fails) only fails the run if it is taken, so the
  // outputs then have the other branch's types; a branch that is never taken is not inferred.
  auto then_t = known == 0 ? Result<std::vector<ir::TypeInfo>>(Status()) : ctx.infer_subgraph(*then_g, {});
  auto else_t = known == 1 ? Result<std::vector<ir::TypeInfo>>(Status()) : ctx.infer_subgraph(*else_g, {});
  if (!then_t.ok() && !else_t.ok()) return known == 0 ? else_t.status() : then_t.status();
  size_t n = ctx.outputs.size();
  // ONNX: each branch yields exactly the node's outputs (extra ones would be silently dropped).
  for (const auto* r : {&then_t, &else_t})
    if (r->ok() && r->value().size() != n)
      return ctx.error(
          str_cat(r == &then_t ? "then_branch" : "else_branch", " has ", r->value().size(), " outputs, the node ", n));
  if (!then_t.ok() || !else_t.ok()) {
    const std::vector<ir::TypeInfo>& only = then_t.ok() ? then_t.value() : else_t.value();
    for (size_t i = 0; i < n; ++i) ctx.set_output(i, only[i]);
    return Status::Ok();
  }
  for (size_t i = 0; i < n; ++i) {
    const ir::TypeInfo& a = then_t.value()[i];
    const ir::TypeInfo& b = else_t.value()[i];
    if (a.is_tensor() && b.is_tensor() && a.elem != DataType::kUndefined && b.elem != DataType::kUndefined &&
        a.elem != b.elem)
      return ctx.error(str_cat("output ", i, " is ", a.str(), " in then_branch but ", b.str(), " in else_branch"));
    ctx.set_output(i, cf::widen(a, b, [&] { return ctx.new_symbol(); }));
  }
  return Status::Ok();
}

// Per-run vectors of the If and Loop kernels (a body's results; the Loop's feed and scan items), kept
// on the running thread from run to run, one set per kernel and nesting depth (an If or Loop inside a
// body takes the next): a steady-state run reuses their capacity and their tensors' shape vectors
// instead of allocating them again (values are assigned over them, never moved out). Emptied when
// the kernel returns (the tensors they held released, their shape vectors kept).
struct BodyScratch {
  std::vector<Value> results, feed;
  std::vector<std::vector<Tensor>> scans;  // scans[j][0, scan_counts[j]) hold scan output j's items
  std::vector<size_t> scan_counts;
};
template <typename Kernel>
class BodyScratchScope {
 public:
  BodyScratchScope(size_t n_feed, size_t n_scans) {
    if (t_pool.size() <= t_depth) t_pool.push_back(std::make_unique<BodyScratch>());
    s_ = t_pool[t_depth++].get();
    s_->feed.resize(n_feed);
    if (s_->scans.size() < n_scans) s_->scans.resize(n_scans), s_->scan_counts.resize(n_scans);
  }
  ~BodyScratchScope() {
    static const Tensor kEmpty;
    for (Value& v : s_->results) clear_value(v);
    for (Value& v : s_->feed) clear_value(v);
    for (size_t j = 0; j < s_->scans.size(); ++j) {
      for (size_t k = 0; k < s_->scan_counts[j]; ++k) s_->scans[j][k] = kEmpty;
      s_->scan_counts[j] = 0;
    }
    --t_depth;
  }
  BodyScratchScope(const BodyScratchScope&) = delete;
  BodyScratchScope& operator=(const BodyScratchScope&) = delete;
  std::vector<Value>& results() { return s_->results; }
  std::vector<Value>& feed() { return s_->feed; }
  size_t scan_count(size_t j) const { return s_->scan_counts[j]; }
  const Tensor* scan_items(size_t j) const { return s_->scans[j].data(); }
  void add_scan_item(size_t j, const Tensor& t) {
    std::vector<Tensor>& items = s_->scans[j];
    size_t& n = s_->scan_counts[j];
    if (n < items.size())
      items[n] = t;
    else
      items.push_back(t);
    ++n;
  }

 private:
  static thread_local std::vector<std::unique_ptr<BodyScratch>> t_pool;
  static thread_local size_t t_depth;
  BodyScratch* s_;
};
template <typename Kernel>
thread_local std::vector<std::unique_ptr<BodyScratch>> BodyScratchScope<Kernel>::t_pool;
template <typename Kernel>
thread_local size_t BodyScratchScope<Kernel>::t_depth = 0;
struct IfTag {};
struct LoopTag {};

Status if_kernel(KernelContext& ctx) {
  const Tensor& cond = ctx.input(0);
  if (cond.numel() != 1) return ctx.error(str_cat("cond must hold one element, got ", cond.describe()));
  if (!ctx.subgraphs) return ctx.unsupported("If needs a subgraph runner");
  bool c = cond.dtype() == DataType::kBool ? cond.data<bool>()[0] : cond.get_f64(0) != 0.0;
  KILN_ASSIGN_OR_RETURN(const ir::Graph* g, cf::graph_attr(ctx.node, c ? "then_branch" : "else_branch"));
  BodyScratchScope<IfTag> scratch(0, 0);
  std::vector<Value>& outs = scratch.results();
  static const std::vector<Value> kNoInputs;
  KILN_RETURN_IF_ERROR(ctx.subgraphs->run_subgraph_into(*g, kNoInputs, outs));
  if (outs.size() != ctx.num_outputs())
    return ctx.error(str_cat(c ? "then_branch" : "else_branch", " produced ", outs.size(), " outputs, the node has ",
                             ctx.num_outputs()));
  for (size_t i = 0; i < ctx.num_outputs(); ++i) ctx.outputs[i] = outs[i];  // assigned: shape vectors reused
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Loop: inputs (M, cond, v_initial...), body (iter, cond, v...) -> (cond, v..., scan...).
// As in ONNX's reference and onnxruntime, the body's condition output always decides whether the
// next iteration runs; an absent cond input starts as true.

Status infer_loop(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::Graph* body, cf::graph_attr(ctx.node, "body"));
  size_t n = ctx.num_inputs() >= 2 ? ctx.num_inputs() - 2 : 0;
  if (body->inputs.size() != 2 + n)
    return ctx.error(
        str_cat("body takes ", body->inputs.size(), " inputs; with ", n, " loop-carried values it must take ", 2 + n));
  if (body->outputs.size() < 1 + n)
    return ctx.error(str_cat("body has ", body->outputs.size(), " outputs; it must have at least ", 1 + n));
  size_t k = body->outputs.size() - 1 - n;
  if (ctx.outputs.size() > n + k)
    return ctx.error(str_cat("the node has ", ctx.outputs.size(), " outputs but the body yields ", n + k));
  std::vector<ir::TypeInfo> in;
  in.push_back(ir::TypeInfo::tensor(DataType::kInt64, SymShape(std::vector<Dim>{})));
  in.push_back(ir::TypeInfo::tensor(DataType::kBool, SymShape(std::vector<Dim>{})));
  for (size_t i = 0; i < n; ++i) in.push_back(ctx.has_input(2 + i) ? ctx.input(2 + i) : ir::TypeInfo());
  KILN_ASSIGN_OR_RETURN(std::vector<ir::TypeInfo> outs, cf::infer_loop_body(ctx, *body, in, 2, 1, n));
  if (outs.size() != 1 + n + k) return ctx.error("body inference returned the wrong number of outputs");
  for (size_t i = 0; i < n && i < ctx.outputs.size(); ++i) {
    // After zero iterations the initial value comes out: cover it too.
    ir::TypeInfo t = cf::widen(in[2 + i], outs[1 + i], [&] { return ctx.new_symbol(); });
    if (ctx.has_input(2 + i)) t = cf::widen(t, ctx.input(2 + i), [&] { return ctx.new_symbol(); });
    // An optional initial value that the body replaces by a plain one: the output has the body's
    // kind, as in ONNX (only a zero-trip loop could return the optional itself).
    if (t.kind == ir::TypeInfo::Kind::kOptional && t.inner && outs[1 + i].kind != ir::TypeInfo::Kind::kOptional &&
        outs[1 + i].kind != ir::TypeInfo::Kind::kUnknown)
      t = ir::TypeInfo(*t.inner);
    ctx.set_output(i, t);
  }
  Dim trips = ctx.new_symbol();
  for (size_t j = 0; j < k && n + j < ctx.outputs.size(); ++j) {
    const ir::TypeInfo& t = outs[1 + n + j];
    if (t.kind != ir::TypeInfo::Kind::kTensor && t.kind != ir::TypeInfo::Kind::kUnknown)
      return ctx.error(str_cat("scan output ", j, " of the body must be a tensor, got ", t.str()));
    ctx.set_output(n + j, t.elem, insert_dim(t.shape, 0, trips));
  }
  return Status::Ok();
}

Status loop_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::Graph* body, cf::graph_attr(ctx.node, "body"));
  if (!ctx.subgraphs) return ctx.unsupported("Loop needs a subgraph runner");
  size_t n = ctx.num_inputs() >= 2 ? ctx.num_inputs() - 2 : 0;
  if (body->inputs.size() != 2 + n || body->outputs.size() < 1 + n)
    return ctx.error(str_cat("body takes ", body->inputs.size(), " inputs and has ", body->outputs.size(),
                             " outputs; with ", n, " loop-carried values it needs ", 2 + n, " and at least ", 1 + n));
  size_t k = body->outputs.size() - 1 - n;
  if (ctx.num_outputs() > n + k)
    return ctx.error(str_cat("the node has ", ctx.num_outputs(), " outputs but the body yields ", n + k));
  bool has_m = ctx.has_input(0);
  int64_t max_trips = 0;
  if (has_m) {
    const Tensor& m = ctx.input(0);
    if (m.numel() != 1 || !dtype_is_integer(m.dtype()))
      return ctx.error(str_cat("M must be an integer scalar, got ", m.describe()));
    max_trips = m.get_i64(0);
  }
  bool cond = true;
  if (ctx.has_input(1)) {
    const Tensor& c = ctx.input(1);
    if (c.numel() != 1 || c.dtype() != DataType::kBool)
      return ctx.error(str_cat("cond must be a bool scalar, got ", c.describe()));
    cond = c.data<bool>()[0];
  }
  BodyScratchScope<LoopTag> scratch(2 + n, k);
  std::vector<Value>& feed = scratch.feed();
  std::vector<Value>& outs = scratch.results();
  for (size_t i = 0; i < n; ++i)  // assigned (a conditional would copy into a temporary first)
    if (ctx.inputs[2 + i]) feed[2 + i] = *ctx.inputs[2 + i];
  for (int64_t it = 0; cond && (!has_m || it < max_trips); ++it) {
    // Between iterations: a body with no nodes (or only cheap ones) never reaches the interpreter's
    // per-node check, and M may be 10^18.
    KILN_RETURN_IF_ERROR(check_deadline(ctx.node, it));
    feed[0] = Tensor::scalar<int64_t>(DataType::kInt64, it);
    feed[1] = Tensor::scalar<bool>(DataType::kBool, cond);
    KILN_RETURN_IF_ERROR(ctx.subgraphs->run_subgraph_into(*body, feed, outs));
    if (outs.size() != 1 + n + k)
      return ctx.error(str_cat("body produced ", outs.size(), " outputs, expected ", 1 + n + k));
    const Value& c = outs[0];
    if (!c.is_tensor() || c.tensor.numel() != 1 || c.tensor.dtype() != DataType::kBool)
      return ctx.error(str_cat("the body's condition output must be a bool scalar",
                               c.is_tensor() ? ", got " + c.tensor.describe() : std::string()));
    cond = c.tensor.data<bool>()[0];
    // Assigned, not moved: the scratch keeps its values' shape vectors for the next iteration and run.
    for (size_t i = 0; i < n; ++i) feed[2 + i] = outs[1 + i];
    for (size_t j = 0; j < k; ++j) {
      const Value& v = outs[1 + n + j];
      if (!v.is_tensor()) return ctx.error(str_cat("scan output ", j, " of the body must be a tensor"));
      if (scratch.scan_count(j) > 0)
        KILN_RETURN_IF_ERROR(check_same_shape(ctx, scratch.scan_items(j)[0], v.tensor, str_cat("scan output ", j)));
      scratch.add_scan_item(j, v.tensor);
    }
    for (Value& v : outs) clear_value(v);  // held by feed and the scans alone, as when moved
  }
  for (size_t i = 0; i < n && i < ctx.num_outputs(); ++i) ctx.outputs[i] = feed[2 + i];
  for (size_t j = 0; j < k && n + j < ctx.num_outputs(); ++j) {
    if (!ctx.wants_output(n + j)) continue;
    if (scratch.scan_count(j) == 0) {
      KILN_ASSIGN_OR_RETURN(Tensor e, empty_scan_output(ctx.node, body->outputs[1 + n + j], 0));
      ctx.set_output(n + j, std::move(e));
    } else {
      ctx.outputs[n + j].kind = Value::Kind::kTensor;
      stack_into(scratch.scan_items(j), scratch.scan_count(j), 0, ctx.outputs[n + j].tensor);
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Scan

struct ScanSpec {
  size_t n_state = 0, n_scan_in = 0, n_scan_out = 0;
  size_t first = 0;  // index of the first state input (1 for opset 8: sequence_lens comes first)
  std::vector<int64_t> in_axes, in_dirs, out_axes, out_dirs;
};

// Reads the counts and per-input/output attributes, checking them against the body.
Result<ScanSpec> scan_spec(const ir::Node& node, size_t num_inputs, const ir::Graph& body) {
  ScanSpec s;
  bool v8 = node.opset < 9;
  s.first = v8 ? 1 : 0;
  int64_t m = node.attr_int("num_scan_inputs", -1);
  if (m <= 0) return InvalidModel(node.where(), "num_scan_inputs must be a positive attribute, got ", m);
  if (num_inputs < s.first + static_cast<size_t>(m))
    return InvalidModel(node.where(), "has ", num_inputs, " inputs but num_scan_inputs is ", m);
  s.n_scan_in = static_cast<size_t>(m);
  s.n_state = num_inputs - s.first - s.n_scan_in;
  if (body.inputs.size() != s.n_state + s.n_scan_in)
    return InvalidModel(node.where(), "body takes ", body.inputs.size(), " inputs, expected ", s.n_state + s.n_scan_in,
                        " (", s.n_state, " states + ", s.n_scan_in, " scan inputs)");
  if (body.outputs.size() < s.n_state)
    return InvalidModel(node.where(), "body has ", body.outputs.size(), " outputs, fewer than its ", s.n_state,
                        " states");
  s.n_scan_out = body.outputs.size() - s.n_state;
  auto list = [&](const char* name, size_t count, std::vector<int64_t>& out) -> Status {
    out = node.attr_ints(name);
    if (out.empty()) out.assign(count, 0);
    if (out.size() != count)
      return InvalidModel(node.where(), "attribute '", name, "' has ", out.size(), " entries, expected ", count);
    return Status::Ok();
  };
  if (v8) {
    KILN_RETURN_IF_ERROR(list("directions", s.n_scan_in, s.in_dirs));
    s.in_axes.assign(s.n_scan_in, 0);
    s.out_axes.assign(s.n_scan_out, 0);
    s.out_dirs.assign(s.n_scan_out, 0);
  } else {
    KILN_RETURN_IF_ERROR(list("scan_input_axes", s.n_scan_in, s.in_axes));
    KILN_RETURN_IF_ERROR(list("scan_input_directions", s.n_scan_in, s.in_dirs));
    KILN_RETURN_IF_ERROR(list("scan_output_axes", s.n_scan_out, s.out_axes));
    KILN_RETURN_IF_ERROR(list("scan_output_directions", s.n_scan_out, s.out_dirs));
  }
  return s;
}

Status infer_scan(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::Graph* body, cf::graph_attr(ctx.node, "body"));
  KILN_ASSIGN_OR_RETURN(ScanSpec s, scan_spec(ctx.node, ctx.num_inputs(), *body));
  bool v8 = ctx.opset() < 9;
  // Per-iteration types: states lose the batch axis (opset 8), scan inputs their scan axis.
  std::vector<ir::TypeInfo> in;
  Dim batch, seq_len;
  bool batch_set = false, seq_set = false;
  auto note = [](Dim& d, bool& set, const Dim& v) {
    if (!set || (!d.known() && v.known())) d = v;
    set = true;
  };
  for (size_t i = 0; i < s.n_state; ++i) {
    ir::TypeInfo t = ctx.has_input(s.first + i) ? ctx.input(s.first + i) : ir::TypeInfo();
    if (v8 && t.is_tensor()) {
      if (t.shape.rank_known && t.shape.rank() > 0) note(batch, batch_set, t.shape.dims[0]);
      t.shape = remove_dim(t.shape, 0);
    }
    in.push_back(t);
  }
  for (size_t i = 0; i < s.n_scan_in; ++i) {
    ir::TypeInfo t = ctx.has_input(s.first + s.n_state + i) ? ctx.input(s.first + s.n_state + i) : ir::TypeInfo();
    if (t.is_tensor() && t.shape.rank_known) {
      int64_t rank = static_cast<int64_t>(t.shape.rank());
      if (v8) {
        if (rank < 2)
          return ctx.error(str_cat("scan input ", i, " must have a batch and a sequence axis, got ", t.str()));
        note(batch, batch_set, t.shape.dims[0]);
        note(seq_len, seq_set, t.shape.dims[1]);
        t.shape = remove_dim(remove_dim(t.shape, 0), 0);
      } else {
        auto ax = normalize_axis(s.in_axes[i], rank);
        if (!ax.ok()) return ctx.error(str_cat("scan_input_axes[", i, "]: ", ax.status().message()));
        note(seq_len, seq_set, t.shape.dims[static_cast<size_t>(ax.value())]);
        t.shape = remove_dim(t.shape, ax.value());
      }
    }
    in.push_back(t);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<ir::TypeInfo> outs, cf::infer_loop_body(ctx, *body, in, 0, 0, s.n_state));
  if (outs.size() != s.n_state + s.n_scan_out) return ctx.error("body inference returned the wrong number of outputs");
  if (!batch.known() && batch.param.empty()) batch = ctx.new_symbol();
  if (!seq_len.known() && seq_len.param.empty()) seq_len = ctx.new_symbol();
  for (size_t i = 0; i < s.n_state && i < ctx.outputs.size(); ++i) {
    ir::TypeInfo t = cf::widen(in[i], outs[i], [&] { return ctx.new_symbol(); });
    if (v8 && t.is_tensor()) t.shape = insert_dim(t.shape, 0, batch);
    ctx.set_output(i, t);
  }
  for (size_t j = 0; j < s.n_scan_out && s.n_state + j < ctx.outputs.size(); ++j) {
    const ir::TypeInfo& t = outs[s.n_state + j];
    if (t.kind != ir::TypeInfo::Kind::kTensor && t.kind != ir::TypeInfo::Kind::kUnknown)
      return ctx.error(str_cat("scan output ", j, " of the body must be a tensor, got ", t.str()));
    SymShape shape =
        v8 ? insert_dim(insert_dim(t.shape, 0, seq_len), 0, batch) : insert_dim(t.shape, s.out_axes[j], seq_len);
    ctx.set_output(s.n_state + j, t.elem, shape);
  }
  return Status::Ok();
}

// One run of the scan over `len` steps. `states` are updated in place; scan output j collects
// the per-step values in iteration order.
Status run_scan(KernelContext& ctx, const ir::Graph& body, const ScanSpec& s, std::vector<Value>& states,
                const std::vector<Tensor>& scan_in, const std::vector<int64_t>& axes, int64_t len,
                std::vector<std::vector<Tensor>>& scan_out) {
  std::vector<Value> feed(s.n_state + s.n_scan_in);
  for (int64_t t = 0; t < len; ++t) {
    KILN_RETURN_IF_ERROR(check_deadline(ctx.node, t));
    for (size_t i = 0; i < s.n_state; ++i) feed[i] = states[i];
    for (size_t i = 0; i < s.n_scan_in; ++i) {
      int64_t idx = s.in_dirs[i] ? len - 1 - t : t;
      feed[s.n_state + i] = take_along(scan_in[i], axes[i], idx);
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Value> outs, ctx.subgraphs->run_subgraph(body, feed));
    if (outs.size() != s.n_state + s.n_scan_out)
      return ctx.error(str_cat("body produced ", outs.size(), " outputs, expected ", s.n_state + s.n_scan_out));
    for (size_t i = 0; i < s.n_state; ++i) states[i] = std::move(outs[i]);
    for (size_t j = 0; j < s.n_scan_out; ++j) {
      Value& v = outs[s.n_state + j];
      if (!v.is_tensor()) return ctx.error(str_cat("scan output ", j, " of the body must be a tensor"));
      if (!scan_out[j].empty())
        KILN_RETURN_IF_ERROR(check_same_shape(ctx, scan_out[j][0], v.tensor, str_cat("scan output ", j)));
      scan_out[j].push_back(std::move(v.tensor));
    }
  }
  return Status::Ok();
}

Status check_scan_directions(const KernelContext& ctx, const ScanSpec& s) {
  for (int64_t d : s.in_dirs)
    if (d != 0 && d != 1) return ctx.error(str_cat("scan input directions must be 0 or 1, got ", d));
  for (int64_t d : s.out_dirs)
    if (d != 0 && d != 1) return ctx.error(str_cat("scan output directions must be 0 or 1, got ", d));
  return Status::Ok();
}

Status scan9_kernel(KernelContext& ctx, const ir::Graph& body, const ScanSpec& s) {
  std::vector<Value> states;
  for (size_t i = 0; i < s.n_state; ++i) {
    if (!ctx.inputs[i]) return ctx.error(str_cat("state input ", i, " is missing"));
    states.push_back(ctx.input_value(i));
  }
  std::vector<Tensor> scan_in;
  std::vector<int64_t> axes;
  int64_t len = -1;
  for (size_t i = 0; i < s.n_scan_in; ++i) {
    size_t idx = s.n_state + i;
    if (!ctx.has_input(idx) || !ctx.input_value(idx).is_tensor())
      return ctx.error(str_cat("scan input ", i, " must be a tensor"));
    const Tensor& t = ctx.input(idx);
    if (t.rank() == 0) return ctx.error(str_cat("scan input ", i, " must have rank >= 1"));
    auto ax = normalize_axis(s.in_axes[i], t.rank());
    if (!ax.ok()) return ctx.error(str_cat("scan_input_axes[", i, "]: ", ax.status().message()));
    int64_t l = t.dim(ax.value());
    if (len >= 0 && l != len)
      return ctx.error(str_cat("scan inputs differ in sequence length: ", len, " vs ", l, " (input ", i, ")"));
    len = l;
    scan_in.push_back(t);
    axes.push_back(ax.value());
  }
  std::vector<std::vector<Tensor>> outs(s.n_scan_out);
  KILN_RETURN_IF_ERROR(run_scan(ctx, body, s, states, scan_in, axes, len, outs));
  for (size_t i = 0; i < s.n_state && i < ctx.num_outputs(); ++i) ctx.set_output_value(i, std::move(states[i]));
  for (size_t j = 0; j < s.n_scan_out && s.n_state + j < ctx.num_outputs(); ++j) {
    if (!ctx.wants_output(s.n_state + j)) continue;
    if (outs[j].empty()) {
      KILN_ASSIGN_OR_RETURN(Tensor e, empty_scan_output(ctx.node, body.outputs[s.n_state + j], s.out_axes[j]));
      ctx.set_output(s.n_state + j, std::move(e));
      continue;
    }
    int64_t r = outs[j][0].rank() + 1;
    auto ax = normalize_axis(s.out_axes[j], r);
    if (!ax.ok()) return ctx.error(str_cat("scan_output_axes[", j, "]: ", ax.status().message()));
    if (s.out_dirs[j]) std::reverse(outs[j].begin(), outs[j].end());  // prepending
    ctx.set_output(s.n_state + j, stack_along(outs[j], ax.value()));
  }
  return Status::Ok();
}

// Opset 8: axis 0 of every state and scan input is a batch; each batch entry is scanned on its own
// (over sequence_lens[b] steps of axis 1), and the results are stacked back along axis 0. Scan
// outputs are padded with zeros past a batch entry's sequence length.
Status scan8_kernel(KernelContext& ctx, const ir::Graph& body, const ScanSpec& s) {
  int64_t batch = -1, max_len = -1;
  auto batched = [&](size_t idx, const char* what, int64_t min_rank) -> Result<const Tensor*> {
    if (!ctx.has_input(idx) || !ctx.input_value(idx).is_tensor()) return ctx.error(str_cat(what, " must be a tensor"));
    const Tensor& t = ctx.input(idx);
    if (t.rank() < min_rank)
      return ctx.error(str_cat(what, " needs rank >= ", min_rank, " (batch axis first), got ", t.describe()));
    if (batch >= 0 && t.dim(0) != batch)
      return ctx.error(str_cat(what, " has batch size ", t.dim(0), ", others ", batch));
    batch = t.dim(0);
    return &t;
  };
  std::vector<const Tensor*> init, scan_in;
  for (size_t i = 0; i < s.n_state; ++i) {
    KILN_ASSIGN_OR_RETURN(const Tensor* t, batched(s.first + i, "state input", 1));
    init.push_back(t);
  }
  for (size_t i = 0; i < s.n_scan_in; ++i) {
    KILN_ASSIGN_OR_RETURN(const Tensor* t, batched(s.first + s.n_state + i, "scan input", 2));
    if (max_len >= 0 && t->dim(1) != max_len)
      return ctx.error(str_cat("scan inputs differ in sequence length: ", max_len, " vs ", t->dim(1)));
    max_len = t->dim(1);
    scan_in.push_back(t);
  }
  std::vector<int64_t> lens(static_cast<size_t>(batch), max_len);
  if (ctx.has_input(0)) {
    const Tensor& sl = ctx.input(0);
    if (!dtype_is_integer(sl.dtype()) || sl.numel() != batch)
      return ctx.error(str_cat("sequence_lens must be an integer tensor of ", batch, " entries, got ", sl.describe()));
    for (int64_t b = 0; b < batch; ++b) {
      int64_t l = sl.get_i64(b);
      if (l < 0 || l > max_len)
        return ctx.error(str_cat("sequence_lens[", b, "] = ", l, " is outside [0, ", max_len, "]"));
      lens[static_cast<size_t>(b)] = l;
    }
  }
  std::vector<std::vector<Tensor>> final_states(s.n_state);
  std::vector<std::vector<std::vector<Tensor>>> per_batch(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Value> states;
    for (const Tensor* t : init) states.emplace_back(take_along(*t, 0, b));
    std::vector<Tensor> slices;
    for (const Tensor* t : scan_in) slices.push_back(take_along(*t, 0, b));
    std::vector<int64_t> axes(s.n_scan_in, 0);
    auto& outs = per_batch[static_cast<size_t>(b)];
    outs.resize(s.n_scan_out);
    KILN_RETURN_IF_ERROR(run_scan(ctx, body, s, states, slices, axes, lens[static_cast<size_t>(b)], outs));
    for (size_t i = 0; i < s.n_state; ++i) {
      if (!states[i].is_tensor()) return ctx.error(str_cat("state ", i, " must stay a tensor"));
      if (b > 0)
        KILN_RETURN_IF_ERROR(check_same_shape(ctx, final_states[i][0], states[i].tensor, str_cat("state ", i)));
      final_states[i].push_back(states[i].tensor);
    }
  }
  for (size_t i = 0; i < s.n_state && i < ctx.num_outputs(); ++i) {
    if (batch == 0) {
      ctx.set_output(i, Tensor(init[i]->dtype(), init[i]->shape()));
      continue;
    }
    ctx.set_output(i, stack_along(final_states[i], 0));
  }
  for (size_t j = 0; j < s.n_scan_out && s.n_state + j < ctx.num_outputs(); ++j) {
    if (!ctx.wants_output(s.n_state + j)) continue;
    // The element shape: from any step that ran, else from the body's static type.
    const Tensor* proto = nullptr;
    for (const auto& outs : per_batch)
      if (!outs[j].empty()) proto = &outs[j][0];
    if (!proto) {
      KILN_ASSIGN_OR_RETURN(Tensor e, empty_scan_output(ctx.node, body.outputs[s.n_state + j], 0, Dims{batch}));
      if (max_len > 0) return ctx.error("scan output element shape unknown for a padded result");
      ctx.set_output(s.n_state + j, std::move(e));
      continue;
    }
    Dims shape = proto->shape();
    shape.insert(shape.begin(), max_len);
    shape.insert(shape.begin(), batch);
    Tensor out(proto->dtype(), shape);  // zero padding past each sequence length
    int64_t step = proto->numel();
    for (int64_t b = 0; b < batch; ++b) {
      const auto& items = per_batch[static_cast<size_t>(b)][j];
      for (size_t t = 0; t < items.size(); ++t) {
        KILN_RETURN_IF_ERROR(check_same_shape(ctx, *proto, items[t], str_cat("scan output ", j)));
        copy_elements(items[t], 0, out, (b * max_len + static_cast<int64_t>(t)) * step, step);
      }
    }
    ctx.set_output(s.n_state + j, std::move(out));
  }
  return Status::Ok();
}

Status scan_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::Graph* body, cf::graph_attr(ctx.node, "body"));
  if (!ctx.subgraphs) return ctx.unsupported("Scan needs a subgraph runner");
  KILN_ASSIGN_OR_RETURN(ScanSpec s, scan_spec(ctx.node, ctx.num_inputs(), *body));
  KILN_RETURN_IF_ERROR(check_scan_directions(ctx, s));
  if (ctx.num_outputs() > s.n_state + s.n_scan_out)
    return ctx.error(
        str_cat("the node has ", ctx.num_outputs(), " outputs but the body yields ", s.n_state + s.n_scan_out));
  return ctx.opset() < 9 ? scan8_kernel(ctx, *body, s) : scan9_kernel(ctx, *body, s);
}

}  // namespace

KILN_REGISTER_OP_ARITY("", If, 1, infer_if, if_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Loop, 1, infer_loop, loop_kernel, 2, -1);
KILN_REGISTER_OP_ARITY("", Scan, 8, infer_scan, scan_kernel, 1, -1);

}  // namespace kiln::ops

// Data movement as copies of contiguous runs: Transpose, Slice, Split, Expand, Tile, Pad (every
// mode), Concat, Gather, kiln.ChannelShuffle, and Dropout (inference) / Identity as copies, any dtype
// of 1, 2, 4 or 8 bytes. Each output is
// described once, at prepare time, as a view of the input: per output dim a size and either a stride (elements, 0 to
// repeat, negative to reverse) or a table of source offsets (Pad's maps, with kFill where the pad value goes). Adjacent
// dims that address memory contiguously are merged, so most views end in one long innermost run that is copied with
// memcpy (or filled), and the rows are split over threads. The geometry comes from the reference kernels' own helpers
// (ops/movement_geometry.h).
#include <algorithm>
#include <cstring>

#include "backends/tactic.h"
#include "core/parallel.h"
#include "ops/movement_geometry.h"

namespace kiln::backends::cpu {
namespace {

constexpr int64_t kFill = INT64_MIN;  // a table entry: the pad value
// Output elements a thread gets at least: a parallel region costs about 0.1 ms here (see
// elementwise_tactic.cc), a copy of 2^19 floats a few times that.
constexpr int64_t kGrainElements = int64_t{1} << 19;

struct ViewDim {
  int64_t size = 1, stride = 0;
  std::vector<int64_t> table;  // non-empty: source offsets per index (replaces stride)
};

// A run of the innermost dim when it is a table: [begin, begin + len) copied from src on (or filled).
struct Run {
  int64_t begin = 0, len = 0, src = 0;
  bool fill = false;
};

// One output as a view of the input starting at `base`.
struct View {
  std::vector<ViewDim> dims;
  int64_t base = 0;
  std::vector<Run> runs;  // innermost dim with a table

  // Drops size-1 dims and merges neighbours that address memory as one dim, then splits a table
  // innermost dim into runs.
  void normalize() {
    std::vector<ViewDim> out;
    for (ViewDim& d : dims) {
      if (d.size == 1 && (d.table.empty() || d.table[0] != kFill)) {  // a padded one stays: the rows are fill
        if (!d.table.empty()) base += d.table[0];
        continue;
      }
      if (!out.empty() && out.back().table.empty() && d.table.empty() && out.back().stride == d.size * d.stride) {
        out.back().size *= d.size;
        out.back().stride = d.stride;
        continue;
      }
      out.push_back(std::move(d));
    }
    if (out.empty()) out.push_back(ViewDim{1, 1, {}});
    dims = std::move(out);
    split_runs();
  }

  void split_runs() {
    runs.clear();
    const ViewDim& in = dims.back();
    if (in.table.empty()) return;
    for (int64_t j = 0; j < in.size; ++j) {
      int64_t v = in.table[static_cast<size_t>(j)];
      bool fill = v == kFill;
      if (!runs.empty()) {
        Run& r = runs.back();
        if (fill && r.fill) {
          ++r.len;
          continue;
        }
        if (!fill && !r.fill && v == r.src + r.len) {
          ++r.len;
          continue;
        }
      }
      runs.push_back(Run{j, 1, fill ? 0 : v, fill});
    }
  }

  int64_t rows() const {
    int64_t n = 1;
    for (size_t k = 0; k + 1 < dims.size(); ++k) n *= dims[k].size;
    return n;
  }
};

// Copies rows [r0, r1) of view v from src to dst (elements of ES bytes; `fill`: the pad value).
template <size_t ES>
void copy_rows(const View& v, const uint8_t* src, uint8_t* dst, const uint8_t* fill, int64_t r0, int64_t r1) {
  const size_t nd = v.dims.size();
  const ViewDim& last = v.dims.back();
  const int64_t n = last.size;
  int64_t idx[32] = {0};  // Tile's view has two dims per input dim
  for (int64_t rest = r0, k = static_cast<int64_t>(nd) - 2; k >= 0; --k) {
    idx[k] = rest % v.dims[static_cast<size_t>(k)].size;
    rest /= v.dims[static_cast<size_t>(k)].size;
  }
  auto fill_n = [&](uint8_t* d, int64_t m) {
    for (int64_t i = 0; i < m; ++i) std::memcpy(d + static_cast<size_t>(i) * ES, fill, ES);
  };
  for (int64_t r = r0; r < r1; ++r) {
    int64_t off = v.base;
    bool padded = false;
    for (size_t k = 0; k + 1 < nd; ++k) {
      const ViewDim& d = v.dims[k];
      if (d.table.empty()) {
        off += idx[k] * d.stride;
      } else {
        int64_t t = d.table[static_cast<size_t>(idx[k])];
        padded |= t == kFill;
        off += t == kFill ? 0 : t;
      }
    }
    uint8_t* out = dst + static_cast<size_t>(r * n) * ES;
    if (padded) {
      fill_n(out, n);
    } else if (!last.table.empty()) {
      for (const Run& run : v.runs) {
        uint8_t* o = out + static_cast<size_t>(run.begin) * ES;
        if (run.fill)
          fill_n(o, run.len);
        else
          std::memcpy(o, src + static_cast<size_t>(off + run.src) * ES, static_cast<size_t>(run.len) * ES);
      }
    } else if (last.stride == 1) {
      std::memcpy(out, src + static_cast<size_t>(off) * ES, static_cast<size_t>(n) * ES);
    } else {
      using T =
          std::conditional_t<ES == 1, uint8_t,
                             std::conditional_t<ES == 2, uint16_t, std::conditional_t<ES == 4, uint32_t, uint64_t>>>;
      const T* s = reinterpret_cast<const T*>(src) + off;
      T* o = reinterpret_cast<T*>(out);
      const int64_t st = last.stride;
      for (int64_t i = 0; i < n; ++i) o[i] = s[i * st];
    }
    for (int64_t k = static_cast<int64_t>(nd) - 2; k >= 0; --k) {
      if (++idx[k] < v.dims[static_cast<size_t>(k)].size) break;
      idx[k] = 0;
    }
  }
}

// The dim (other than the innermost) that reads the source contiguously, when the innermost one does
// not: a transpose that moves the last dim (attention's K^T). Copying its rows element by element
// reads one element per cache line; tiles of (that dim x the innermost) read and write whole lines.
int tiled_dim(const View& v) {
  const ViewDim& last = v.dims.back();
  if (v.dims.size() < 2 || !last.table.empty() || last.stride == 1 || last.stride == 0 || last.size < 8) return -1;
  for (size_t k = 0; k + 1 < v.dims.size(); ++k)
    if (!v.dims[k].table.empty()) return -1;
  for (size_t k = 0; k + 1 < v.dims.size(); ++k)
    if (v.dims[k].stride == 1 && v.dims[k].size >= 8) return static_cast<int>(k);
  return -1;
}

// Tiles [u0, u1) of the tiled copy: each unit is one (outer index, tile of dim p, tile of the innermost).
template <size_t ES>
void copy_tiles(const View& v, int p, const uint8_t* src, uint8_t* dst, int64_t u0, int64_t u1) {
  using T = std::conditional_t<ES == 1, uint8_t,
                               std::conditional_t<ES == 2, uint16_t, std::conditional_t<ES == 4, uint32_t, uint64_t>>>;
  constexpr int64_t kTp = 64 / ES < 8 ? 8 : 64 / ES, kTl = 32;
  const size_t nd = v.dims.size();
  // The output's strides, on the stack up to rank 8: a steady-state run allocates nothing (tests/noalloc).
  int64_t small[8];
  Dims big;
  int64_t* ostride = small;
  if (nd > 8) big.resize(nd), ostride = big.data();
  ostride[nd - 1] = 1;
  for (size_t k = nd - 1; k-- > 0;) ostride[k] = ostride[k + 1] * v.dims[k + 1].size;
  const ViewDim& last = v.dims.back();
  const ViewDim& dp = v.dims[static_cast<size_t>(p)];
  const int64_t tp = (dp.size + kTp - 1) / kTp, tl = (last.size + kTl - 1) / kTl;
  const auto* s = reinterpret_cast<const T*>(src);
  auto* o = reinterpret_cast<T*>(dst);
  for (int64_t u = u0; u < u1; ++u) {
    int64_t rest = u / (tp * tl);
    const int64_t ip = (u / tl) % tp * kTp, il = u % tl * kTl;
    int64_t soff = v.base, ooff = 0;
    for (size_t k = nd - 1; k-- > 0;) {
      if (static_cast<int>(k) == p) continue;
      int64_t i = rest % v.dims[k].size;
      rest /= v.dims[k].size;
      soff += i * v.dims[k].stride, ooff += i * ostride[k];
    }
    const int64_t pe = std::min(dp.size, ip + kTp), le = std::min(last.size, il + kTl);
    const int64_t st = last.stride, op = ostride[static_cast<size_t>(p)];
    for (int64_t a = ip; a < pe; ++a) {
      const T* sa = s + soff + a;
      T* oa = o + ooff + a * op;
      for (int64_t b = il; b < le; ++b) oa[b] = sa[b * st];
    }
  }
}

void copy_view(const View& v, size_t es, const void* src, void* dst, const uint8_t* fill) {
  const int64_t rows = v.rows(), n = v.dims.back().size;
  if (rows * n == 0) return;
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (int p = tiled_dim(v); p >= 0) {
    const int64_t sp = v.dims[static_cast<size_t>(p)].size, kTp = es >= 8 ? 8 : 64 / static_cast<int64_t>(es);
    const int64_t units = rows / sp * ((sp + kTp - 1) / kTp) * ((n + 31) / 32);
    const int64_t per_unit = kTp * 32;
    parallel_for(units, std::max<int64_t>(1, kGrainElements / per_unit), [&](int64_t u0, int64_t u1) {
      switch (es) {
        case 1: return copy_tiles<1>(v, p, s, d, u0, u1);
        case 2: return copy_tiles<2>(v, p, s, d, u0, u1);
        case 4: return copy_tiles<4>(v, p, s, d, u0, u1);
        default: return copy_tiles<8>(v, p, s, d, u0, u1);
      }
    });
    return;
  }
  parallel_for(rows, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(n, 1)), [&](int64_t r0, int64_t r1) {
    switch (es) {
      case 1: return copy_rows<1>(v, s, d, fill, r0, r1);
      case 2: return copy_rows<2>(v, s, d, fill, r0, r1);
      case 4: return copy_rows<4>(v, s, d, fill, r0, r1);
      default: return copy_rows<8>(v, s, d, fill, r0, r1);
    }
  });
}

Dims strides_of(const Dims& x) {
  Dims s(x.size(), 1);
  for (size_t k = x.size(); k-- > 1;) s[k - 1] = s[k] * x[k];
  return s;
}

// Integers of a constant input (nullopt-like: false when it is not a constant integer tensor).
bool constant_ints(const LayerSignature& sig, size_t i, std::vector<int64_t>* out) {
  if (!sig.has_input(i) || !sig.inputs[i].constant) return false;
  const Tensor& t = *sig.inputs[i].constant;
  if (t.dtype() != DataType::kInt64 && t.dtype() != DataType::kInt32) return false;
  out->clear();
  for (int64_t k = 0; k < t.numel(); ++k) out->push_back(t.get_i64(k));
  return true;
}

class PreparedMovement : public PreparedLayer {
 public:
  std::vector<View> views;  // one per output (Concat: one per input, written into the output)
  std::vector<Dims> shapes;
  DataType dtype = DataType::kFloat32;
  bool concat = false;
  int64_t concat_outer = 1;
  std::vector<int64_t> concat_len;  // elements of each input per outer index
  int fill_input = -1;              // Pad: the input holding the pad value (-1: zero)
  bool gather = false;              // Gather: [outer, axis, inner] -> [outer, indices, inner]
  int64_t gather_outer = 1, gather_axis = 1, gather_inner = 1;

  Status run_gather(const Tensor& data, const Tensor& ind, Tensor& out) const {
    const size_t es = dtype_size(dtype);
    const int64_t n = ind.numel(), dim = gather_axis, inner = gather_inner;
    // Indices are checked before anything is copied: a bad one is the user's error, not a crash.
    auto index = [&](int64_t j) {
      return ind.dtype() == DataType::kInt64 ? ind.data<int64_t>()[j] : int64_t{ind.data<int32_t>()[j]};
    };
    for (int64_t j = 0; j < n; ++j) {
      int64_t i = index(j);
      if (i < -dim || i >= dim)
        return InvalidArgument("Gather index ", i, " is out of range for an axis of size ", dim);
    }
    const auto* s = static_cast<const uint8_t*>(data.raw());
    auto* d = static_cast<uint8_t*>(out.raw());
    parallel_for(gather_outer * n, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(inner, 1)),
                 [&](int64_t u0, int64_t u1) {
                   for (int64_t u = u0; u < u1; ++u) {
                     int64_t o = u / n, i = index(u % n);
                     if (i < 0) i += dim;
                     std::memcpy(d + static_cast<size_t>(u * inner) * es,
                                 s + static_cast<size_t>((o * dim + i) * inner) * es, static_cast<size_t>(inner) * es);
                   }
                 });
    return Status::Ok();
  }

  bool mask = false;  // Dropout's mask output: all true

  // kiln.ChannelShuffle: output channel rows of `shuffle_inner` elements, each from its source.
  bool shuffle = false;
  int64_t shuffle_batch = 1, shuffle_inner = 1;
  std::vector<int64_t> shuffle_channels;        // of each input
  std::vector<ops::ShuffleSource> shuffle_src;  // per channel of the outputs, in order
  std::vector<size_t> shuffle_output;           // the output of each such channel
  std::vector<int64_t> shuffle_first;           // its first channel in that output

  void run_shuffle(const std::vector<const Tensor*>& in, const std::vector<Tensor*>& outs) const {
    const int64_t c = static_cast<int64_t>(shuffle_src.size());
    const size_t row = static_cast<size_t>(shuffle_inner) * dtype_size(dtype);
    parallel_for(shuffle_batch * c, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(shuffle_inner, 1)),
                 [&](int64_t u0, int64_t u1) {
                   for (int64_t u = u0; u < u1; ++u) {
                     const int64_t b = u / c, k = u % c;
                     const ops::ShuffleSource& s = shuffle_src[static_cast<size_t>(k)];
                     const size_t o = shuffle_output[static_cast<size_t>(k)];
                     const int64_t oc = shapes[o][1], ic = shuffle_channels[static_cast<size_t>(s.input)];
                     std::memcpy(static_cast<uint8_t*>(outs[o]->raw()) +
                                     static_cast<size_t>(b * oc + k - shuffle_first[static_cast<size_t>(k)]) * row,
                                 static_cast<const uint8_t*>(in[static_cast<size_t>(s.input)]->raw()) +
                                     static_cast<size_t>(b * ic + s.channel) * row,
                                 row);
                   }
                 });
  }

  std::vector<Dims> output_shapes() const override {
    if (mask) return {shapes[0], shapes[0]};
    return shapes;
  }
  std::vector<DataType> output_dtypes() const override {
    if (mask) return {dtype, DataType::kBool};
    return std::vector<DataType>(shapes.size(), dtype);
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& outs) const override {
    const size_t es = dtype_size(dtype);
    if (gather) return run_gather(*in[0], *in[1], *outs[0]);
    if (shuffle) {
      run_shuffle(in, outs);
      return Status::Ok();
    }
    if (concat) {
      int64_t total = 0;
      for (int64_t l : concat_len) total += l;
      const size_t n_in = concat_len.size();
      auto* d = static_cast<uint8_t*>(outs[0]->raw());
      parallel_for(concat_outer * static_cast<int64_t>(n_in),
                   std::max<int64_t>(1, kGrainElements / std::max<int64_t>(total / static_cast<int64_t>(n_in), 1)),
                   [&](int64_t u0, int64_t u1) {
                     for (int64_t u = u0; u < u1; ++u) {
                       int64_t o = u / static_cast<int64_t>(n_in);
                       size_t i = static_cast<size_t>(u % static_cast<int64_t>(n_in));
                       int64_t at = 0;
                       for (size_t k = 0; k < i; ++k) at += concat_len[k];
                       if (concat_len[i] == 0) continue;
                       std::memcpy(
                           d + static_cast<size_t>(o * total + at) * es,
                           static_cast<const uint8_t*>(in[i]->raw()) + static_cast<size_t>(o * concat_len[i]) * es,
                           static_cast<size_t>(concat_len[i]) * es);
                     }
                   });
      return Status::Ok();
    }
    uint8_t fill[8] = {0};
    if (fill_input >= 0 && static_cast<size_t>(fill_input) < in.size() && in[static_cast<size_t>(fill_input)] &&
        in[static_cast<size_t>(fill_input)]->numel() > 0)
      std::memcpy(fill, in[static_cast<size_t>(fill_input)]->raw(), es);
    for (size_t o = 0; o < views.size(); ++o) copy_view(views[o], es, in[0]->raw(), outs[o]->raw(), fill);
    if (mask) std::memset(outs[1]->raw(), 1, static_cast<size_t>(outs[1]->numel()));
    return Status::Ok();
  }
};

class MovementKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_any_dtype(); }
  std::string name() const override { return "movement_kiln"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "Transpose"},
            {"", "Slice"},
            {"", "Split"},
            {"", "Expand"},
            {"", "Tile"},
            {"", "Pad"},
            {"", "Concat"},
            {"", "Gather"},
            {"", "Dropout"},
            {"", "Identity"},
            {"kiln", "ChannelShuffle"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
    if (!sig.has_input(0)) return "no input";
    DataType dt = sig.inputs[0].dtype;
    if (dt == DataType::kString || dt == DataType::kUndefined) return std::string("dtype ") + dtype_name(dt);
    size_t es = dtype_size(dt);
    if (es != 1 && es != 2 && es != 4 && es != 8) return std::string("dtype ") + dtype_name(dt) + " (sub-byte)";
    for (size_t i = 0; i < sig.inputs.size(); ++i)
      if (sig.has_input(i) && sig.inputs[i].dtype != DataType::kUndefined &&
          (sig.op() == "Concat" || sig.op() == "ChannelShuffle") && sig.inputs[i].dtype != dt)
        return "inputs differ in dtype";
    if (sig.inputs[0].shape.size() > 15) return "rank above 15";
    if (!sig.fully_known()) return shape_free_check(sig);
    PreparedMovement p;
    return plan(sig, &p);
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedMovement>();
    if (auto e = plan(sig, p.get()); !e.empty()) return Unsupported(name(), ": ", e);
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  // What can be told before the shapes are known: the parameters must be constants.
  static std::string shape_free_check(const LayerSignature& sig) {
    const std::string& op = sig.op();
    const int opset = sig.node->opset;
    auto need_const = [&](size_t from) -> std::string {
      for (size_t i = from; i < sig.inputs.size(); ++i)
        if (sig.has_input(i) && !sig.inputs[i].constant && !(op == "Pad" && i == 2))
          return "input " + std::to_string(i) + " is computed at run time";
      return "";
    };
    if (op == "Transpose" || op == "Concat" || op == "Identity" || op == "ChannelShuffle") return "";
    if (op == "Dropout") {  // the identity (inference, or training with ratio 0) and an all-true mask
      if (sig.node->outputs.size() > 1 && !sig.node->outputs[1].empty() && opset < 10)
        return "the mask output has X's dtype (opset < 10)";
      if (opset >= 12 && sig.has_input(2)) {
        const Tensor* t = sig.inputs[2].constant;
        if (!t || t->numel() != 1) return "training_mode is not a constant";
        if (t->get_f64(0) != 0) {  // training: an identity only with a constant ratio of 0
          const Tensor* ratio = sig.has_input(1) ? sig.inputs[1].constant : nullptr;
          if (!ratio || ratio->numel() != 1 || ratio->get_f64(0) != 0) return "training mode with a ratio above 0";
        }
      }
      return "";
    }
    if (op == "Gather") {  // indices may be computed at run time
      if (!sig.has_input(1)) return "no indices";
      DataType it = sig.inputs[1].dtype;
      return it == DataType::kInt64 || it == DataType::kInt32 ? "" : "indices are not int64 / int32";
    }
    if (op == "Tile" && opset < 6) return "Tile-1";
    return need_const(1);
  }

  // kiln.ChannelShuffle: the source of every output channel (ops/movement_geometry.h), checked as the
  // reference kernel checks it.
  static std::string plan_shuffle(const LayerSignature& sig, PreparedMovement* p) {
    const Dims& x = sig.inputs[0].shape;
    if (x.size() < 2) return "inputs of rank below 2";
    for (size_t i = 0; i < sig.inputs.size(); ++i) {
      if (!sig.has_input(i)) return "a missing input";
      const Dims& s = sig.inputs[i].shape;
      if (s.size() != x.size()) return "inputs differ in rank";
      for (size_t k = 0; k < x.size(); ++k)
        if (k != 1 && s[k] != x[k]) return "inputs differ off the channel axis";
      p->shuffle_channels.push_back(s[1]);
    }
    auto src = ops::channel_shuffle_sources(p->shuffle_channels, sig.node->attr_int("groups", 0));
    if (!src.ok()) return src.status().message();
    const int64_t c = static_cast<int64_t>(src->size());
    const bool has_split = sig.node->attr("split") != nullptr;
    auto split = ops::channel_shuffle_split(
        has_split, has_split ? sig.node->attr_ints("split") : std::vector<int64_t>{}, sig.node->outputs.size(), c);
    if (!split.ok()) return split.status().message();
    p->shuffle_src = std::move(*src);
    int64_t first = 0;
    for (size_t o = 0; o < split->size(); first += (*split)[o], ++o) {
      for (int64_t j = 0; j < (*split)[o]; ++j) p->shuffle_output.push_back(o), p->shuffle_first.push_back(first);
      Dims shape = x;
      shape[1] = (*split)[o];
      p->shapes.push_back(shape);
    }
    p->shuffle_batch = x[0];
    for (size_t k = 2; k < x.size(); ++k) p->shuffle_inner *= x[k];
    p->dtype = sig.inputs[0].dtype;
    p->shuffle = true;
    return "";
  }

  static std::string plan(const LayerSignature& sig, PreparedMovement* p) {
    if (auto e = shape_free_check(sig); !e.empty()) return e;
    const ir::Node& n = *sig.node;
    const std::string& op = n.op_type;
    const Dims& x = sig.inputs[0].shape;
    const Dims xs = strides_of(x);
    const int64_t r = static_cast<int64_t>(x.size());
    p->dtype = sig.inputs[0].dtype;
    View v;
    Dims out;
    auto linear = [&](int64_t size, int64_t stride) {
      ViewDim d;
      d.size = size, d.stride = stride;
      v.dims.push_back(d);
      out.push_back(size);
    };
    if (op == "Dropout" || op == "Identity") {
      for (int64_t k = 0; k < r; ++k) linear(x[static_cast<size_t>(k)], xs[static_cast<size_t>(k)]);
      p->mask = op == "Dropout" && n.outputs.size() > 1 && !n.outputs[1].empty();
    } else if (op == "Transpose") {
      std::vector<int64_t> perm = n.attr_ints("perm");
      if (!n.attr("perm"))
        for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
      if (static_cast<int64_t>(perm.size()) != r) return "perm does not match the rank";
      std::vector<bool> seen(static_cast<size_t>(r), false);
      for (int64_t k : perm) {
        if (k < 0 || k >= r || seen[static_cast<size_t>(k)]) return "perm is not a permutation";
        seen[static_cast<size_t>(k)] = true;
        linear(x[static_cast<size_t>(k)], xs[static_cast<size_t>(k)]);
      }
    } else if (op == "Slice") {
      ops::SliceParams sp;
      if (n.opset < 10) {
        sp.starts = n.attr_ints("starts"), sp.ends = n.attr_ints("ends");
        sp.has_axes = n.attr("axes") != nullptr, sp.axes = n.attr_ints("axes");
      } else {
        if (!constant_ints(sig, 1, &sp.starts) || !constant_ints(sig, 2, &sp.ends)) return "starts / ends not constant";
        if (sig.has_input(3) && !(sp.has_axes = constant_ints(sig, 3, &sp.axes))) return "axes not constant";
        if (sig.has_input(4) && !(sp.has_steps = constant_ints(sig, 4, &sp.steps))) return "steps not constant";
      }
      if (Status st = ops::check_slice_params(sp, r); !st.ok()) return st.message();
      Dims size = x, stride = xs;
      for (size_t i = 0; i < sp.axes.size(); ++i) {
        size_t a = static_cast<size_t>(sp.axes[i]);
        auto s = ops::slice_axis(x[a], sp.starts[i], sp.ends[i], sp.steps[i]);
        if (!s.ok()) return s.status().message();
        size[a] = s->len;
        if (s->len > 0) v.base += s->start * xs[a];
        stride[a] = s->len > 1 ? s->step * xs[a] : 0;
      }
      for (int64_t k = 0; k < r; ++k) linear(size[static_cast<size_t>(k)], stride[static_cast<size_t>(k)]);
    } else if (op == "Split") {
      if (r == 0) return "a scalar";
      int64_t axis = n.attr_int("axis", 0);
      if (axis < -r || axis >= r) return "axis out of range";
      if (axis < 0) axis += r;
      bool has_split = false;
      std::vector<int64_t> split;
      int64_t num_outputs = n.opset >= 18 && n.attr("num_outputs") ? n.attr_int("num_outputs", -1) : -1;
      if ((n.opset >= 2 && n.opset < 13) || (n.opset < 2 && n.attr("split"))) {
        has_split = n.attr("split") != nullptr, split = n.attr_ints("split");
      } else if (sig.has_input(1)) {
        if (!constant_ints(sig, 1, &split)) return "split not a constant";
        has_split = true;
      }
      auto sizes = ops::split_sizes(has_split, split, num_outputs, static_cast<int64_t>(n.outputs.size()),
                                    x[static_cast<size_t>(axis)]);
      if (!sizes.ok()) return sizes.status().message();
      int64_t begin = 0;
      for (int64_t len : *sizes) {
        View s;
        Dims o = x;
        o[static_cast<size_t>(axis)] = len;
        for (int64_t k = 0; k < r; ++k)
          s.dims.push_back(ViewDim{o[static_cast<size_t>(k)], xs[static_cast<size_t>(k)], {}});
        s.base = begin * xs[static_cast<size_t>(axis)];
        begin += len;
        s.normalize();
        p->views.push_back(std::move(s));
        p->shapes.push_back(o);
      }
      return "";
    } else if (op == "Expand") {
      std::vector<int64_t> target;
      if (!constant_ints(sig, 1, &target)) return "shape not a constant";
      size_t ro = std::max(x.size(), target.size());
      for (size_t k = 0; k < ro; ++k) {
        int64_t xd = k + x.size() >= ro ? x[k + x.size() - ro] : 1;
        int64_t td = k + target.size() >= ro ? target[k + target.size() - ro] : 1;
        if (td < 0) return "shape has a negative dim";
        if (xd != td && xd != 1 && td != 1) return "shapes do not broadcast";
        int64_t od = xd == 1 ? td : xd;
        linear(od, xd == 1 ? 0 : xs[k + x.size() - ro]);
      }
    } else if (op == "Tile") {
      std::vector<int64_t> reps;
      if (!constant_ints(sig, 1, &reps) || static_cast<int64_t>(reps.size()) != r)
        return "repeats not a constant of one entry per dim";
      for (int64_t k = 0; k < r; ++k) {
        int64_t rep = reps[static_cast<size_t>(k)], d = x[static_cast<size_t>(k)];
        if (rep < 0) return "negative repeats";
        v.dims.push_back(ViewDim{rep, 0, {}});
        v.dims.push_back(ViewDim{d, xs[static_cast<size_t>(k)], {}});
        out.push_back(rep * d);
      }
    } else if (op == "Pad") {
      std::string mode = n.attr_string("mode", "constant");
      if (mode != "constant" && mode != "reflect" && mode != "edge" && !(mode == "wrap" && n.opset >= 19))
        return "mode '" + mode + "'";
      std::vector<int64_t> pads, axes;
      bool has_axes = false;
      if (n.opset < 11) {
        pads = n.attr_ints(ops::pads_attr_name(n.opset));
        if (n.attr_float("value", 0.0f) != 0.0f) return "a non-zero value attribute (Pad < 11)";
      } else {
        if (!constant_ints(sig, 1, &pads)) return "pads not a constant";
        if (sig.has_input(2)) {
          if (sig.inputs[2].dtype != p->dtype) return "constant_value differs in dtype";
          p->fill_input = 2;
        }
        if (n.opset >= 18 && sig.has_input(3)) {
          if (!constant_ints(sig, 3, &axes)) return "axes not a constant";
          has_axes = true;
        }
      }
      auto spec = ops::expand_pads(pads, has_axes, axes, r);
      if (!spec.ok()) return spec.status().message();
      for (int64_t k = 0; k < r; ++k) {
        size_t ku = static_cast<size_t>(k);
        auto size = ops::pad_axis_size(x[ku], spec->begin[ku], spec->end[ku], mode);
        if (!size.ok()) return size.status().message();
        if (spec->begin[ku] == 0 && spec->end[ku] == 0) {
          linear(x[ku], xs[ku]);
          continue;
        }
        out.push_back(*size);
        if (*size == 0) {
          v.dims.push_back(ViewDim{0, 0, {}});
          continue;
        }
        auto map = ops::pad_axis_map(x[ku], spec->begin[ku], spec->end[ku], mode);
        if (!map.ok()) return map.status().message();
        ViewDim d;
        d.size = *size;
        for (int64_t i : *map) d.table.push_back(i < 0 ? kFill : i * xs[ku]);
        v.dims.push_back(std::move(d));
      }
    } else if (op == "Gather") {
      if (r == 0) return "gathers from a scalar";
      int64_t axis = n.attr_int("axis", 0);
      if (axis < -r || axis >= r) return "axis out of range";
      if (axis < 0) axis += r;
      const Dims& ind = sig.inputs[1].shape;
      Dims o(x.begin(), x.begin() + axis);
      o.insert(o.end(), ind.begin(), ind.end());
      o.insert(o.end(), x.begin() + axis + 1, x.end());
      p->gather = true;
      p->gather_axis = x[static_cast<size_t>(axis)];
      for (int64_t k = 0; k < r; ++k)
        if (k != axis) (k < axis ? p->gather_outer : p->gather_inner) *= x[static_cast<size_t>(k)];
      p->shapes = {o};
      return "";
    } else if (op == "ChannelShuffle") {
      return plan_shuffle(sig, p);
    } else if (op == "Concat") {
      if (r == 0) return "a scalar";
      int64_t axis = n.attr_int("axis", n.opset < 4 ? 1 : 0);
      if (axis < -r || axis >= r) return "axis out of range";
      if (axis < 0) axis += r;
      Dims o = x;
      o[static_cast<size_t>(axis)] = 0;
      int64_t inner = 1;
      for (int64_t k = axis + 1; k < r; ++k) inner *= x[static_cast<size_t>(k)];
      p->concat_outer = 1;
      for (int64_t k = 0; k < axis; ++k) p->concat_outer *= x[static_cast<size_t>(k)];
      for (size_t i = 0; i < sig.inputs.size(); ++i) {
        if (!sig.has_input(i)) return "a missing input";
        const Dims& s = sig.inputs[i].shape;
        if (s.size() != x.size()) return "inputs differ in rank";
        for (int64_t k = 0; k < r; ++k)
          if (k != axis && s[static_cast<size_t>(k)] != x[static_cast<size_t>(k)]) return "inputs differ off the axis";
        o[static_cast<size_t>(axis)] += s[static_cast<size_t>(axis)];
        p->concat_len.push_back(s[static_cast<size_t>(axis)] * inner);
      }
      p->concat = true;
      p->shapes = {o};
      return "";
    } else {
      return "op " + op;
    }
    v.normalize();
    p->views.push_back(std::move(v));
    p->shapes.push_back(out);
    return "";
  }
};

}  // namespace

const Tactic* movement_kiln() {
  static const MovementKiln t;
  return &t;
}

}  // namespace kiln::backends::cpu

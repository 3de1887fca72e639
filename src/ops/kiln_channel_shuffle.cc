// kiln.ChannelShuffle (opset 1), made by passes/fuse_channel_shuffle.cc from ShuffleNet's channel
// shuffle:
//
//   ChannelShuffle(X_0, ..., X_{n-1}) -> Y_0, ..., Y_{m-1}
//     X = Concat(X_0, ..., X_{n-1}, axis=1), of shape [N, C, d...] (rank >= 2)
//     Y = Reshape(Transpose(Reshape(X, [N, G, C/G, d...]), perm [0, 2, 1, 3, ...]), [N, C, d...])
//     Y_0, ..., Y_{m-1} = Split(Y, axis=1, split)
//   Attributes: groups (G, int >= 1, a divisor of C), split (ints summing to C, one per output;
//   default: one output, Y itself).
//
// So Y's channel c' = j * G + g is X's channel g * (C/G) + j. The fused op copies each channel once,
// from its input straight into its output, where the ONNX ops copy the whole tensor three times (the
// Concat, the Transpose, the Split or Slices).
#include <cstring>

#include "ops/common.h"
#include "ops/movement_geometry.h"
#include "ops/registry.h"

namespace kiln::ops {

Result<std::vector<ShuffleSource>> channel_shuffle_sources(const std::vector<int64_t>& channels, int64_t groups) {
  int64_t c = 0;
  for (int64_t k : channels) {
    if (k < 0) return InvalidArgument("a negative channel count ", k);
    c += k;
  }
  if (groups < 1 || c % groups != 0)
    return InvalidArgument("groups ", groups, " does not divide the ", c, " concatenated channels");
  std::vector<ShuffleSource> at(static_cast<size_t>(c));  // concatenated channel -> (input, its channel)
  int64_t k = 0;
  for (size_t i = 0; i < channels.size(); ++i)
    for (int64_t j = 0; j < channels[i]; ++j) at[static_cast<size_t>(k++)] = ShuffleSource{static_cast<int>(i), j};
  std::vector<ShuffleSource> out(static_cast<size_t>(c));
  const int64_t per = c / groups;
  for (int64_t o = 0; o < c; ++o) out[static_cast<size_t>(o)] = at[static_cast<size_t>(o % groups * per + o / groups)];
  return out;
}

Result<std::vector<int64_t>> channel_shuffle_split(bool has_split, const std::vector<int64_t>& split, size_t outputs,
                                                   int64_t c) {
  std::vector<int64_t> out = has_split ? split : std::vector<int64_t>{c};
  if (out.size() != outputs) return InvalidArgument("split has ", out.size(), " entries for ", outputs, " outputs");
  int64_t sum = 0;
  for (int64_t s : out) {
    if (s < 0) return InvalidArgument("split has a negative entry ", s);
    sum += s;
  }
  if (c >= 0 && sum != c) return InvalidArgument("split sums to ", sum, ", not the ", c, " channels");
  return out;
}

namespace {

// The output channel counts of node n, its error naming the node.
Result<std::vector<int64_t>> shuffle_split(const ir::Node& n, size_t outputs, int64_t c) {
  const bool has = n.attrs.count("split") != 0;
  auto split = channel_shuffle_split(has, has ? n.attr_ints("split") : std::vector<int64_t>{}, outputs, c);
  if (!split.ok()) return InvalidModel(n.where(), split.status().message());
  return split;
}

Status infer_channel_shuffle(InferContext& ctx) {
  const ir::Node& n = ctx.node;
  const int64_t groups = n.attr_int("groups", 0);
  if (groups < 1) return ctx.error(str_cat("groups must be >= 1, got ", groups));
  const ir::TypeInfo& x0 = ctx.input(0);
  std::vector<Dim> dims;
  bool known = x0.shape.rank_known;
  int64_t c = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const ir::TypeInfo& x = ctx.input(i);
    if (x.elem != x0.elem) return ctx.error("inputs differ in dtype");
    if (!x.shape.rank_known || !known) {
      known = false;
      continue;
    }
    if (x.shape.rank() != x0.shape.rank() || x.shape.rank() < 2)
      return ctx.error(str_cat("inputs must share a rank >= 2: ", x0.shape.str(), " and ", x.shape.str()));
    if (!x.shape.dims[1].known()) c = -1;
    if (c >= 0) c += x.shape.dims[1].value;
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> split, shuffle_split(n, ctx.outputs.size(), known ? c : -1));
  if (known && c >= 0 && c % groups != 0)
    return ctx.error(str_cat("groups ", groups, " does not divide the ", c, " channels"));
  for (size_t o = 0; o < split.size(); ++o) {
    if (!known) {
      ctx.set_output(o, ir::TypeInfo::tensor(x0.elem));
      continue;
    }
    SymShape s = x0.shape;
    s.dims[1] = Dim(split[o]);
    ctx.set_output(o, ir::TypeInfo::tensor(x0.elem, std::move(s)));
  }
  return Status::Ok();
}

Status channel_shuffle_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  if (x0.rank() < 2) return ctx.error(str_cat("inputs must have rank >= 2, got ", x0.describe()));
  if (x0.dtype() == DataType::kString) return ctx.unsupported("string tensors");
  std::vector<int64_t> channels;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& x = ctx.input(i);
    bool same = x.dtype() == x0.dtype() && x.rank() == x0.rank();
    for (int64_t k = 0; same && k < x.rank(); ++k) same = k == 1 || x.dim(k) == x0.dim(k);
    if (!same) return ctx.error(str_cat("input ", i, " ", x.describe(), " does not match input 0 ", x0.describe()));
    channels.push_back(x.dim(1));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<ShuffleSource> src,
                        channel_shuffle_sources(channels, ctx.node.attr_int("groups", 0)));
  const int64_t c = static_cast<int64_t>(src.size());
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> split, shuffle_split(ctx.node, ctx.num_outputs(), c));
  int64_t inner = 1;
  for (int64_t k = 2; k < x0.rank(); ++k) inner *= x0.dim(k);
  const size_t row = static_cast<size_t>(inner) * dtype_size(x0.dtype());
  for (size_t o = 0, first = 0; o < split.size(); first += static_cast<size_t>(split[o]), ++o) {
    Dims shape = x0.shape();
    shape[1] = split[o];
    Tensor y(x0.dtype(), shape);
    auto* d = static_cast<uint8_t*>(y.raw());
    for (int64_t b = 0; b < x0.dim(0); ++b)
      for (int64_t j = 0; j < split[o]; ++j) {
        const ShuffleSource& s = src[first + static_cast<size_t>(j)];
        const auto* from = static_cast<const uint8_t*>(ctx.input(static_cast<size_t>(s.input)).raw());
        std::memcpy(d + static_cast<size_t>(b * split[o] + j) * row,
                    from + static_cast<size_t>(b * channels[static_cast<size_t>(s.input)] + s.channel) * row, row);
      }
    ctx.set_output(o, std::move(y));
  }
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("kiln", ChannelShuffle, 1, infer_channel_shuffle, channel_shuffle_kernel, 1, -1);

}  // namespace kiln::ops

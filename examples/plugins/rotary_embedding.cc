// my.domain::RotaryEmbedding: the rotary position embedding of LLaMA-style decoders (Su et al. 2021,
// "RoFormer"; Hugging Face's LlamaRotaryEmbedding + apply_rotary_pos_emb, "rotate half" layout),
// fused into one op that PyTorch exports as a dozen nodes (or a custom op) and ONNX lacks:
//
//   inputs:  X [batch, seq, heads, head_dim] float32, position_ids [batch, seq] int64
//   attrs:   head_dim (int, required, even), base (float, default 10000), max_positions (int, default 2048)
//   output:  Y like X, with each head's halves (x1, x2) rotated by the angle position * base^(-2i/head_dim):
//            y1 = x1 cos - x2 sin,  y2 = x2 cos + x1 sin
//
// Its state is the cos/sin table (max_positions x head_dim/2), computed from the attributes once and
// stored in the engine by serialize_state: a loaded engine reads it back instead of recomputing it
// (kiln_example_rope_counters tells the tests which happened).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "kiln/plugin.h"

namespace {

const kiln_host_api* host;
std::atomic<int> created{0}, deserialized{0};

struct RopeState {
  int64_t head_dim = 0, max_positions = 0;
  float base = 10000.f;
  std::vector<float> cos, sin;  // [max_positions, head_dim / 2]
};

int fail(kiln_error* err, const std::string& msg) {
  host->set_error(err, msg.c_str());
  return KILN_FAIL;
}

int create(const kiln_attrs* attrs, void** state, kiln_error* err) {
  auto s = std::make_unique<RopeState>();
  if (host->attr_int(attrs, "head_dim", &s->head_dim) != 1) return fail(err, "attribute 'head_dim' (int) is required");
  if (s->head_dim <= 0 || s->head_dim % 2 || s->head_dim > 4096)
    return fail(err, "attribute 'head_dim' must be even and in [2, 4096], got " + std::to_string(s->head_dim));
  int64_t max_pos = 2048;
  if (host->attr_int(attrs, "max_positions", &max_pos) < 0)
    return fail(err, "attribute 'max_positions' must be an int");
  if (max_pos <= 0 || max_pos > (int64_t{1} << 20))
    return fail(err, "attribute 'max_positions' must be in [1, 2^20], got " + std::to_string(max_pos));
  s->max_positions = max_pos;
  if (host->attr_float(attrs, "base", &s->base) < 0 || !(s->base > 1.f))
    return fail(err, "attribute 'base' must be a float > 1");
  const int64_t half = s->head_dim / 2;
  s->cos.resize(max_pos * half), s->sin.resize(max_pos * half);
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double inv_freq = std::pow(static_cast<double>(s->base), -2.0 * i / static_cast<double>(s->head_dim));
      double a = static_cast<double>(p) * inv_freq;
      s->cos[p * half + i] = static_cast<float>(std::cos(a));
      s->sin[p * half + i] = static_cast<float>(std::sin(a));
    }
  ++created;
  *state = s.release();
  return KILN_OK;
}

void destroy(void* state) { delete static_cast<RopeState*>(state); }

constexpr char kMagic[4] = {'R', 'O', 'P', '1'};

int serialize(const void* state, kiln_buffer* out, kiln_error* err) {
  const auto* s = static_cast<const RopeState*>(state);
  bool ok = host->buffer_append(out, kMagic, 4) == KILN_OK &&
            host->buffer_append(out, &s->head_dim, sizeof s->head_dim) == KILN_OK &&
            host->buffer_append(out, &s->max_positions, sizeof s->max_positions) == KILN_OK &&
            host->buffer_append(out, &s->base, sizeof s->base) == KILN_OK &&
            host->buffer_append(out, s->cos.data(), s->cos.size() * sizeof(float)) == KILN_OK &&
            host->buffer_append(out, s->sin.data(), s->sin.size() * sizeof(float)) == KILN_OK;
  return ok ? KILN_OK : fail(err, "cannot write the state");
}

int deserialize(const void* data, size_t size, void** state, kiln_error* err) {
  const char* p = static_cast<const char*>(data);
  constexpr size_t kHead = 4 + 2 * sizeof(int64_t) + sizeof(float);
  if (size < kHead || std::memcmp(p, kMagic, 4) != 0) return fail(err, "not a RotaryEmbedding state (ROP1)");
  auto s = std::make_unique<RopeState>();
  std::memcpy(&s->head_dim, p + 4, 8);
  std::memcpy(&s->max_positions, p + 12, 8);
  std::memcpy(&s->base, p + 20, 4);
  if (s->head_dim <= 0 || s->head_dim % 2 || s->head_dim > 4096 || s->max_positions <= 0 ||
      s->max_positions > (int64_t{1} << 20))
    return fail(err, "stored head_dim or max_positions out of range");
  size_t n = static_cast<size_t>(s->max_positions * (s->head_dim / 2));
  if (size != kHead + 2 * n * sizeof(float)) return fail(err, "stored table has the wrong size");
  s->cos.resize(n), s->sin.resize(n);
  std::memcpy(s->cos.data(), p + kHead, n * sizeof(float));
  std::memcpy(s->sin.data(), p + kHead + n * sizeof(float), n * sizeof(float));
  ++deserialized;
  *state = s.release();
  return KILN_OK;
}

int infer(const void* state, kiln_shape_ctx* ctx, kiln_error* err) {
  const auto* s = static_cast<const RopeState*>(state);
  int32_t xt = host->input_dtype(ctx, 0), pt = host->input_dtype(ctx, 1);
  if (xt != KILN_DTYPE_UNDEFINED && xt != KILN_DTYPE_FLOAT) return fail(err, "input X must be float32");
  if (pt != KILN_DTYPE_UNDEFINED && pt != KILN_DTYPE_INT64) return fail(err, "input position_ids must be int64");
  if (host->input_rank(ctx, 0) != 4) return fail(err, "input X must have rank 4 [batch, seq, heads, head_dim]");
  int32_t pr = host->input_rank(ctx, 1);
  if (pr >= 0 && pr != 2) return fail(err, "input position_ids must have rank 2 [batch, seq]");
  int64_t d = host->input_dim(ctx, 0, 3);
  if (d >= 0 && d != s->head_dim)
    return fail(err, "X's last dim is " + std::to_string(d) + "; attribute head_dim is " + std::to_string(s->head_dim));
  for (int a = 0; a < 2 && pr == 2; ++a) {
    int64_t xd = host->input_dim(ctx, 0, a), pd = host->input_dim(ctx, 1, a);
    if (xd >= 0 && pd >= 0 && xd != pd)
      return fail(err, "position_ids dim " + std::to_string(a) + " is " + std::to_string(pd) + "; X's is " +
                           std::to_string(xd));
  }
  host->set_output_type(ctx, 0, KILN_DTYPE_FLOAT, 4);
  for (int a = 0; a < 4; ++a) host->copy_input_dim(ctx, 0, a, 0, a);
  return KILN_OK;
}

int compute(const void* state, const kiln_kernel_io* io, kiln_error* err) {
  const auto* s = static_cast<const RopeState*>(state);
  const kiln_tensor& xt = io->inputs[0];
  const int64_t B = xt.dims[0], S = xt.dims[1], H = xt.dims[2], D = xt.dims[3], half = D / 2;
  const float* x = static_cast<const float*>(xt.data);
  const int64_t* pos = static_cast<const int64_t*>(io->inputs[1].data);
  float* y = static_cast<float*>(io->outputs[0].data);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      int64_t p = pos[b * S + t];
      if (p < 0 || p >= s->max_positions)
        return fail(err, "position_ids[" + std::to_string(b) + "," + std::to_string(t) + "] = " + std::to_string(p) +
                             " is outside [0, max_positions = " + std::to_string(s->max_positions) + ")");
      const float* c = &s->cos[p * half];
      const float* sn = &s->sin[p * half];
      for (int64_t h = 0; h < H; ++h) {
        const float* xv = x + ((b * S + t) * H + h) * D;
        float* yv = y + ((b * S + t) * H + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          float x1 = xv[i], x2 = xv[i + half];
          yv[i] = x1 * c[i] - x2 * sn[i];
          yv[i + half] = x2 * c[i] + x1 * sn[i];
        }
      }
    }
  return KILN_OK;
}

int supports(const void* state, const kiln_shape_ctx* ctx, kiln_error* err) {
  if (host->input_dtype(ctx, 0) != KILN_DTYPE_FLOAT || host->input_dtype(ctx, 1) != KILN_DTYPE_INT64)
    return fail(err, "takes float32 X and int64 position_ids");
  return KILN_OK;
}

const kiln_kernel kRope = {sizeof(kiln_kernel), "rotary_embedding_f32", KILN_DEVICE_CPU, 1, supports, nullptr, compute};
const kiln_kernel* const kKernels[] = {&kRope};
const kiln_custom_op kOp = {sizeof(kiln_custom_op),
                            "my.domain",
                            "RotaryEmbedding",
                            1,
                            0,
                            2,
                            2,
                            create,
                            destroy,
                            serialize,
                            deserialize,
                            infer,
                            1,
                            kKernels};
const kiln_custom_op* const kOps[] = {&kOp};
const kiln_plugin kPlugin = {sizeof(kiln_plugin), KILN_PLUGIN_ABI_VERSION, "kiln_example_rotary", "1.0.0", 1, kOps};

}  // namespace

extern "C" KILN_PLUGIN_EXPORT const kiln_plugin* kiln_plugin_init(const kiln_host_api* h) {
  if (!h || KILN_PLUGIN_ABI_MAJOR_OF(h->abi_version) != KILN_PLUGIN_ABI_MAJOR) return nullptr;
  host = h;
  return &kPlugin;
}

// How many states were made from attributes and read back from an engine (tests).
extern "C" KILN_PLUGIN_EXPORT void kiln_example_rope_counters(int* made, int* read) {
  if (made) *made = created.load();
  if (read) *read = deserialized.load();
}

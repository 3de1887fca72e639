/* my.domain::SquarePlus, a smooth ReLU-like activation kiln does not have (So et al. 2021,
 * "Squareplus: a softplus-like algebraic rectifier"): y = (x + sqrt(x*x + b)) / 2, attribute b >= 0
 * (default 4). Plain C over kiln/plugin.h: no kiln headers or libraries beyond that one file.
 *
 * Two CPU kernels compute the same thing: kiln's auto-tuner times both on each layer's shape and keeps
 * the faster (`kiln inspect` lists both with their times). The state (b) is stored in the engine.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/plugin.h"

#ifndef SQUARE_PLUS_VERSION
#define SQUARE_PLUS_VERSION "1.0.0"
#endif

static const kiln_host_api* host;

typedef struct {
  float b;
} square_plus_state;

static int fail(kiln_error* err, const char* msg) {
  host->set_error(err, msg);
  return KILN_FAIL;
}

static int sp_create(const kiln_attrs* attrs, void** state, kiln_error* err) {
  float b = 4.0f;
  char msg[128];
  if (host->attr_float(attrs, "b", &b) < 0) return fail(err, "attribute 'b' must be a float");
  if (!(b >= 0.0f)) {
    snprintf(msg, sizeof msg, "attribute 'b' must be >= 0, got %g", (double)b);
    return fail(err, msg);
  }
  square_plus_state* s = (square_plus_state*)malloc(sizeof *s);
  if (!s) return fail(err, "out of memory");
  s->b = b;
  *state = s;
  return KILN_OK;
}

static void sp_destroy(void* state) { free(state); }

static const char kMagic[4] = {'S', 'Q', 'P', '1'};

static int sp_serialize(const void* state, kiln_buffer* out, kiln_error* err) {
  const square_plus_state* s = (const square_plus_state*)state;
  if (host->buffer_append(out, kMagic, 4) != KILN_OK || host->buffer_append(out, &s->b, sizeof s->b) != KILN_OK)
    return fail(err, "cannot write the state");
  return KILN_OK;
}

static int sp_deserialize(const void* data, size_t size, void** state, kiln_error* err) {
  if (size != 4 + sizeof(float) || memcmp(data, kMagic, 4) != 0) return fail(err, "not a SquarePlus state (SQP1)");
  square_plus_state* s = (square_plus_state*)malloc(sizeof *s);
  if (!s) return fail(err, "out of memory");
  memcpy(&s->b, (const char*)data + 4, sizeof s->b);
  *state = s;
  return KILN_OK;
}

static int sp_infer(const void* state, kiln_shape_ctx* ctx, kiln_error* err) {
  int32_t dt = host->input_dtype(ctx, 0);
  if (dt != KILN_DTYPE_UNDEFINED && dt != KILN_DTYPE_FLOAT) return fail(err, "input X must be float32");
  if (host->input_rank(ctx, 0) < 0) return fail(err, "input X needs a known rank");
  if (dt == KILN_DTYPE_UNDEFINED) {
    /* dtype not known yet: float32 is the only one the kernels take */
    int32_t r = host->input_rank(ctx, 0);
    host->set_output_type(ctx, 0, KILN_DTYPE_FLOAT, r);
    for (int32_t a = 0; a < r; ++a) host->copy_input_dim(ctx, 0, a, 0, a);
    return KILN_OK;
  }
  return host->copy_input_type(ctx, 0, 0) == KILN_OK ? KILN_OK : fail(err, "cannot set the output type");
}

static int sp_supports(const void* state, const kiln_shape_ctx* ctx, kiln_error* err) {
  return host->input_dtype(ctx, 0) == KILN_DTYPE_FLOAT ? KILN_OK : fail(err, "takes float32 only");
}

static size_t numel(const kiln_tensor* t) {
  size_t n = 1;
  for (int32_t i = 0; i < t->rank; ++i) n *= (size_t)t->dims[i];
  return n;
}

/* (x + s) / 2 with s = sqrt(x*x + b), written for x < 0 as b / (2 (s - x)) (the same value, since
 * (s + x)(s - x) = b): x + s would cancel to 0 for large negative x. */
static float square_plus(float x, float s, float b) { return x >= 0.0f ? 0.5f * (x + s) : 0.5f * b / (s - x); }

/* One element at a time. */
static int sp_scalar(const void* state, const kiln_kernel_io* io, kiln_error* err) {
  const float b = ((const square_plus_state*)state)->b;
  const float* x = (const float*)io->inputs[0].data;
  float* y = (float*)io->outputs[0].data;
  size_t n = numel(&io->inputs[0]);
  for (size_t i = 0; i < n; ++i) y[i] = square_plus(x[i], sqrtf(x[i] * x[i] + b), b);
  return KILN_OK;
}

/* Blocks of 256 through the workspace: x*x + b for the block first (vectorizes), then the square
 * roots and the result (the same operations per element as the scalar kernel). */
enum { kBlock = 256 };
static size_t sp_blocked_workspace(const void* state, const kiln_shape_ctx* ctx, int32_t threads) {
  return kBlock * sizeof(float);
}
static int sp_blocked(const void* state, const kiln_kernel_io* io, kiln_error* err) {
  const float b = ((const square_plus_state*)state)->b;
  const float* x = (const float*)io->inputs[0].data;
  float* y = (float*)io->outputs[0].data;
  float* t = (float*)io->workspace;
  if (!t || io->workspace_bytes < kBlock * sizeof(float)) return fail(err, "workspace missing");
  size_t n = numel(&io->inputs[0]);
  for (size_t start = 0; start < n; start += kBlock) {
    size_t m = n - start < kBlock ? n - start : kBlock;
    const float* xs = x + start;
    for (size_t i = 0; i < m; ++i) t[i] = xs[i] * xs[i] + b;
    for (size_t i = 0; i < m; ++i) y[start + i] = square_plus(xs[i], sqrtf(t[i]), b);
  }
  return KILN_OK;
}

static const kiln_kernel kScalar = {
    sizeof(kiln_kernel), "square_plus_f32_scalar", KILN_DEVICE_CPU, 1, sp_supports, NULL, sp_scalar};
static const kiln_kernel kBlocked = {sizeof(kiln_kernel), "square_plus_f32_blocked", KILN_DEVICE_CPU, 1,
                                     sp_supports,         sp_blocked_workspace,      sp_blocked};
static const kiln_kernel* const kKernels[] = {&kScalar, &kBlocked};

static const kiln_custom_op kSquarePlus = {
    sizeof(kiln_custom_op), "my.domain",    "SquarePlus", 1, 0,       1, 1, sp_create, sp_destroy,
    sp_serialize,           sp_deserialize, sp_infer,     2, kKernels};
static const kiln_custom_op* const kOps[] = {&kSquarePlus};

static const kiln_plugin kPlugin = {
    sizeof(kiln_plugin), KILN_PLUGIN_ABI_VERSION, "kiln_example_activation", SQUARE_PLUS_VERSION, 1, kOps};

KILN_PLUGIN_EXPORT const kiln_plugin* kiln_plugin_init(const kiln_host_api* h) {
  if (!h || KILN_PLUGIN_ABI_MAJOR_OF(h->abi_version) != KILN_PLUGIN_ABI_MAJOR) return NULL;
  host = h;
  return &kPlugin;
}

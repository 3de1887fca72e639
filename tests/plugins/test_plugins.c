/* Plugins that are wrong on purpose (and one from the future), one per PLUGIN_VARIANT_* define: kiln
 * must refuse each with a message naming the fault, never crash (tests/unit/plugin/plugin_test.cc).
 *   no_init        exports no kiln_plugin_init
 *   abi_major      built for plugin ABI 2.0
 *   small          a kiln_plugin struct_size below ABI 1.0's
 *   null_infer     an op without infer
 *   null_compute   a kernel without compute
 *   failing        a kernel that reports failure on every call
 *   future         ABI 1.9 with fields kiln does not know (loads: they are ignored)
 */
#include <string.h>

#include "kiln/plugin.h"

static const kiln_host_api* host;

static int identity_infer(const void* state, kiln_shape_ctx* ctx, kiln_error* err) {
  if (host->copy_input_type(ctx, 0, 0) != KILN_OK) {
    host->set_error(err, "cannot copy the input type");
    return KILN_FAIL;
  }
  return KILN_OK;
}

static int identity_compute(const void* state, const kiln_kernel_io* io, kiln_error* err) {
  memcpy(io->outputs[0].data, io->inputs[0].data, io->inputs[0].nbytes);
  return KILN_OK;
}

static int failing_compute(const void* state, const kiln_kernel_io* io, kiln_error* err) {
  host->set_error(err, "the widget overflowed");
  return KILN_FAIL;
}

#if defined(PLUGIN_VARIANT_failing)
#define NAME "test_failing"
#define OP "AlwaysFails"
#define COMPUTE failing_compute
#elif defined(PLUGIN_VARIANT_null_compute)
#define NAME "test_null_compute"
#define OP "NullCompute"
#define COMPUTE NULL
#else
#define NAME "test_" VARIANT_NAME
#define OP "Identity_" VARIANT_NAME
#define COMPUTE identity_compute
#endif

#if defined(PLUGIN_VARIANT_null_infer)
#define INFER NULL
#else
#define INFER identity_infer
#endif

#if defined(PLUGIN_VARIANT_future)
/* What a plugin built against a later 1.x kiln hands over: longer structs (their struct_size says so). */
typedef struct {
  kiln_kernel base;
  void* later_field;
  int64_t later_flags;
} future_kernel;
typedef struct {
  kiln_custom_op base;
  const char* later_doc;
} future_op;
typedef struct {
  kiln_plugin base;
  const char* later_license;
  int64_t later_caps;
} future_plugin;
static const future_kernel kKernel = {
    {sizeof(future_kernel), "copy", KILN_DEVICE_CPU, 1, NULL, NULL, identity_compute}, (void*)0x1, 7};
static const kiln_kernel* const kKernels[] = {&kKernel.base};
static const future_op kOp = {
    {sizeof(future_op), "test.domain", OP, 1, 0, 1, 1, NULL, NULL, NULL, NULL, INFER, 1, kKernels}, "doc"};
static const kiln_custom_op* const kOps[] = {&kOp.base};
static const future_plugin kPlugin = {
    {sizeof(future_plugin), (KILN_PLUGIN_ABI_MAJOR << 16) | 9, NAME, "1.4.0", 1, kOps}, "MIT", 3};
#define PLUGIN (&kPlugin.base)
#else
static const kiln_kernel kKernel = {sizeof(kiln_kernel), "copy", KILN_DEVICE_CPU, 1, NULL, NULL, COMPUTE};
static const kiln_kernel* const kKernels[] = {&kKernel};
static const kiln_custom_op kOp = {
    sizeof(kiln_custom_op), "test.domain", OP, 1, 0, 1, 1, NULL, NULL, NULL, NULL, INFER, 1, kKernels};
static const kiln_custom_op* const kOps[] = {&kOp};
#if defined(PLUGIN_VARIANT_abi_major)
#define ABI (2u << 16)
#else
#define ABI KILN_PLUGIN_ABI_VERSION
#endif
#if defined(PLUGIN_VARIANT_small)
#define SIZE 12
#else
#define SIZE sizeof(kiln_plugin)
#endif
static const kiln_plugin kPlugin = {SIZE, ABI, NAME, "1.0.0", 1, kOps};
#define PLUGIN (&kPlugin)
#endif

#if !defined(PLUGIN_VARIANT_no_init)
KILN_PLUGIN_EXPORT const kiln_plugin* kiln_plugin_init(const kiln_host_api* h) {
  host = h;
  return PLUGIN;
}
#else
KILN_PLUGIN_EXPORT int not_a_kiln_plugin(void) { return 0; }
#endif

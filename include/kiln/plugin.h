/* kiln custom-op plugins: a stable C ABI.
 *
 * A plugin is a shared library exporting one function,
 *
 *   KILN_PLUGIN_EXPORT const kiln_plugin* kiln_plugin_init(const kiln_host_api* host);
 *
 * that returns a description of its ops (kiln_plugin): for each custom op its domain, op type and
 * opset range, how it parses its attributes into a state (through the host's accessors, never kiln's
 * C++ types), its shape and type inference, its kernels and, optionally, how its state is stored in
 * an engine. Each kernel becomes a tactic of kiln's registry named "<plugin>.<kernel>": the auto-tuner
 * times the kernels that accept a layer against each other like built-in tactics, and `kiln inspect`
 * shows the candidates and the winner. The reference interpreter (kiln compare, kiln conformance, and
 * layers no tactic takes) runs the op with its first CPU kernel that accepts the inputs.
 *
 * Loading: `kiln <command> --plugin libmyops.so` (repeatable), KILN_PLUGIN_PATH (colon-separated .so
 * files or directories of them, loaded on first use), or kiln::load_plugin(path) (include/kiln/custom_op.h;
 * the Python module's kiln.load_plugin). An engine records the name and version of every plugin its
 * layers use (`kiln inspect`: build.plugins); loading it without that plugin, or with a different
 * major version, fails naming the plugin and how to load it. Examples: examples/plugins/.
 *
 * Compatibility. Every struct that crosses the boundary starts with its size in bytes, and the plugin
 * and host structs also carry KILN_PLUGIN_ABI_VERSION (major << 16 | minor). Within one major version
 * kiln only appends fields: a plugin built against an older minor version (smaller structs) loads, the
 * fields it lacks reading as zero (NULL callbacks: not provided); a plugin built against a newer minor
 * version loads too, kiln ignoring the fields it does not know. A plugin must likewise check
 * host->struct_size before using a host function added after the minor version it needs (see
 * KILN_HOST_HAS). A different major version is refused at load with both versions in the message.
 *
 * Errors: callbacks return KILN_OK (0) or KILN_FAIL; on failure they describe it with
 * host->set_error(err, "message"), which kiln reports with the plugin, op, node and kernel names.
 * Callbacks must not throw C++ exceptions (kiln catches those it can, as failures) and must be
 * thread-safe: contexts of one engine run kernels concurrently on one const state.
 */
#ifndef KILN_PLUGIN_H_
#define KILN_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_PLUGIN_ABI_MAJOR 1
#define KILN_PLUGIN_ABI_MINOR 1
#define KILN_PLUGIN_ABI_VERSION ((KILN_PLUGIN_ABI_MAJOR << 16) | KILN_PLUGIN_ABI_MINOR)
#define KILN_PLUGIN_ABI_MAJOR_OF(v) ((uint32_t)(v) >> 16)
#define KILN_PLUGIN_ABI_MINOR_OF(v) ((uint32_t)(v)&0xFFFFu)

/* The symbol kiln looks up in a plugin. */
#define KILN_PLUGIN_INIT_SYMBOL "kiln_plugin_init"
#if defined(_WIN32)
#define KILN_PLUGIN_EXPORT __declspec(dllexport)
#else
#define KILN_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

enum { KILN_OK = 0, KILN_FAIL = 1 };

/* Where a kernel runs. CUDA kernels are accepted and recorded (device field); kiln runs them once its
 * CUDA plugin path lands (io->stream is then the layer's cudaStream_t). */
enum { KILN_DEVICE_CPU = 0, KILN_DEVICE_CUDA = 1 };

/* Element types: ONNX's TensorProto.DataType codes. */
enum {
  KILN_DTYPE_UNDEFINED = 0,
  KILN_DTYPE_FLOAT = 1,
  KILN_DTYPE_UINT8 = 2,
  KILN_DTYPE_INT8 = 3,
  KILN_DTYPE_INT32 = 6,
  KILN_DTYPE_INT64 = 7,
  KILN_DTYPE_BOOL = 9,
  KILN_DTYPE_FLOAT16 = 10,
  KILN_DTYPE_DOUBLE = 11,
  KILN_DTYPE_BFLOAT16 = 16
};

/* Opaque handles, valid only during the callback that receives them. */
typedef struct kiln_error kiln_error;         /* where a failing callback puts its message */
typedef struct kiln_attrs kiln_attrs;         /* a node's attributes */
typedef struct kiln_shape_ctx kiln_shape_ctx; /* the types of a node's inputs (and, in infer, its outputs) */
typedef struct kiln_buffer kiln_buffer;       /* bytes a state serializes into */

/* A tensor of a kernel call, or a constant input in a shape context. Data is dense, row-major. */
typedef struct kiln_tensor {
  int32_t dtype; /* KILN_DTYPE_*; KILN_DTYPE_UNDEFINED for an absent optional input */
  int32_t rank;
  const int64_t* dims;
  void* data; /* inputs: read only */
  size_t nbytes;
} kiln_tensor;

/* One call of a kernel. */
typedef struct kiln_kernel_io {
  uint32_t struct_size;
  int32_t num_inputs;
  const kiln_tensor* inputs;
  int32_t num_outputs;
  kiln_tensor* outputs; /* allocated by kiln with the shapes infer gave for these inputs */
  void* workspace;      /* at least workspace_size() bytes, 64-byte aligned, contents undefined */
  size_t workspace_bytes;
  int32_t threads;      /* the run's thread budget */
  int32_t device_index; /* CUDA kernels: the device */
  void* stream;         /* CUDA kernels: the cudaStream_t; NULL on the CPU */
} kiln_kernel_io;

/* What kiln offers a plugin; passed to kiln_plugin_init (keep the pointer: it lives as long as the process). */
typedef struct kiln_host_api {
  uint32_t struct_size;
  uint32_t abi_version;
  const char* kiln_version;
  void (*set_error)(kiln_error* err, const char* message);
  void (*warn)(const char* message); /* "kiln: warning: ..." on stderr (or the builder's warning sink) */

  /* Attributes (create_state). Each returns 1 when found with that type, 0 when absent, -1 when the
   * attribute has another type. Pointers stay valid until create_state returns. */
  const char* (*node_name)(const kiln_attrs* attrs);
  int (*attr_int)(const kiln_attrs* attrs, const char* name, int64_t* value);
  int (*attr_float)(const kiln_attrs* attrs, const char* name, float* value);
  int (*attr_string)(const kiln_attrs* attrs, const char* name, const char** data, size_t* size);
  int (*attr_ints)(const kiln_attrs* attrs, const char* name, const int64_t** values, size_t* count);
  int (*attr_floats)(const kiln_attrs* attrs, const char* name, const float** values, size_t* count);

  /* Shapes (infer, supports, workspace_size). Input dtype KILN_DTYPE_UNDEFINED: absent or unknown;
   * rank -1: unknown; dim -1: unknown (at build time a dim may be symbolic: copy_input_dim keeps its
   * symbol). input_constant: the input's value when known at build time (weights), else NULL. */
  int32_t (*num_inputs)(const kiln_shape_ctx* ctx);
  int32_t (*num_outputs)(const kiln_shape_ctx* ctx);
  int32_t (*input_dtype)(const kiln_shape_ctx* ctx, int32_t input);
  int32_t (*input_rank)(const kiln_shape_ctx* ctx, int32_t input);
  int64_t (*input_dim)(const kiln_shape_ctx* ctx, int32_t input, int32_t axis);
  const kiln_tensor* (*input_constant)(const kiln_shape_ctx* ctx, int32_t input);
  /* infer only (KILN_FAIL elsewhere or out of range): an output's dtype and rank (dims unknown until
   * set), a dim, a dim copied from an input's (symbol included), or the whole type of an input. */
  int (*set_output_type)(kiln_shape_ctx* ctx, int32_t output, int32_t dtype, int32_t rank);
  int (*set_output_dim)(kiln_shape_ctx* ctx, int32_t output, int32_t axis, int64_t value);
  int (*copy_input_dim)(kiln_shape_ctx* ctx, int32_t output, int32_t axis, int32_t input, int32_t input_axis);
  int (*copy_input_type)(kiln_shape_ctx* ctx, int32_t output, int32_t input);

  /* serialize_state: appends bytes to the state's record in the engine. */
  int (*buffer_append)(kiln_buffer* buffer, const void* data, size_t size);

  /* ABI 1.1 (check KILN_HOST_HAS(host, attr_strings) first): the node's attributes by index, for
   * plugins that take any attribute (Python's @kiln.custom_op) or reject unknown ones. attr_name: the
   * index-th name in sorted order, NULL past the end (kiln's own "kiln.*" attributes are not listed); attr_type: ONNX's
   * AttributeProto.AttributeType (1 FLOAT, 2 INT, 3 STRING, 4 TENSOR, 5 GRAPH, 6 FLOATS, 7 INTS, 8 STRINGS, ...), 0
   * when absent; attr_strings: a STRINGS attribute's count and its index-th string (when index < count). */
  int32_t (*num_attrs)(const kiln_attrs* attrs);
  const char* (*attr_name)(const kiln_attrs* attrs, int32_t index);
  int32_t (*attr_type)(const kiln_attrs* attrs, const char* name);
  int (*attr_strings)(const kiln_attrs* attrs, const char* name, size_t index, const char** data, size_t* size,
                      size_t* count);
} kiln_host_api;

/* Whether the host offers `field` (a plugin built against a newer minor version than the host). */
#define KILN_HOST_HAS(host, field) \
  ((host)->struct_size >= offsetof(kiln_host_api, field) + sizeof(((kiln_host_api*)0)->field))

/* One kernel of an op: becomes the tactic "<plugin>.<name>". */
typedef struct kiln_kernel {
  uint32_t struct_size;
  const char* name; /* unique within the plugin: [A-Za-z0-9_]+ */
  int32_t device;   /* KILN_DEVICE_CPU or KILN_DEVICE_CUDA */
  int32_t revision; /* bump when its speed or what it accepts changes: timing-cache entries of another revision are
                       retimed */
  /* Optional: KILN_OK when it takes these inputs (dims may be -1 at build time), else KILN_FAIL and why. */
  int (*supports)(const void* state, const kiln_shape_ctx* shapes, kiln_error* err);
  /* Optional: scratch bytes for these (concrete) input shapes at `threads` threads. */
  size_t (*workspace_size)(const void* state, const kiln_shape_ctx* shapes, int32_t threads);
  /* Required: computes the outputs. */
  int (*compute)(const void* state, const kiln_kernel_io* io, kiln_error* err);
} kiln_kernel;

/* One custom op. */
typedef struct kiln_custom_op {
  uint32_t struct_size;
  const char* domain;  /* e.g. "my.domain"; "" is ONNX's (kiln refuses to shadow its own ops) */
  const char* op_type; /* e.g. "SquarePlus" */
  int32_t since_opset; /* the first opset (of the op's domain) it implements, >= 1 */
  int32_t until_opset; /* the last, or 0: no upper bound */
  int32_t min_inputs;  /* arity checked before kernels run */
  int32_t max_inputs;  /* -1: unbounded */
  /* Optional: parses the node's attributes into a state (NULL: stateless, state is NULL). Called when
   * a model is imported and built, and per prepared layer; an error names the node. */
  int (*create_state)(const kiln_attrs* attrs, void** state, kiln_error* err);
  void (*destroy_state)(void* state); /* optional */
  /* Optional pair: the state as bytes, stored in the engine at build time and read back at load
   * instead of create_state (for states costly to make: tables, packed weights). */
  int (*serialize_state)(const void* state, kiln_buffer* out, kiln_error* err);
  int (*deserialize_state)(const void* data, size_t size, void** state, kiln_error* err);
  /* Required: the outputs' dtypes and shapes from the inputs'. Called at import with symbolic dims and
   * before every kernel call with concrete ones (kiln allocates the outputs from it). */
  int (*infer)(const void* state, kiln_shape_ctx* shapes, kiln_error* err);
  int32_t num_kernels; /* at least one, and at least one CPU kernel */
  const kiln_kernel* const* kernels;
} kiln_custom_op;

/* What kiln_plugin_init returns (static storage: kiln keeps pointers into it). */
typedef struct kiln_plugin {
  uint32_t struct_size;
  uint32_t abi_version; /* KILN_PLUGIN_ABI_VERSION as the plugin was compiled */
  const char* name;     /* unique among loaded plugins: [A-Za-z0-9_.-]+ */
  const char* version;  /* "MAJOR.MINOR.PATCH": engines record it; another MAJOR refuses to load them */
  int32_t num_ops;
  const kiln_custom_op* const* ops;
} kiln_plugin;

typedef const kiln_plugin* (*kiln_plugin_init_fn)(const kiln_host_api* host);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_PLUGIN_H_ */

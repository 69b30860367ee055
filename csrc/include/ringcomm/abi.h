/* ringcomm's codes and C ABI, written once.
 *
 * The single copy of: the dtype codes (with element size, name, kind and DLPack type code), the
 * reduce-op codes with the rule saying which op reduces which dtype, the reduce ops the torch front
 * offers, the collective codes, the array description the synchronous entries take (RcArray, with
 * its dimension limit) and the C ABI (RcFastApi) through which another extension module reaches
 * them. Its readers:
 *   - the C++ core (csrc/common/dtype.h, csrc/comm/coll.h generate their enums from the lists);
 *   - the bindings (ringcomm._C) and the synchronous entries (csrc/comm/sync_entry.h);
 *   - the torch c10d trampoline (bindings/torch/trampoline.cpp), compiled just in time against
 *     torch; the build copies this file into the package (ringcomm/_data/include) and its bytes
 *     are part of that extension's name, so a changed header builds a new one;
 *   - ringcomm.core.tables, which parses the package's copy's X-macro lists when it is imported.
 * The codes are part of the wire header (ranks compare them), so they are never renumbered.
 *
 * Plain C (it compiles as C and as C++), no includes but <stddef.h> and <stdint.h>. The lists are
 * X-macros: each entry is one line X(...) whose arguments are literals or the RC_KIND_* / RC_DL_*
 * names defined here, so that a reader without a C preprocessor (ringcomm.core.tables) can parse them.
 */
#ifndef RC_ABI_H_
#define RC_ABI_H_

#include <stddef.h>
#include <stdint.h>

/* Element kinds: a dtype has one; an op names the kinds it reduces. */
#define RC_KIND_FLOAT 1
#define RC_KIND_INT 2
#define RC_KIND_BOOL 4

/* DLPack's type codes (DLDataTypeCode in dlpack.h); a dtype is (code, bits = 8 * bytes). */
#define RC_DL_INT 0
#define RC_DL_UINT 1
#define RC_DL_FLOAT 2
#define RC_DL_BFLOAT 4
#define RC_DL_BOOL 6

/* The dtypes: X(enumerator without k, code, element bytes, name, kind, DLPack type code).
 * Codes are 0..RC_DTYPE_COUNT-1 in list order. */
#define RC_DTYPES(X)                                            \
  X(Float32, 0, 4, "float32", RC_KIND_FLOAT, RC_DL_FLOAT)      \
  X(Float64, 1, 8, "float64", RC_KIND_FLOAT, RC_DL_FLOAT)      \
  X(Float16, 2, 2, "float16", RC_KIND_FLOAT, RC_DL_FLOAT)      \
  X(BFloat16, 3, 2, "bfloat16", RC_KIND_FLOAT, RC_DL_BFLOAT)   \
  X(Int8, 4, 1, "int8", RC_KIND_INT, RC_DL_INT)                \
  X(UInt8, 5, 1, "uint8", RC_KIND_INT, RC_DL_UINT)             \
  X(Int32, 6, 4, "int32", RC_KIND_INT, RC_DL_INT)              \
  X(Int64, 7, 8, "int64", RC_KIND_INT, RC_DL_INT)              \
  X(Bool, 8, 1, "bool", RC_KIND_BOOL, RC_DL_BOOL)

/* The reduce ops: X(enumerator without k, code, name, the kinds of dtype it reduces). This is
 * the op-support rule: bool takes MIN/MAX only, AVG the floating dtypes, the bitwise ops the
 * integer ones. The CPU and CUDA kernels' dtype x op switches implement exactly these pairs
 * (tests/test_tables.py compares them). Codes are 0..RC_REDUCE_OP_COUNT-1 in list order. */
#define RC_REDUCE_OPS(X)                                                  \
  X(Sum, 0, "SUM", RC_KIND_FLOAT | RC_KIND_INT)                           \
  X(Product, 1, "PRODUCT", RC_KIND_FLOAT | RC_KIND_INT)                   \
  X(Min, 2, "MIN", RC_KIND_FLOAT | RC_KIND_INT | RC_KIND_BOOL)            \
  X(Max, 3, "MAX", RC_KIND_FLOAT | RC_KIND_INT | RC_KIND_BOOL)            \
  X(Avg, 4, "AVG", RC_KIND_FLOAT)                                         \
  X(Band, 5, "BAND", RC_KIND_INT)                                         \
  X(Bor, 6, "BOR", RC_KIND_INT)                                           \
  X(Bxor, 7, "BXOR", RC_KIND_INT)

/* The collectives (the validation header's `coll` word): X(enumerator without k, code, name,
 * reduces: 1 when its header carries a reduce op). */
#define RC_COLLECTIVES(X)                     \
  X(AllReduce, 1, "all_reduce", 1)            \
  X(ReduceScatter, 2, "reduce_scatter", 1)    \
  X(AllGather, 3, "all_gather", 0)            \
  X(Broadcast, 4, "broadcast", 0)             \
  X(Reduce, 5, "reduce", 1)                   \
  X(Barrier, 6, "barrier", 0)                 \
  X(AllToAll, 7, "all_to_all", 0)             \
  X(Gather, 8, "gather", 0)                   \
  X(Scatter, 9, "scatter", 0)

/* The reduce ops the torch front (bindings/torch/trampoline.cpp) offers to the synchronous
 * entries, by their names in both lists: X(name), torch.distributed's ReduceOp of that name, whose
 * meaning is the entry's op of that name on every dtype. AVG is not one: torch averages an integer
 * tensor (a sum, then a truncating division), which the entry's AVG does not reduce; the torch
 * backend's Python half composes it, and PREMUL_SUM. ringcomm.torch.all_reduce_ and
 * torch.ops.ringcomm.all_reduce_ take exactly these ops (their names in lower case). */
#define RC_TORCH_OPS(X) \
  X(SUM)                \
  X(PRODUCT)            \
  X(MIN)                \
  X(MAX)                \
  X(BAND)               \
  X(BOR)                \
  X(BXOR)

#define RC_ABI_COUNT_(...) +1
enum { RC_DTYPE_COUNT = 0 RC_DTYPES(RC_ABI_COUNT_), RC_REDUCE_OP_COUNT = 0 RC_REDUCE_OPS(RC_ABI_COUNT_) };
#undef RC_ABI_COUNT_

/* The codes by name for C callers: RcDTypeFloat32, ..., RcOpSum, ... (C++ has rc::DType and
 * rc::ReduceOp, csrc/common/dtype.h). */
#define RC_ABI_DTYPE_ENUM_(name, code, ...) RcDType##name = code,
#define RC_ABI_OP_ENUM_(name, code, ...) RcOp##name = code,
enum RcDTypeCode { RC_DTYPES(RC_ABI_DTYPE_ENUM_) };
enum RcReduceOpCode { RC_REDUCE_OPS(RC_ABI_OP_ENUM_) };
#undef RC_ABI_DTYPE_ENUM_
#undef RC_ABI_OP_ENUM_

/* Element bytes of dtype code `dtype`; 0 for a code outside the table. */
static inline int32_t rc_dtype_size(int32_t dtype) {
#define RC_ABI_SIZE_(name, code, bytes, ...) if (dtype == (code)) return bytes;
  RC_DTYPES(RC_ABI_SIZE_)
#undef RC_ABI_SIZE_
  return 0;
}

/* RC_KIND_* of dtype code `dtype`; 0 for a code outside the table. */
static inline int32_t rc_dtype_kind(int32_t dtype) {
#define RC_ABI_KIND_(name, code, bytes, str, kind, dl) if (dtype == (code)) return kind;
  RC_DTYPES(RC_ABI_KIND_)
#undef RC_ABI_KIND_
  return 0;
}

/* The RC_KIND_* mask of the dtypes op code `op` reduces; 0 for a code outside the table. */
static inline int32_t rc_op_kinds(int32_t op) {
#define RC_ABI_OP_KINDS_(name, code, str, kinds) if (op == (code)) return kinds;
  RC_REDUCE_OPS(RC_ABI_OP_KINDS_)
#undef RC_ABI_OP_KINDS_
  return 0;
}

/* The op-support rule: 1 when op code `op` reduces dtype code `dtype` (both in their tables). */
static inline int rc_op_supported(int32_t dtype, int32_t op) {
  return (rc_op_kinds(op) & rc_dtype_kind(dtype)) != 0;
}

/* The dtype code of DLPack type (code, bits) with one lane; -1 when ringcomm has none. */
static inline int32_t rc_dtype_of_dl(int32_t dl_code, int32_t bits) {
#define RC_ABI_DL_(name, code, bytes, str, kind, dl) \
  if (dl_code == (dl) && bits == 8 * (bytes)) return code;
  RC_DTYPES(RC_ABI_DL_)
#undef RC_ABI_DL_
  return -1;
}

/* DLPack's device type of host memory (kDLCPU); an RcArray on any other device (a DLPack device
 * type, or 0 where the describer has none) is not taken. */
#define RC_DEVICE_CPU 1

/* The most dimensions an array description has: a describer copies the strides into a buffer of
 * this many and does not describe a deeper array (the caller then goes the general way). */
#define RC_ARRAY_MAX_DIMS 16

/* RcArray.flags: the memory may be written (a collective's result may land in it). */
#define RC_ARRAY_WRITABLE 1

/* One array as a synchronous entry sees it (csrc/comm/sync_entry.h decides whether it takes
 * it). The describer fills it from the array's own fields and keeps the array alive during the
 * call; `shape` and `strides` point at `ndim` values each (they may be the array's own). */
typedef struct RcArray {
  void* data;             /* the first element; may be null when an extent is 0 */
  const int64_t* shape;   /* extents */
  const int64_t* strides; /* in bytes; null: compact row-major */
  int32_t ndim;
  int32_t dtype;          /* a code of RC_DTYPES, or -1: an element type ringcomm has no code for */
  int32_t device_type;    /* DLPack device type: RC_DEVICE_CPU for host memory */
  int32_t flags;          /* RC_ARRAY_* */
} RcArray;

/* What an RcFastApi call returns besides 1 + an error code: the call completed, or the entry
 * did not take its arguments and did nothing (the caller goes the general way, which explains
 * the refusal). */
#define RC_CALL_DONE 0
#define RC_CALL_DECLINED (-1)

/* The C ABI through which another extension module (the torch c10d trampoline) runs a host
 * communicator's synchronous entries without Python in between. Plain C types only: the two
 * modules share no C++ type. The receiver checks `version` and `size` before it uses a field.
 * Each call is callable from any thread without the GIL; it returns RC_CALL_DONE,
 * RC_CALL_DECLINED, or 1 + the ErrorCode (csrc/common/errors.h) with the message (NUL-terminated,
 * truncated to msg_len - 1 bytes) in msg. */
typedef struct RcFastApi {
  uint32_t version; /* RC_FAST_API_VERSION */
  uint32_t size;    /* sizeof(RcFastApi) */
  /* Drops one handle (a reference to a communicator, from Communicator._fast_handle()). */
  void (*release)(void* handle);
  /* rc::sync_all_reduce: `in` reduced with op code `op` into `out` (null: in place). */
  int (*all_reduce)(void* handle, const RcArray* in, const RcArray* out, int32_t op, char* msg,
                    size_t msg_len);
  /* rc::sync_broadcast: `buf` from rank `root`. */
  int (*broadcast)(void* handle, const RcArray* buf, int32_t root, char* msg, size_t msg_len);
  /* rc::sync_reduce: `in` reduced with op code `op` onto rank `root` (into `out` there; null: in
   * place). */
  int (*reduce)(void* handle, const RcArray* in, const RcArray* out, int32_t op, int32_t root, char* msg,
                size_t msg_len);
  /* rc::sync_all_to_all: `in` into `out`, both cut into world-size even blocks. */
  int (*all_to_all)(void* handle, const RcArray* in, const RcArray* out, char* msg, size_t msg_len);
  /* rc::sync_all_to_all with split sizes: `in` into `out`, block j of `in` `send_counts[j]`
   * elements, block i of `out` `recv_counts[i]` (`n` counts each). */
  int (*all_to_all_v)(void* handle, const RcArray* in, const RcArray* out, const int64_t* send_counts,
                      const int64_t* recv_counts, int32_t n, char* msg, size_t msg_len);
  /* rc::sync_gather: every rank's `in` into `out` on rank `root` (null elsewhere). */
  int (*gather)(void* handle, const RcArray* in, const RcArray* out, int32_t root, char* msg, size_t msg_len);
  /* rc::sync_scatter: the root's `in` (null elsewhere), block i into rank i's `out`. */
  int (*scatter)(void* handle, const RcArray* in, const RcArray* out, int32_t root, char* msg, size_t msg_len);
  /* rc::sync_barrier. */
  int (*barrier)(void* handle, char* msg, size_t msg_len);
} RcFastApi;

#define RC_FAST_API_VERSION 5u

#endif /* RC_ABI_H_ */

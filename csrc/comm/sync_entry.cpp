#include "comm/sync_entry.h"

#include <vector>

#include "algo/ring_schedule.h"
#include "comm/core.h"
#include "common/dtype.h"

namespace rc {

namespace {

constexpr Launch kSync{false, nullptr};

// THE eligibility rule of the synchronous entries, for one array: host memory, a dtype code of
// the table, compact row-major strides (an extent of 1 may carry any stride; an empty array is
// compact), writable when the result lands in it. Sets *count to the element count.
bool takes(const RcArray& a, bool written, int64_t* count) {
  if (a.device_type != RC_DEVICE_CPU || a.ndim < 0) return false;
  const int64_t esize = rc_dtype_size(a.dtype);  // 0: not a code of the table
  if (esize == 0 || (written && !(a.flags & RC_ARRAY_WRITABLE))) return false;
  int64_t n = 1;
  for (int32_t i = 0; i < a.ndim; ++i) {
    if (a.shape[i] < 0) return false;
    n *= a.shape[i];
  }
  if (n != 0) {
    if (a.data == nullptr) return false;
    if (a.strides != nullptr) {
      int64_t expect = esize;
      for (int32_t i = a.ndim - 1; i >= 0; --i) {
        if (a.shape[i] != 1 && a.strides[i] != expect) return false;
        expect *= a.shape[i];
      }
    }
  }
  *count = n;
  return true;
}

}  // namespace

bool sync_all_reduce(CommCore& c, const RcArray& in, const RcArray* out, int32_t op) {
  int64_t n = 0, n_out = 0;
  if (!takes(in, out == nullptr, &n) || !rc_op_supported(in.dtype, op)) return false;
  if (out != nullptr && (!takes(*out, true, &n_out) || out->dtype != in.dtype || n_out != n)) return false;
  void* dst = out != nullptr ? out->data : in.data;
  c.all_reduce(in.data, dst, n, static_cast<DType>(in.dtype), static_cast<ReduceOp>(op), kSync);
  return true;
}

bool sync_broadcast(CommCore& c, const RcArray& buf, int32_t root) {
  int64_t n = 0;
  if (!takes(buf, true, &n) || root < 0 || root >= c.world()) return false;
  c.broadcast(buf.data, n, static_cast<DType>(buf.dtype), root, kSync);
  return true;
}

bool sync_reduce_scatter(CommCore& c, const RcArray& in, const RcArray& out, int32_t op) {
  int64_t n = 0, n_out = 0;
  if (!takes(in, false, &n) || !takes(out, true, &n_out) || out.dtype != in.dtype ||
      !rc_op_supported(in.dtype, op) || n_out != ring::chunk_count(n, c.world(), c.rank()))
    return false;
  c.reduce_scatter(in.data, out.data, n, static_cast<DType>(in.dtype), static_cast<ReduceOp>(op), kSync);
  return true;
}

bool sync_all_gather(CommCore& c, const RcArray& in, const RcArray& out) {
  int64_t n = 0, n_out = 0;
  if (!takes(in, false, &n) || !takes(out, true, &n_out) || out.dtype != in.dtype || n_out < n) return false;
  c.all_gather(in.data, out.data, n, n_out, static_cast<DType>(in.dtype), kSync);
  return true;
}

bool sync_reduce(CommCore& c, const RcArray& in, const RcArray* out, int32_t op, int32_t root) {
  if (c.closed()) return false;
  if (root < 0 || root >= c.world()) return false;
  const bool on_root = c.rank() == root;
  int64_t n = 0, n_out = 0;
  if (!takes(in, on_root && out == nullptr, &n) || !rc_op_supported(in.dtype, op)) return false;
  void* dst = nullptr;
  if (on_root) {
    if (out != nullptr && (!takes(*out, true, &n_out) || out->dtype != in.dtype || n_out != n)) return false;
    dst = out != nullptr ? out->data : in.data;
  }
  c.reduce(in.data, dst, n, static_cast<DType>(in.dtype), static_cast<ReduceOp>(op), root, kSync);
  return true;
}

namespace {

// One side's split sizes for `count` elements: `given` (null: an even split, when world divides
// count) when it holds world non-negative sizes summing to count. False otherwise.
bool splits_of(const std::vector<int64_t>* given, int64_t count, int64_t world, std::vector<int64_t>* s) {
  if (given == nullptr) {
    if (count % world != 0) return false;
    s->assign(static_cast<size_t>(world), count / world);
    return true;
  }
  if (static_cast<int64_t>(given->size()) != world) return false;
  int64_t sum = 0;
  for (const int64_t v : *given)
    if (v < 0 || __builtin_add_overflow(sum, v, &sum)) return false;
  if (sum != count) return false;
  *s = *given;
  return true;
}

}  // namespace

bool sync_all_to_all(CommCore& c, const RcArray& in, const RcArray& out, const std::vector<int64_t>* send_counts,
                     const std::vector<int64_t>* recv_counts) {
  if (c.closed()) return false;
  int64_t n = 0, n_out = 0;
  const int64_t w = c.world();
  if (!takes(in, false, &n) || !takes(out, true, &n_out) || out.dtype != in.dtype) return false;
  std::vector<int64_t> sc, rcn;
  if (!splits_of(send_counts, n, w, &sc) || !splits_of(recv_counts, n_out, w, &rcn)) return false;
  const int64_t esize = rc_dtype_size(in.dtype);
  const auto* a = static_cast<const char*>(in.data);
  const auto* b = static_cast<const char*>(out.data);
  if (n != 0 && n_out != 0 && a < b + n_out * esize && b < a + n * esize) return false;
  c.all_to_all(in.data, out.data, std::move(sc), std::move(rcn), static_cast<DType>(in.dtype), kSync);
  return true;
}

bool sync_gather(CommCore& c, const RcArray& in, const RcArray* out, int32_t root) {
  if (c.closed()) return false;
  if (root < 0 || root >= c.world()) return false;
  int64_t n = 0, n_out = 0;
  if (!takes(in, false, &n)) return false;
  void* dst = nullptr;
  if (c.rank() == root) {
    if (out == nullptr || !takes(*out, true, &n_out) || out->dtype != in.dtype || n_out != n * c.world())
      return false;
    dst = out->data;
  }
  c.gather(in.data, dst, n, static_cast<DType>(in.dtype), root, kSync);
  return true;
}

bool sync_scatter(CommCore& c, const RcArray* in, const RcArray& out, int32_t root) {
  if (c.closed()) return false;
  if (root < 0 || root >= c.world()) return false;
  int64_t n = 0, n_in = 0;
  if (!takes(out, true, &n)) return false;
  const void* src = nullptr;
  if (c.rank() == root) {
    if (in == nullptr || !takes(*in, false, &n_in) || in->dtype != out.dtype || n_in != n * c.world()) return false;
    src = in->data;
  }
  c.scatter(src, out.data, n, static_cast<DType>(out.dtype), root, kSync);
  return true;
}

bool sync_barrier(CommCore& c) {
  if (c.closed()) return false;
  c.barrier(kSync);
  return true;
}

}  // namespace rc

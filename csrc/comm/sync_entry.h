// The synchronous entries: ONE function per collective (all_reduce, broadcast, reduce_scatter,
// all_gather, reduce, all_to_all, gather, scatter, barrier) through which every front runs a synchronous call on host memory. numpy arrays
// (bindings/sync_py.cpp, from the array's fields), torch CPU tensors handed to the plain API (the
// same binding, from their DLPack capsule) and the torch c10d trampoline (through RcFastApi,
// ringcomm/abi.h) describe their arrays as RcArray and call these. Each applies the one
// eligibility rule (takes() in sync_entry.cpp) and, when it takes the arguments, runs CommCore's
// collective without async (the caller has released the GIL); otherwise it returns false having
// done nothing, and the caller goes the general way (Python), which raises the typed error that
// explains the refusal. The entries of reduce, all_to_all, gather, scatter and barrier also decline
// on a closed communicator, whose error the general way raises (ClosedError, its own message).
#pragma once
#include <cstdint>
#include <vector>

#include "ringcomm/abi.h"

namespace rc {

class CommCore;

/// A synchronous all_reduce of `in` with op code `op` into `out` (null: in place). Taken when
/// both arrays are host memory of a dtype of the table in compact row-major layout, the result's
/// array is writable, `out` has `in`'s dtype and element count, and `op` reduces that dtype
/// (rc_op_supported). The core then checks the rest (a partial overlap of in and out, the
/// header's agreement across ranks) and throws its typed errors.
bool sync_all_reduce(CommCore& c, const RcArray& in, const RcArray* out, int32_t op);

/// A synchronous broadcast of `buf` from rank `root`. Taken when `buf` is writable host memory
/// of a dtype of the table in compact row-major layout and root is a rank of `c`.
bool sync_broadcast(CommCore& c, const RcArray& buf, int32_t root);

/// A synchronous reduce_scatter of `in` with op code `op`, this rank's chunk into `out`. Taken
/// when both arrays are described as all_reduce's are (`out` writable), of one dtype, `op`
/// reduces it, and `out` holds exactly this rank's chunk of `in` (ring::chunk_count: the first
/// count % world chunks hold one element more).
bool sync_reduce_scatter(CommCore& c, const RcArray& in, const RcArray& out, int32_t op);

/// A synchronous all_gather of every rank's `in` into `out` (rank order). Taken when both arrays
/// are described as all_reduce's are (`out` writable), of one dtype, and `out` holds at least
/// `in`'s elements; the core checks the counts against every rank's once the headers are in.
bool sync_all_gather(CommCore& c, const RcArray& in, const RcArray& out);

/// A synchronous reduce of `in` with op code `op` onto rank `root` (into `out` there; null: in
/// place). Taken when root is a rank of `c`, `in` is described as all_reduce's input (writable
/// on the root when `out` is null) and `op` reduces its dtype; on the root, a non-null `out` as
/// all_reduce's. Other ranks never read `out`.
bool sync_reduce(CommCore& c, const RcArray& in, const RcArray* out, int32_t op, int32_t root);

/// A synchronous all_to_all: block j of `in` to rank j, block i of `out` from rank i, the blocks'
/// sizes (elements) `send_counts` and `recv_counts` (null: an even split into world() blocks).
/// Taken when both arrays are described as all_gather's are, of one dtype, each side's sizes are
/// world() non-negative counts summing to its array's count (an even split: world() divides it),
/// and the two arrays do not overlap (an overlapping input is copied first, which the general way
/// does). The core checks the blocks against every rank's.
bool sync_all_to_all(CommCore& c, const RcArray& in, const RcArray& out,
                     const std::vector<int64_t>* send_counts = nullptr,
                     const std::vector<int64_t>* recv_counts = nullptr);

/// A synchronous gather of every rank's `in` into `out` on rank `root` (rank order). Taken when
/// root is a rank of `c`, `in` is described as all_gather's input and, on the root, `out` is
/// non-null, writable, of `in`'s dtype and world() times its count. Other ranks never read `out`.
bool sync_gather(CommCore& c, const RcArray& in, const RcArray* out, int32_t root);

/// A synchronous scatter of the root's `in`, block i into rank i's `out`. Taken when root is a
/// rank of `c`, `out` is writable and described as all_gather's output and, on the root, `in` is
/// non-null, of `out`'s dtype and world() times its count. Other ranks never read `in`.
bool sync_scatter(CommCore& c, const RcArray* in, const RcArray& out, int32_t root);

/// A synchronous barrier. Taken unless the communicator is closed.
bool sync_barrier(CommCore& c);

}  // namespace rc

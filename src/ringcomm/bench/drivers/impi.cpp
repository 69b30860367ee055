// The Intel MPI peer of ringcomm's bench: MPI collectives behind the driver C ABI (driver.h),
// in processes started by an MPI launcher. Compiled against an MPICH-ABI mpi.h (Intel MPI's, or
// MPICH's: the MPI standard datatypes and ops have the same handles in both) and linked against
// no libmpi: the bench loads Intel MPI's library by its path, with global symbols, before this one.
// Waiting is Intel MPI's own, chosen by its environment (I_MPI_WAIT_MODE, I_MPI_SPIN_COUNT, ...).
#include "driver.h"

#include <cmath>

#include <mpi.h>

namespace {

using MpiCall = rcd::Call<MPI_Datatype, MPI_Op>;
std::vector<MpiCall> g_calls;
std::string g_version;
int g_rank = 0;

bool parse_dtype(const char* name, MPI_Datatype* dt) {
    static const std::pair<const char*, MPI_Datatype> table[] = {
        {"int8", MPI_INT8_T},   {"uint8", MPI_UINT8_T}, {"int32", MPI_INT32_T},
        {"int64", MPI_INT64_T}, {"float32", MPI_FLOAT}, {"float64", MPI_DOUBLE},
#ifdef I_MPI_VERSION
        {"float16", MPIX_C_FLOAT16}, {"bfloat16", MPIX_C_BF16},
#endif
    };
    return rcd::lookup(table, name, dt);
}

bool parse_redop(const char* name, MPI_Op* r) {
    static const std::pair<const char*, MPI_Op> table[] = {
        {"sum", MPI_SUM}, {"prod", MPI_PROD}, {"min", MPI_MIN}, {"max", MPI_MAX}};
    return rcd::lookup(table, name, r);
}

const rcd::Library<MPI_Datatype, MPI_Op> kMpi{parse_dtype, parse_redop,
                                              "unsupported: no MPI datatype for ",
                                              "unsupported: MPI has no ", MPI_SUM};

int mpi_fail(int err, const char* what) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, text, &len);
    int cls = 0;
    MPI_Error_class(err, &cls);
    bool declined = cls == MPI_ERR_TYPE || cls == MPI_ERR_OP;
    return rcd::fail(std::string(declined ? "unsupported: " : "") + what + ": " +
                     std::string(text, static_cast<size_t>(len)));
}

int run(const MpiCall& c, int world) {
    int n = static_cast<int>(c.count), per_rank = static_cast<int>(c.count / world);
    bool ip = c.in == c.out;
    switch (c.op) {
        case rcd::Op::all_reduce:
            return MPI_Allreduce(ip ? MPI_IN_PLACE : c.in, c.out, n, c.dtype, c.redop,
                                 MPI_COMM_WORLD);
        case rcd::Op::reduce_scatter:
            return MPI_Reduce_scatter_block(c.in, c.out, per_rank, c.dtype, c.redop,
                                            MPI_COMM_WORLD);
        case rcd::Op::all_gather:
            return MPI_Allgather(c.in, per_rank, c.dtype, c.out, per_rank, c.dtype,
                                 MPI_COMM_WORLD);
        case rcd::Op::broadcast:
            return MPI_Bcast(c.in, n, c.dtype, c.root, MPI_COMM_WORLD);
        case rcd::Op::reduce:
            // In place on the root only (MPI_IN_PLACE is the root's send buffer).
            return MPI_Reduce(ip && g_rank == c.root ? MPI_IN_PLACE : c.in, c.out, n, c.dtype,
                              c.redop, c.root, MPI_COMM_WORLD);
        case rcd::Op::all_to_all:
            return MPI_Alltoall(c.in, per_rank, c.dtype, c.out, per_rank, c.dtype, MPI_COMM_WORLD);
    }
    return MPI_ERR_OTHER;
}

int g_world = 0;

}  // namespace

extern "C" {

const char* rcd_error() { return rcd::error().c_str(); }

const char* rcd_version() {
    if (g_version.empty()) {
        char text[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(text, &len);
        g_version.assign(text, static_cast<size_t>(len));
        auto eol = g_version.find('\n');
        if (eol != std::string::npos) g_version.resize(eol);
    }
    return g_version.c_str();
}

int rcd_init(int rank, int world, const char*) {
    int inited = 0, err = MPI_Initialized(&inited);
    if (!inited && (err = MPI_Init(nullptr, nullptr)) != MPI_SUCCESS) return mpi_fail(err, "MPI_Init");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int r = -1, n = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (r != rank || n != world)
        return rcd::fail("MPI's world is rank " + std::to_string(r) + " of " + std::to_string(n) +
                         ", expected " + std::to_string(rank) + " of " + std::to_string(world));
    g_rank = r;
    g_world = n;
    return 0;
}

const char* rcd_check(const char* op, const char* dtype, const char* redop) {
    return rcd::check_answer(rcd::check(kMpi, op, dtype, redop));
}

long rcd_prepare(const char* op, const char* dtype, const char* redop, void* in, void* out,
                 size_t count, int root) {
    if (count > static_cast<size_t>(2147483647))
        return rcd::fail("unsupported: MPI counts are int; " + std::to_string(count) + " elements");
    return rcd::prepare(kMpi, g_calls, op, dtype, redop, in, out, count, root);
}

int rcd_run(long h) {
    int err = run(g_calls[static_cast<size_t>(h)], g_world);
    return err == MPI_SUCCESS ? 0 : mpi_fail(err, "collective");
}

int rcd_barrier() {
    int err = MPI_Barrier(MPI_COMM_WORLD);
    return err == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Barrier");
}

double rcd_max(double x) {
    double out = 0.0;
    int err = MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (err != MPI_SUCCESS) {
        mpi_fail(err, "MPI_Allreduce");
        return std::nan("");
    }
    return out;
}

int rcd_finalize() {
    g_calls.clear();
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return 0;
    int err = MPI_Finalize();
    return err == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Finalize");
}

}  // extern "C"

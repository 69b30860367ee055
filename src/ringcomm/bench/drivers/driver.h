// The C ABI every bench driver exports (oneccl.cpp, impi.cpp), loaded with ctypes by
// ringcomm/bench/drivers/runner.py into each bench rank. Collectives, dtypes and reduce ops are
// named by the bench's own strings (ringcomm.bench.spec), so no table of codes is restated here.
//
// Every function returns 0 (or a handle >= 0) on success and -1 on failure, with the reason in
// rcd_error(); a reason that starts with "unsupported" is the library declining the case.
#pragma once
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace rcd {

enum class Op { all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all };

inline bool parse_op(const char* name, Op* op) {
    static const char* names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                  "broadcast", "reduce", "all_to_all"};
    for (int i = 0; i < 6; ++i)
        if (std::strcmp(name, names[i]) == 0) { *op = static_cast<Op>(i); return true; }
    return false;
}

inline bool reducing(Op op) {
    return op == Op::all_reduce || op == Op::reduce_scatter || op == Op::reduce;
}

// One prepared call: `count` is the full tensor's elements (the bench's convention); the
// chunked collectives move count / world per rank.
template <class DType, class RedOp>
struct Call {
    Op op;
    void* in;
    void* out;
    size_t count;
    DType dtype;
    RedOp redop;
    int root;
};

inline std::string& error() {
    static std::string e;
    return e;
}

inline int fail(const std::string& why) {
    error() = why;
    return -1;
}

// rcd_check's answer from a driver's own check: nullptr when it runs the call, else the reason,
// kept until the next answer.
inline const char* check_answer(std::string why) {
    static std::string kept;
    kept = std::move(why);
    return kept.empty() ? nullptr : kept.c_str();
}

}  // namespace rcd

#define RCD_GUARD(body)                                               \
    try {                                                             \
        body                                                          \
    } catch (const std::exception& e) {                               \
        return rcd::fail(e.what());                                   \
    } catch (...) {                                                   \
        return rcd::fail("unknown C++ exception");                    \
    }

extern "C" {
const char* rcd_error();
const char* rcd_version();
// Starts the library and joins the world; `rendezvous` names a file the ranks meet through
// (libraries that find their world themselves, as MPI under its launcher, ignore it).
int rcd_init(int rank, int world, const char* rendezvous);
// The reason the library cannot run (op, dtype, redop), or NULL when it can.
const char* rcd_check(const char* op, const char* dtype, const char* redop);
long rcd_prepare(const char* op, const char* dtype, const char* redop, void* in, void* out,
                 size_t count, int root);
int rcd_run(long handle);
int rcd_barrier();
// The max over ranks of x (through the library itself); NaN on failure.
double rcd_max(double x);
int rcd_finalize();
}

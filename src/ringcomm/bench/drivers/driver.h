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

// A name's value in a table of (name, value) pairs; false when the table has no such name.
template <class T, size_t N>
bool lookup(const std::pair<const char*, T> (&table)[N], const char* name, T* out) {
    for (const auto& [n, v] : table)
        if (std::strcmp(name, n) == 0) { *out = v; return true; }
    return false;
}

// What a driver tells the shared checks about its library: how it names the bench's dtypes and
// reduce ops (false: it has none by that name), and the words its refusals begin with.
template <class DType, class RedOp>
struct Library {
    bool (*dtype)(const char* name, DType* out);
    bool (*redop)(const char* name, RedOp* out);
    const char* no_dtype;   // followed by the dtype's name
    const char* no_redop;   // followed by the reduce op's name and " reduction"
    RedOp redop_unused;     // what a call that does not reduce carries
};

// Why the library cannot run (op, dtype, redop); empty when it can.
template <class DType, class RedOp>
std::string check(const Library<DType, RedOp>& lib, const char* op_name, const char* dtype,
                  const char* redop) {
    Op op;
    DType dt;
    RedOp r;
    if (!parse_op(op_name, &op)) return std::string("unsupported collective ") + op_name;
    if (!lib.dtype(dtype, &dt)) return std::string(lib.no_dtype) + dtype;
    if (reducing(op) && !lib.redop(redop, &r)) return std::string(lib.no_redop) + redop + " reduction";
    return "";
}

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

// rcd_prepare's work: the call checked and kept in `calls`; its handle, or -1 with the reason.
template <class DType, class RedOp>
long prepare(const Library<DType, RedOp>& lib, std::vector<Call<DType, RedOp>>& calls,
             const char* op_name, const char* dtype, const char* redop, void* in, void* out,
             size_t count, int root) {
    std::string why = check(lib, op_name, dtype, redop);
    if (!why.empty()) return fail(why);
    Call<DType, RedOp> c{};
    parse_op(op_name, &c.op);
    lib.dtype(dtype, &c.dtype);
    c.redop = lib.redop_unused;
    if (reducing(c.op)) lib.redop(redop, &c.redop);
    c.in = in;
    c.out = out;
    c.count = count;
    c.root = root;
    calls.push_back(c);
    return static_cast<long>(calls.size() - 1);
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

// The oneCCL peer of ringcomm's bench: oneCCL's host collectives behind the driver C ABI
// (driver.h). The ranks meet through oneCCL's key-value store: rank 0 creates the main store and
// writes its address to the rendezvous file (written whole, then renamed into place, so a reader
// never sees a partial address); the others read it and join. Transport and waiting are oneCCL's
// own, chosen by its environment variables (CCL_ATL_TRANSPORT, CCL_WORKER_COUNT, CCL_YIELD,
// CCL_SPIN_COUNT, ...), which the bench sets before rcd_init.
#include "driver.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include <oneapi/ccl.hpp>

namespace {

using CclCall = rcd::Call<ccl::datatype, ccl::reduction>;
std::unique_ptr<ccl::communicator> g_comm;
std::shared_ptr<ccl::kvs> g_kvs;
std::vector<CclCall> g_calls;
std::string g_version;
int g_world = 0;

bool parse_dtype(const char* name, ccl::datatype* dt) {
    static const std::pair<const char*, ccl::datatype> table[] = {
        {"int8", ccl::datatype::int8},       {"uint8", ccl::datatype::uint8},
        {"int32", ccl::datatype::int32},     {"int64", ccl::datatype::int64},
        {"float16", ccl::datatype::float16}, {"float32", ccl::datatype::float32},
        {"float64", ccl::datatype::float64}, {"bfloat16", ccl::datatype::bfloat16}};
    return rcd::lookup(table, name, dt);
}

bool parse_redop(const char* name, ccl::reduction* r) {
    static const std::pair<const char*, ccl::reduction> table[] = {
        {"sum", ccl::reduction::sum}, {"prod", ccl::reduction::prod},
        {"min", ccl::reduction::min}, {"max", ccl::reduction::max}};
    return rcd::lookup(table, name, r);
}

const rcd::Library<ccl::datatype, ccl::reduction> kCcl{
    parse_dtype, parse_redop, "unsupported: oneCCL has no ",
    "unsupported: oneCCL's host collectives have no ", ccl::reduction::sum};

ccl::kvs::address_type rendezvous(int rank, const std::string& path) {
    ccl::kvs::address_type addr{};
    if (rank == 0) {
        g_kvs = ccl::create_main_kvs();
        addr = g_kvs->get_address();
        std::string tmp = path + ".tmp";
        {
            std::ofstream f(tmp, std::ios::binary);
            f.write(addr.data(), addr.size());
        }
        if (std::rename(tmp.c_str(), path.c_str()) != 0)
            throw std::runtime_error("cannot rename " + tmp + " to " + path);
        return addr;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (;;) {
        std::ifstream f(path, std::ios::binary);
        if (f && f.read(addr.data(), addr.size())) break;
        if (std::chrono::steady_clock::now() > deadline)
            throw std::runtime_error("rank 0 did not publish oneCCL's store address in " + path +
                                     " within 120 s");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    g_kvs = ccl::create_kvs(addr);
    return addr;
}

void run(const CclCall& c) {
    const auto& comm = *g_comm;
    size_t per_rank = c.count / g_world;
    switch (c.op) {
        case rcd::Op::all_reduce:
            ccl::allreduce(c.in, c.out, c.count, c.dtype, c.redop, comm).wait();
            break;
        case rcd::Op::reduce_scatter:
            ccl::reduce_scatter(c.in, c.out, per_rank, c.dtype, c.redop, comm).wait();
            break;
        case rcd::Op::all_gather:
            ccl::allgather(c.in, c.out, per_rank, c.dtype, comm).wait();
            break;
        case rcd::Op::broadcast:
            ccl::broadcast(c.in, c.count, c.dtype, c.root, comm).wait();
            break;
        case rcd::Op::reduce:
            ccl::reduce(c.in, c.out, c.count, c.dtype, c.redop, c.root, comm).wait();
            break;
        case rcd::Op::all_to_all:
            ccl::alltoall(c.in, c.out, per_rank, c.dtype, comm).wait();
            break;
    }
}

}  // namespace

extern "C" {

const char* rcd_error() { return rcd::error().c_str(); }

const char* rcd_version() {
    if (g_version.empty()) {
        auto v = ccl::get_library_version();
        g_version = "oneCCL " + std::to_string(v.major) + "." + std::to_string(v.minor) + "." +
                    std::to_string(v.update) + " " + v.product_status;
    }
    return g_version.c_str();
}

int rcd_init(int rank, int world, const char* rdzv) {
    RCD_GUARD({
        ccl::init();
        rendezvous(rank, rdzv);
        g_comm.reset(new ccl::communicator(ccl::create_communicator(world, rank, g_kvs)));
        if (g_comm->rank() != rank || g_comm->size() != world)
            return rcd::fail("oneCCL's communicator is rank " + std::to_string(g_comm->rank()) +
                             " of " + std::to_string(g_comm->size()) + ", expected " +
                             std::to_string(rank) + " of " + std::to_string(world));
        g_world = world;
        return 0;
    })
}

const char* rcd_check(const char* op, const char* dtype, const char* redop) {
    return rcd::check_answer(rcd::check(kCcl, op, dtype, redop));
}

long rcd_prepare(const char* op, const char* dtype, const char* redop, void* in, void* out,
                 size_t count, int root) {
    return rcd::prepare(kCcl, g_calls, op, dtype, redop, in, out, count, root);
}

int rcd_run(long h) {
    RCD_GUARD({
        run(g_calls[static_cast<size_t>(h)]);
        return 0;
    })
}

int rcd_barrier() {
    RCD_GUARD({
        ccl::barrier(*g_comm).wait();
        return 0;
    })
}

double rcd_max(double x) {
    try {
        double out = 0.0;
        ccl::allreduce(&x, &out, 1, ccl::datatype::float64, ccl::reduction::max, *g_comm).wait();
        return out;
    } catch (const std::exception& e) {
        rcd::fail(e.what());
        return std::nan("");
    }
}

int rcd_finalize() {
    RCD_GUARD({
        g_calls.clear();
        g_comm.reset();
        g_kvs.reset();
        return 0;
    })
}

}  // extern "C"

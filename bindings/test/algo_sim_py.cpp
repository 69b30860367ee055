// ringcomm._C_test.AlgoSim runs the one algorithm layer (csrc/algo/) between processes
// over a shm channel of its own, without a communicator, with either channel style:
//  - "host": the host communicator's options (slots take the source's in-page offset, pieces
//    forwarded straight from their slot);
//  - "cuda": the CUDA channel's options (pieces at their full-buffer offset mod 16, slots 16 bytes
//    shorter, copied out before they are forwarded), so that the code paths the CUDA build takes
//    are run and checked on machines without a GPU.
// Not a user API: no header exchange, every rank must issue the same calls in the same order.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "algo/context.h"
#include "comm/validation.h"
#include "common/errors.h"
#include "transport/shm.h"
#include "transport/shm_channel.h"

namespace py = pybind11;
using rc::DType;
using rc::ReduceOp;

namespace {

inline const char* C(uintptr_t a) { return reinterpret_cast<const char*>(a); }
inline char* W(uintptr_t a) { return reinterpret_cast<char*>(a); }
using GIL = py::call_guard<py::gil_scoped_release>;

rc::ShmChannelOptions style_options(const std::string& style) {
  rc::ShmChannelOptions o;
  if (style == "host") return o;
  RC_CHECK(style == "cuda", InvalidArgument, "AlgoSim: style must be 'host' or 'cuda', got '" << style << "'");
  o.placement = rc::ShmChannelOptions::Placement::kResidue16;
  o.forward_from_slot = false;
  return o;
}

class AlgoSim {
 public:
  AlgoSim(int rank, int world, int64_t slot_bytes, int nslots, double timeout_s, const std::string& style,
          bool streaming)
      : t_(rank, world, make_cfg(world, slot_bytes, nslots, timeout_s)), scratch_(t_.config().slot_bytes),
        ch_(&t_, rc::Lane::kColl, scratch_.data(), style_options(style)), rank_(rank), world_(world) {
    ch_.set_streaming(streaming);
  }
  std::string create() { return t_.create(); }
  void attach(const std::vector<std::string>& names) { t_.attach(names); }
  void close() { t_.close(); }
  int64_t piece_elems(int dt) { return ctx(static_cast<DType>(dt), "piece_elems", false).piece_elems(); }

  void all_reduce(uintptr_t in, uintptr_t out, int64_t count, int dt, int op, bool direct) {
    const rc::AlgoCtx c = ctx(static_cast<DType>(dt), "all_reduce");
    if (direct) rc::direct_all_reduce(c, C(in), W(out), count, static_cast<ReduceOp>(op));
    else rc::ring_all_reduce(c, C(in), W(out), count, static_cast<ReduceOp>(op));
  }
  void reduce_scatter(uintptr_t in, uintptr_t out, int64_t count, int dt, int op) {
    rc::ring_reduce_scatter(ctx(static_cast<DType>(dt), "reduce_scatter"), C(in), W(out), count,
                            static_cast<ReduceOp>(op));
  }
  void all_gather(uintptr_t in, uintptr_t out, std::vector<int64_t> counts, int dt) {
    rc::ring_all_gather(ctx(static_cast<DType>(dt), "all_gather"), C(in), W(out), counts);
  }
  void broadcast(uintptr_t buf, int64_t count, int dt, int root) {
    rc::chain_broadcast(ctx(static_cast<DType>(dt), "broadcast"), W(buf), count, root);
  }
  void reduce(uintptr_t in, uintptr_t out, int64_t count, int dt, int op, int root) {
    rc::chain_reduce(ctx(static_cast<DType>(dt), "reduce"), C(in), W(out), count, static_cast<ReduceOp>(op), root);
  }
  void all_to_all(uintptr_t in, uintptr_t out, std::vector<int64_t> sc, std::vector<int64_t> rcn, int dt) {
    rc::direct_all_to_all(ctx(static_cast<DType>(dt), "all_to_all"), C(in), W(out), sc, rc::split_offsets(sc), rcn,
                          rc::split_offsets(rcn));
  }
  void gather(uintptr_t in, uintptr_t out, int64_t count, int dt, int root) {
    rc::direct_gather(ctx(static_cast<DType>(dt), "gather"), C(in), W(out), count, root);
  }
  void scatter(uintptr_t in, uintptr_t out, int64_t count, int dt, int root) {
    rc::direct_scatter(ctx(static_cast<DType>(dt), "scatter"), C(in), W(out), count, root);
  }

 private:
  static rc::ShmConfig make_cfg(int world, int64_t slot_bytes, int nslots, double timeout_s) {
    rc::ShmConfig c = rc::ShmConfig::from_knobs(rc::Knobs::read(), world, timeout_s);
    RC_CHECK(slot_bytes >= 64 && nslots >= 2, InvalidArgument, "AlgoSim: slot_bytes >= 64 and nslots >= 2");
    c.slot_bytes = static_cast<size_t>((slot_bytes + 63) / 64 * 64);
    c.nslots = static_cast<uint32_t>(nslots);
    return c;
  }
  rc::AlgoCtx ctx(DType dt, const char* op, bool next = true) {
    rc::AlgoCtx c;
    c.ch = &ch_;
    c.rank = rank_;
    c.world = world_;
    c.seq = next ? ++seq_ : seq_;
    c.op = op;
    c.dtype = dt;
    c.esize = rc::dtype_size(dt);
    c.scratch = scratch_.data();
    return c;
  }
  rc::ShmTransport t_;
  std::vector<char> scratch_;
  rc::ShmChannel ch_;
  int rank_, world_;
  uint64_t seq_ = 0;
};

}  // namespace

void bind_test_algo_sim(py::module_& m) {
  py::class_<AlgoSim>(m, "AlgoSim")
      .def(py::init<int, int, int64_t, int, double, const std::string&, bool>(), py::arg("rank"),
           py::arg("world_size"), py::arg("slot_bytes"), py::arg("nslots"), py::arg("timeout") = 60.0,
           py::arg("style") = "host", py::arg("streaming") = false)
      .def("create", &AlgoSim::create, GIL())
      .def("attach", &AlgoSim::attach, GIL())
      .def("close", &AlgoSim::close, GIL())
      .def("piece_elems", &AlgoSim::piece_elems)
      .def("all_reduce", &AlgoSim::all_reduce, py::arg("input"), py::arg("output"), py::arg("count"),
           py::arg("dtype"), py::arg("op"), py::arg("direct") = false, GIL())
      .def("reduce_scatter", &AlgoSim::reduce_scatter, GIL())
      .def("all_gather", &AlgoSim::all_gather, GIL())
      .def("broadcast", &AlgoSim::broadcast, GIL())
      .def("reduce", &AlgoSim::reduce, GIL())
      .def("all_to_all", &AlgoSim::all_to_all, GIL())
      .def("gather", &AlgoSim::gather, GIL())
      .def("scatter", &AlgoSim::scatter, GIL());
}

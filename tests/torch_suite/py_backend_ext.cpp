// PyBackend: a c10d::Backend that a Python class can subclass (torch 2.13 binds Backend without a
// constructor or trampoline, so a Python subclass of torch._C._distributed_c10d.Backend cannot be
// created). The trampoline forwards each virtual to the Python override of the same name, with
// torch's own Python names and argument order (the ones ProcessGroupGloo exposes); a method the
// subclass does not define falls back to c10d::Backend's, which raises "not supported".
// Lifetime: torch holds the backend through intrusive_ptr from C++ only; the Python object must
// be kept alive by its creator (the trampoline looks the override up on it).
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace {

// The override is looked up with PyBackend's own type info: torch registered c10d::Backend from
// its own library, and typeid(c10d::Backend) taken here need not match it, so pybind11's
// PYBIND11_OVERRIDE (which looks up the base class) would never find the Python method.
#define PY_BACKEND_OVERRIDE(ret, name, base_call, ...)                                    \
  do {                                                                                     \
    pybind11::gil_scoped_acquire gil;                                                      \
    pybind11::function override =                                                          \
        pybind11::get_override(static_cast<const PyBackend*>(this), name);                 \
    if (override) {                                                                        \
      return override(__VA_ARGS__).template cast<ret>();                                   \
    }                                                                                      \
  } while (0);                                                                             \
  return base_call

class PyBackend : public c10d::Backend {
 public:
  PyBackend(int rank, int size) : c10d::Backend(rank, size) {}

  const std::string getBackendName() const override {
    PY_BACKEND_OVERRIDE(std::string, "getBackendName", c10d::Backend::getBackendName());
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    PY_BACKEND_OVERRIDE(c10::intrusive_ptr<c10d::Work>, "allreduce",
                        c10d::Backend::allreduce(tensors, opts), tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    PY_BACKEND_OVERRIDE(c10::intrusive_ptr<c10d::Work>, "barrier", c10d::Backend::barrier(opts),
                        opts);
  }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch.distributed");
  py::class_<PyBackend, c10d::Backend, c10::intrusive_ptr<PyBackend>>(m, "PyBackend")
      .def(py::init<int, int>(), py::arg("rank"), py::arg("size"));
}

// Each C++ error class maps to one Python class defined in ringcomm/errors.py.
#include <pybind11/pybind11.h>

#include "common/errors.h"

namespace py = pybind11;

void bind_errors(py::module_& m) {
  (void)m;
  py::module_ errors = py::module_::import("ringcomm.errors");
  // Keep the classes alive for the translator (module-lifetime references).
  static py::object base = errors.attr("RingcommError");
  static py::object timeout = errors.attr("TimeoutError");
  static py::object peer = errors.attr("PeerFailureError");
  static py::object mismatch = errors.attr("MismatchError");
  static py::object invalid = errors.attr("InvalidArgumentError");
  static py::object unsupported = errors.attr("UnsupportedError");
  static py::object closed = errors.attr("ClosedError");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const rc::TimeoutError& e) {
      PyErr_SetString(timeout.ptr(), e.what());
    } catch (const rc::PeerFailure& e) {
      PyErr_SetString(peer.ptr(), e.what());
    } catch (const rc::Mismatch& e) {
      PyErr_SetString(mismatch.ptr(), e.what());
    } catch (const rc::InvalidArgument& e) {
      PyErr_SetString(invalid.ptr(), e.what());
    } catch (const rc::Unsupported& e) {
      PyErr_SetString(unsupported.ptr(), e.what());
    } catch (const rc::Closed& e) {
      PyErr_SetString(closed.ptr(), e.what());
    } catch (const rc::Error& e) {
      PyErr_SetString(base.ptr(), e.what());
    }
  });
}

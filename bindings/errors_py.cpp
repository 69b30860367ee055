// Each C++ error class maps to one Python class defined in ringcomm/errors.py. Compiled into
// both extension modules (ringcomm._C registers the translator globally, ringcomm._C_cuda
// module-locally), so the mapping exists once.
#include "errors_py.h"

#include "common/errors.h"

namespace py = pybind11;

namespace {

struct ErrorClasses {
  py::object base, timeout, peer, mismatch, invalid, unsupported, closed;
};

// Module-lifetime references (never destroyed: the interpreter owns the classes).
ErrorClasses* classes() {
  static ErrorClasses* c = [] {
    py::module_ errors = py::module_::import("ringcomm.errors");
    return new ErrorClasses{errors.attr("RingcommError"),    errors.attr("TimeoutError"),
                            errors.attr("PeerFailureError"), errors.attr("MismatchError"),
                            errors.attr("InvalidArgumentError"), errors.attr("UnsupportedError"),
                            errors.attr("ClosedError")};
  }();
  return c;
}

void translate(std::exception_ptr p) {
  ErrorClasses* c = classes();
  try {
    if (p) std::rethrow_exception(p);
  } catch (const rc::TimeoutError& e) {
    PyErr_SetString(c->timeout.ptr(), e.what());
  } catch (const rc::PeerFailure& e) {
    PyErr_SetString(c->peer.ptr(), e.what());
  } catch (const rc::Mismatch& e) {
    PyErr_SetString(c->mismatch.ptr(), e.what());
  } catch (const rc::InvalidArgument& e) {
    PyErr_SetString(c->invalid.ptr(), e.what());
  } catch (const rc::Unsupported& e) {
    PyErr_SetString(c->unsupported.ptr(), e.what());
  } catch (const rc::Closed& e) {
    PyErr_SetString(c->closed.ptr(), e.what());
  } catch (const rc::Error& e) {
    PyErr_SetString(c->base.ptr(), e.what());
  }
}

}  // namespace

void register_error_translator(bool module_local) {
  classes();  // import ringcomm.errors now, while the module initialises
  if (module_local) {
    py::register_local_exception_translator(translate);
  } else {
    py::register_exception_translator(translate);
  }
}

void bind_errors(py::module_& m) {
  (void)m;
  register_error_translator(false);
}

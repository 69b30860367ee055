// The knob registry and the log level for Python: _C.knobs() (the table), _C.knob(name) (the
// current value parsed with the knob's rule), _C.refresh_log_level().
#include <pybind11/pybind11.h>

#include "common/knobs.h"
#include "common/log.h"

namespace py = pybind11;

namespace {

py::object parsed(const rc::KnobInfo& k) {
  switch (k.type) {
    case rc::KnobType::kInt:
    case rc::KnobType::kBytes:
      if (!rc::knob_is_set(k.name) && *k.default_value == '\0') return py::none();
      return py::int_(rc::knob_int(k.name));
    case rc::KnobType::kFloat:
      if (!rc::knob_is_set(k.name) && *k.default_value == '\0') return py::none();
      return py::float_(rc::knob_double(k.name));
    case rc::KnobType::kStr:
    case rc::KnobType::kChoice:
      return py::str(rc::knob_str(k.name));
  }
  return py::none();
}

}  // namespace

void bind_config(py::module_& m) {
  m.def("knobs", [] {
    py::list out;
    for (const auto& k : rc::knob_table()) {
      py::dict d;
      d["name"] = k.name;
      d["type"] = rc::knob_type_name(k.type);
      d["default"] = k.default_value;
      py::list choices;
      if (*k.choices) {
        std::string c = k.choices, cur;
        for (char ch : c + "|") {
          if (ch == '|') {
            choices.append(cur);
            cur.clear();
          } else {
            cur += ch;
          }
        }
      }
      d["choices"] = choices;
      d["doc"] = k.doc;
      d["build"] = k.build;
      out.append(d);
    }
    return out;
  }, "The knob registry: a list of {name, type, default, choices, doc, build}.");
  m.def("knob", [](const std::string& name) { return parsed(rc::knob_info(name)); }, py::arg("name"),
        "The knob's current value parsed with its rule (int, float or str; None for an unset knob "
        "without a default). Raises InvalidArgumentError for a malformed value, RingcommError for an "
        "unregistered name.");
  m.def("knob_is_set", [](const std::string& name) { return rc::knob_is_set(name); }, py::arg("name"));
  m.def("refresh_log_level", [] { return static_cast<int>(rc::refresh_log_level()); },
        "Read RINGCOMM_DEBUG and cache it for the C++ logger; returns 0 WARN, 1 INFO, 2 TRACE.");
}

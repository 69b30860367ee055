// The knob registry and the log level for Python: _C.knobs() (the table), _C.Knobs (the typed
// struct: one read-only attribute per runtime knob, documented by the registry's doc) and
// _C.read_knobs() (the environment parsed now), _C.knob(name) (one knob by name, the user-facing
// lookup), _C.set_log_level(level).
#include <pybind11/pybind11.h>

#include "common/errors.h"
#include "common/knobs.h"
#include "common/log.h"

namespace py = pybind11;

namespace {

template <typename T>
py::object parsed_as(const rc::KnobInfo& k) {
  T v{};
  const bool set = rc::parse_knob(k, &v);
  if (!set && *k.default_value == '\0') return py::none();  // unset, and no default to parse
  return py::cast(v);
}

py::object parsed(const rc::KnobInfo& k) {
  switch (k.type) {
    case rc::KnobType::kInt:
    case rc::KnobType::kBytes: return parsed_as<int64_t>(k);
    case rc::KnobType::kFloat: return parsed_as<double>(k);
    case rc::KnobType::kStr:
    case rc::KnobType::kChoice: {
      std::string v;
      rc::parse_knob(k, &v);
      return py::str(v);
    }
  }
  return py::none();
}

}  // namespace

void bind_config(py::module_& m, bool module_local) {
  m.def("knobs", [] {
    py::list out;
    for (const auto& k : rc::knob_table()) {
      py::dict d;
      d["name"] = k.name;
      d["field"] = k.field;
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
  }, "The knob registry: a list of {name, field, type, default, choices, doc, build}.");

  py::class_<rc::Knobs> knobs(m, "Knobs",
                              "Every runtime knob, typed and parsed once (csrc/common/knobs.def): one "
                              "read-only attribute per knob, named by its field (RINGCOMM_SLOT_BYTES: "
                              "slot_bytes). Made by ringcomm.core.config.read().",
                              py::module_local(module_local));
#define RC_KNOB(NAME, field, kind, def, choices, doc) knobs.def_readonly(#field, &rc::Knobs::field, #NAME ": " doc);
#define RC_BUILD_KNOB(NAME, field, kind, def, choices, doc)
#include "common/knobs.def"
#undef RC_KNOB
#undef RC_BUILD_KNOB
  knobs.def("is_set", [](const rc::Knobs& k, const std::string& field) {
    for (size_t i = 0; i < rc::knob_table().size(); ++i)
      if (field == rc::knob_table()[i].field && !rc::knob_table()[i].build) return k.is_set(static_cast<rc::KnobId>(i));
    throw rc::Error("ringcomm: '" + field + "' is not a runtime knob's field (csrc/common/knobs.def)");
  }, py::arg("field"), "True when the environment set this knob (to a non-empty value) when it was read.");
  knobs.def("__repr__", [](py::object self) {
    std::string out = "Knobs(";
    const char* sep = "";
#define RC_KNOB(NAME, field, kind, def, choices, doc) \
    out += sep + std::string(#field "=") + py::repr(self.attr(#field)).cast<std::string>(); \
    sep = ", ";
#define RC_BUILD_KNOB(NAME, field, kind, def, choices, doc)
#include "common/knobs.def"
#undef RC_KNOB
#undef RC_BUILD_KNOB
    return out + ")";
  });
  m.def("read_knobs", [] { return rc::Knobs::read(); },
        "Every runtime knob parsed from the environment now (Knobs). Raises InvalidArgumentError for "
        "a malformed value, naming the knob and what it accepts.");

  m.def("knob", [](const std::string& name) { return parsed(rc::knob_info(name)); }, py::arg("name"),
        "The knob's current value parsed with its rule (int, float or str; None for an unset knob "
        "without a default). Raises InvalidArgumentError for a malformed value, RingcommError for an "
        "unregistered name.");
  m.def("knob_is_set", [](const std::string& name) { return rc::knob_is_set(rc::knob_info(name)); },
        py::arg("name"));
  m.def("set_log_level", [](const std::string& level) { return static_cast<int>(rc::set_log_level(level)); },
        py::arg("level"),
        "Cache RINGCOMM_DEBUG's parsed value (WARN, INFO or TRACE) for the C++ logger; returns 0 WARN, "
        "1 INFO, 2 TRACE.");
}

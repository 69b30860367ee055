// Pinned / IPC-mapped ranges (transport/pin_registry.h) as Python dicts, for the bindings that
// show them to tests: ringcomm._C_test.PinRegistry and ringcomm._C_cuda._pinned_ranges.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "transport/pin_registry.h"

namespace rc_py {

inline pybind11::dict pin_range_dict(const rc::PinRange& r) {
  pybind11::dict d;
  d["begin"] = static_cast<uint64_t>(r.begin);
  d["bytes"] = static_cast<uint64_t>(r.bytes);
  d["kind"] = r.kind == rc::PinKind::kHostRegistered ? "host" : "ipc";
  d["owner"] = r.owner;
  d["state"] = r.state == rc::PinState::kLive ? "live" : "retired";
  return d;
}

inline pybind11::list pin_range_list(const std::vector<rc::PinRange>& v) {
  pybind11::list out;
  for (const rc::PinRange& r : v) out.append(pin_range_dict(r));
  return out;
}

}  // namespace rc_py

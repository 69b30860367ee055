// The synchronous entries' bindings (bindings/sync_py.cpp): the Communicator methods
// sync_all_reduce / sync_broadcast, the C ABI table and the entries' counters.
#pragma once
#include <pybind11/pybind11.h>

#include <memory>

#include "comm/communicator.h"

namespace rc_py {

using HostCommClass = pybind11::class_<rc::Communicator, std::shared_ptr<rc::Communicator>>;

/// Communicator.sync_all_reduce(x, out, op) -> bool, sync_broadcast(x, root) -> bool and
/// _fast_handle() -> int.
void def_sync_methods(HostCommClass& cls);

/// ringcomm._C._fast_api() -> int (the RcFastApi table's address) and _sync_entry_stats() -> dict.
void bind_sync(pybind11::module_& m);

}  // namespace rc_py

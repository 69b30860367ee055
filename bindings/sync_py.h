// The synchronous entries' bindings (bindings/sync_py.cpp): the Communicator methods
// sync_all_reduce / sync_broadcast / sync_reduce_scatter / sync_all_gather / sync_reduce /
// sync_all_to_all / sync_gather / sync_scatter / sync_barrier and the C ABI table.
#pragma once
#include <pybind11/pybind11.h>

#include <memory>

#include "comm/communicator.h"

namespace rc_py {

using HostCommClass = pybind11::class_<rc::Communicator, std::shared_ptr<rc::Communicator>>;

/// The properties Communicator.sync_all_reduce, sync_broadcast, sync_reduce_scatter,
/// sync_all_gather, sync_reduce, sync_all_to_all, sync_gather, sync_scatter and sync_barrier, each
/// a builtin function bound to the communicator: sync_all_reduce(x, out, op), sync_broadcast(x,
/// root), sync_reduce_scatter(output, input, op), sync_all_gather(output, input), sync_reduce(x,
/// out, op, root), sync_all_to_all(output, input, output_splits=None, input_splits=None),
/// sync_gather(output, input, root), sync_scatter(output, input, root), sync_barrier() (each ->
/// bool: True done, False declined having done nothing; positional arguments only); and
/// _fast_handle() -> int.
void def_sync_methods(HostCommClass& cls);

/// ringcomm._C._fast_api() -> int (the RcFastApi table's address).
void bind_sync(pybind11::module_& m);

}  // namespace rc_py

"""ringcomm on CUDA: ring collectives on torch CUDA tensors and CuPy arrays.

Layer 0, a back end: imports the core (ringcomm.core.front, .errors, .tables, ...) and the compiled
ringcomm._C_cuda, never another back end; the core's host communicator imports it to route CUDA
arrays here.

    import ringcomm.cuda
    if ringcomm.cuda.is_available():
        comm = ringcomm.cuda.init(rank=r, world_size=n, init_method="file:///tmp/rdzv")
        comm.all_reduce(x)            # x: a torch CUDA tensor, a CuPy array, any __cuda_array_interface__
                                      # or DLPack CUDA array; enqueued on the current stream

The plain API routes CUDA arrays here by itself: ``ringcomm.init()`` returns a host communicator
whose methods forward CUDA arrays to a CUDA communicator created (collectively) on first use.

Semantics (the CUDA communicator, csrc/comm/communicator_cuda.h):
- Collectives are enqueued on the caller's CUDA stream — ``stream=`` (an int handle, a
  ``torch.cuda.Stream`` or a ``cupy.cuda.Stream``), else the array library's current stream — and
  return without synchronising the host: later work on that stream sees the result. The call
  returns once every rank has entered the collective and its work is enqueued.
- ``async_op=True`` returns a :class:`Work` whose ``wait()`` blocks the host until the GPU work is
  done (bounded by the timeout, checking that peers are alive) and whose ``wait_stream()`` makes a
  stream wait for it. ``async_op=False`` returns None.
- send/recv progress on a helper stream; they complete (host-side) in ``wait()``; with
  ``async_op=False`` the call returns when the transfer is done. Arrays used on the helper
  stream, or on a ``stream=`` other than the current one, are kept from the allocator until the
  GPU is done with them (``record_stream`` on torch tensors, a reference for every array:
  ``inflight``), even when the caller drops them at once.
- A peer's death never blocks a stream: every dependency on a peer's GPU work is a bounded host
  wait (csrc/transport/cuda_ipc.h), so the call raises PeerFailureError and the stream stays usable.
- Buffers: contiguous, on the communicator's device. Dtypes: float32, float64, float16, bfloat16,
  int8, uint8, int32, int64, bool; reduce ops as on the CPU (ringcomm.ReduceOp).

Importing this package creates nothing and loads no CUDA library; ``is_available()`` loads the
``ringcomm._C_cuda`` extension (statically linked CUDA runtime) and asks the driver for devices.
Modules: ``runtime`` (availability, loading), ``buffers`` (CUDA array adapters, streams),
``inflight`` (arrays in use on another stream), ``communicator`` (CudaCommunicator, its Work,
init / from_communicator).
"""
from __future__ import annotations

from ..core.arrays import is_cuda_array
from .buffers import CudaBuf, as_cuda_buf, current_stream, stream_handle
from .communicator import CudaCommunicator, Work, from_communicator, init
from .runtime import device_count, is_available, require, unavailable_reason

_stream_handle = stream_handle   # the name tests/test_cuda.py uses

__all__ = ["is_available", "unavailable_reason", "is_cuda_array", "init", "from_communicator",
           "CudaCommunicator", "Work", "device_count", "as_cuda_buf", "CudaBuf", "stream_handle",
           "current_stream", "require"]

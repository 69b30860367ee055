"""
ringcomm C++ core: shared-memory ring collectives
"""
from __future__ import annotations
import collections.abc
import typing
import typing_extensions
__all__: list[str] = ['COLL_CODES', 'Communicator', 'Knobs', 'PROFILE_PARAMS', 'PROFILE_VERSION', 'Work', 'buffer_address', 'chunk_bounds', 'error_class_names', 'knob', 'knob_is_set', 'knobs', 'read_knobs', 'set_log_level']
class Knobs:
    """
    Every runtime knob, typed and parsed once (csrc/common/knobs.def): one read-only attribute per knob, named by its field (RINGCOMM_SLOT_BYTES: slot_bytes). Made by ringcomm.core.config.read().
    """
    def __repr__(self) -> str:
        ...
    def is_set(self, field: str) -> bool:
        """
        True when the environment set this knob (to a non-empty value) when it was read.
        """
    @property
    def algo(self) -> str:
        """
        RINGCOMM_ALGO: all-reduce algorithm: ring, direct (one hand-off, every rank combines all inputs), two_shot (a direct reduce-scatter, then a direct all-gather: two hand-offs, each rank combines 1/N), halving_doubling (recursive halving of the raw inputs, then recursive doubling: 2 log2 N hand-offs) or auto (below RINGCOMM_MODEL_MIN_WORLD ranks by size: RINGCOMM_LL_MAX_BYTES, RINGCOMM_DIRECT_MAX_BYTES, RINGCOMM_TWO_SHOT_MAX_BYTES; from there the cost model over RINGCOMM_PROFILE); reduce_scatter: direct forces its direct exchange, ring, two_shot and halving_doubling its ring, auto by size (RINGCOMM_LL_MAX_BYTES, RINGCOMM_DIRECT_MAX_BYTES); must be equal on every rank
        """
    @property
    def bind(self) -> str:
        """
        RINGCOMM_BIND: pin each local rank at init (before its shared memory is allocated): core (a contiguous share of the CPUs the process may use, one or more per local rank; with fewer CPUs than local ranks nothing is pinned), numa (the allowed CPUs of NUMA node local_rank mod nodes) or none; never applied when the process is already placed (an affinity mask or container cpuset narrower than the online CPUs, or another ringcomm job binding on this node: the INFO line says which)
        """
    @property
    def bind_registry(self) -> str:
        """
        RINGCOMM_BIND_REGISTRY: directory of the node registry through which ringcomm jobs that bind see each other (one file per process; the first job to register binds, later ones are left unbound)
        """
    @property
    def cma_broadcast_min_bytes(self) -> int:
        """
        RINGCOMM_CMA_BROADCAST_MIN_BYTES: broadcasts of at least this many bytes take the single-copy path of RINGCOMM_CMA_MIN_BYTES (each non-root reads (N-1)/N of the message from the root's buffer, the root writes the rest into theirs); 0: never; must be equal on every rank
        """
    @property
    def cma_min_bytes(self) -> int:
        """
        RINGCOMM_CMA_MIN_BYTES: all_gather (the output's bytes) and all_to_all (each rank's input bytes, even splits on every rank) of at least this many bytes read the peers' buffers straight into their outputs with process_vm_readv (one copy instead of two through slots), where every rank may read and write every peer's memory (probed at init, the INFO line says which); 0: off, for broadcast too; must be equal on every rank
        """
    @property
    def cpu_isa(self) -> str:
        """
        RINGCOMM_CPU_ISA: CPU reduce kernels: auto (bfloat16 AVX-512 where present; other dtypes AVX2 where present; else generic), or one of avx512, avx2, generic for every dtype
        """
    @property
    def cuda_close_wait(self) -> float:
        """
        RINGCOMM_CUDA_CLOSE_WAIT: seconds a closing CUDA communicator waits for its peers' goodbyes
        """
    @property
    def cuda_ledger_dir(self) -> str:
        """
        RINGCOMM_CUDA_LEDGER_DIR: RINGCOMM_CUDA_P2P=device*: directory of the node's per-GPU ledgers (one file per GPU, ringcomm-gpu-<uuid>) of the ring blocks each live communicator holds, so that communicators sharing a GPU plan within what the others left; every process sharing a GPU must see the same directory
        """
    @property
    def cuda_max_blocks(self) -> int:
        """
        RINGCOMM_CUDA_MAX_BLOCKS: CUDA grid cap of this rank: the reduce kernel's blocks (0: 4 per SM) and, RINGCOMM_CUDA_P2P=device*, the SM budget of the ring kernel (0: what the GPU's ledger, RINGCOMM_CUDA_LEDGER_DIR, leaves of the SMs x its resident blocks per SM once the other communicators there are counted, divided by this communicator's ranks that run concurrently on the GPU); init refuses grids that could not all be resident
        """
    @property
    def cuda_nslots(self) -> int:
        """
        RINGCOMM_CUDA_NSLOTS: CUDA slots per channel, 2..64
        """
    @property
    def cuda_p2p(self) -> str:
        """
        RINGCOMM_CUDA_P2P: CUDA channel kind; device: all_reduce, reduce_scatter, all_gather, broadcast and reduce run as one fused ring kernel per call with in-kernel flags over IPC memory (every channel ipc; every rank must set it; not yet run on a GPU), the other collectives on ipc channels, with the signalling of the setup detected at init (separate GPUs with P2P or one GPU under MPS: flags, each rank's grid within an SM budget; one GPU without MPS: spins with few, large slots); device-flags / device-spin force one of the two
        """
    @property
    def cuda_ring_lanes(self) -> int:
        """
        RINGCOMM_CUDA_RING_LANES: RINGCOMM_CUDA_P2P=device*: blocks (lanes) of the fused ring kernel, 1..32 (unset under device-spin: 1), capped by the SM budget (RINGCOMM_CUDA_MAX_BLOCKS); its slots per rank: lanes x RINGCOMM_CUDA_NSLOTS x RINGCOMM_CUDA_SLOT_BYTES (unset under device-spin: 2 x 8 MiB)
        """
    @property
    def cuda_slot_bytes(self) -> int:
        """
        RINGCOMM_CUDA_SLOT_BYTES: CUDA slot size (a multiple of 4096)
        """
    @property
    def cuda_watchdog_us(self) -> int:
        """
        RINGCOMM_CUDA_WATCHDOG_US: RINGCOMM_CUDA_P2P=device: microseconds between two looks of a communicator's watchdog thread at its kernels' status record and its peers' liveness
        """
    @property
    def debug(self) -> str:
        """
        RINGCOMM_DEBUG: logging to stderr: INFO one line per communicator (transport, selection rule), TRACE also one per collective (its algorithm, protocol and store)
        """
    @property
    def descheduled_us(self) -> int:
        """
        RINGCOMM_DESCHEDULED_US: auto: a long spin whose consecutive clock reads (64 pauses apart, about 2 us) are this far apart lost its CPU to another task meanwhile, and sleeps at once
        """
    @property
    def direct_max_bytes(self) -> int:
        """
        RINGCOMM_DIRECT_MAX_BYTES: auto takes the direct all-reduce (and the direct broadcast) while bytes x (world - 1) is at most this, the direct reduce_scatter while bytes x (world - 1) / world is
        """
    @property
    def far_slot_bytes(self) -> int:
        """
        RINGCOMM_FAR_SLOT_BYTES: slot size of each rank's two outboxes (collectives, point-to-point; 3 or more ranks): every message but the ring predecessor's collective hand-offs is written into its sender's outbox and read there by its receiver (direct exchanges, point-to-point); at most RINGCOMM_SLOT_BYTES
        """
    @property
    def header_in_slot(self) -> str:
        """
        RINGCOMM_HEADER_IN_SLOT: the header_in_slot protocol: a collective's first send that waits on nothing goes out before its header is posted (the direct all-reduce's and broadcast's piece 0 to every peer, the direct reduce_scatter's to the ring predecessor, the ring all_gather's own block while what each rank receives is within RINGCOMM_DIRECT_MAX_BYTES, the chains' head piece to the ring successor; never the all_to_all's), so header and data take one hand-off (a mismatch drains it and raises MismatchError on every rank); off: the simple protocol (header exchange first)
        """
    @property
    def heartbeat_timeout_ms(self) -> int:
        """
        RINGCOMM_HEARTBEAT_TIMEOUT_MS: a peer in another PID namespace (containers sharing /dev/shm) is dead when its heartbeat has not moved for this long (the larger of both ranks' values); its background thread bumps it every 1/8 of this
        """
    @property
    def hier_scratch_cache(self) -> int:
        """
        RINGCOMM_HIER_SCRATCH_CACHE: bytes of hierarchical temporaries kept between calls
        """
    @property
    def inter(self) -> str:
        """
        RINGCOMM_INTER: inter-node engine for host memory: auto (gloo), gloo (torch.distributed), mpi (mpi4py)
        """
    @property
    def liveness_ms(self) -> int:
        """
        RINGCOMM_LIVENESS_MS: how often a sleeping waiter checks that its peers are alive
        """
    @property
    def ll_max_bytes(self) -> int:
        """
        RINGCOMM_LL_MAX_BYTES: all-reduces and reduce_scatters (under RINGCOMM_ALGO=auto), broadcasts and reduces of at most this many bytes use the LL protocol: each rank writes header and data into 64-byte lines of its own shared-memory outbox (56 data bytes and a flag each) and its peers read them in place; the outbox's size, so equal on every rank (0: off)
        """
    @property
    def load_avg_slack(self) -> float:
        """
        RINGCOMM_LOAD_AVG_SLACK: auto: how far the node's one-minute load average may exceed the usable CPUs plus RINGCOMM_LOAD_SLACK before waits count it as oversubscribed (the average counts the ranks' own busy time)
        """
    @property
    def load_check_ms(self) -> int:
        """
        RINGCOMM_LOAD_CHECK_MS: auto: how often waits read the node's load (/proc/loadavg); while its runnable threads or its one-minute load average exceed the usable CPUs plus RINGCOMM_LOAD_SLACK, waits spin 2 us (unless RINGCOMM_SPIN_US is set), give the CPU up at once to a peer that last waited on it, and unpinned ranks take no long spin (0: never read)
        """
    @property
    def load_slack(self) -> int:
        """
        RINGCOMM_LOAD_SLACK: auto: runnable threads (and load average) beyond the usable CPUs that the node may have before waits count it as oversubscribed
        """
    @property
    def local_stream_min_bytes(self) -> int:
        """
        RINGCOMM_LOCAL_STREAM_MIN_BYTES: a single-copy collective (all_gather, all_to_all over RINGCOMM_CMA_MIN_BYTES) copies this rank's own block into its output with streaming (non-temporal) stores from this many bytes, which then starts in memory rather than this core's caches; 0: never (plain memcpy); a local choice, ranks may differ
        """
    @property
    def model_min_world(self) -> int:
        """
        RINGCOMM_MODEL_MIN_WORLD: RINGCOMM_ALGO=auto picks the all-reduce algorithm with the cost model (docs/algorithms.md) from this many ranks up; below, by the measured size thresholds (2 lets the model decide everywhere)
        """
    @property
    def node_id(self) -> str:
        """
        RINGCOMM_NODE_ID: node identity (unset: hostname + boot id; set it to fake several nodes on one machine)
        """
    @property
    def nslots(self) -> int:
        """
        RINGCOMM_NSLOTS: slots per channel, a power of two in 2..1024 (the ring's deadlock-freedom argument needs two)
        """
    @property
    def outbox_slots(self) -> int:
        """
        RINGCOMM_OUTBOX_SLOTS: slots of each outbox (3 or more ranks), a power of two in 2..1024; per rank the shared memory is the same at any world size: header + RINGCOMM_NSLOTS x (RINGCOMM_SLOT_BYTES + 4K) + 2 x RINGCOMM_OUTBOX_SLOTS x (RINGCOMM_FAR_SLOT_BYTES + 4K)
        """
    @property
    def p2p_eager_bytes(self) -> int:
        """
        RINGCOMM_P2P_EAGER_BYTES: point-to-point between processes: a send of more bytes waits for its receive (rendezvous: it announces itself and its data goes once the receive is posted); up to this size a send completes once written (from 3 ranks on, a message that arrives before its receive is held in the receiver's private memory)
        """
    @property
    def profile(self) -> str:
        """
        RINGCOMM_PROFILE: the machine profile of the cost model: a JSON file written by `python -m ringcomm.apps.tune` (unset: the compiled-in defaults); every rank of a communicator must load the same one (its hash is compared at init: MismatchError)
        """
    @property
    def slot_bytes(self) -> int:
        """
        RINGCOMM_SLOT_BYTES: size of one shared-memory slot (pieces stream through slots)
        """
    @property
    def slot_walk_bytes(self) -> int:
        """
        RINGCOMM_SLOT_WALK_BYTES: a piece that fits this many bytes of its push-channel slot at least twice moves to the next place in them each time the slot comes round (pieces of a 4K multiple apart, from the slot's start): lines the receiver read last time are then seldom the ones written next, which the writer would first have to take back from the receiver's cache (0: every piece at the slot's start); at most RINGCOMM_SLOT_BYTES; a sender's own choice, recorded in the slot
        """
    @property
    def spin_own_cpu_us(self) -> int:
        """
        RINGCOMM_SPIN_OWN_CPU_US: auto, no other local rank on this rank's CPUs: microseconds a synchronous call's wait spins before it sleeps on the futex (a wait that lost its CPU meanwhile sleeps at once); longer than a scheduler tick (4 ms at HZ=250), so a wait for a peer that lost its CPU for a tick does not hand this rank's CPU to another task
        """
    @property
    def spin_unpinned_us(self) -> int:
        """
        RINGCOMM_SPIN_UNPINNED_US: auto, ranks not pinned apart that in effect have a CPU each (the node's ranks plus RINGCOMM_UNPINNED_SPARE_CPUS fit the usable CPUs: the fewest of the affinity mask's, the online ones and the cgroup CPU quota): microseconds a synchronous call's wait spins before it sleeps on the futex, while the node's runnable threads fit those CPUs (RINGCOMM_LOAD_CHECK_MS) and no such spin lost its CPU in the last RINGCOMM_UNPINNED_BACKOFF_MS (0: unpinned ranks never take this spin)
        """
    @property
    def spin_us(self) -> int:
        """
        RINGCOMM_SPIN_US: microseconds a waiter spins before sleeping on a futex (unset: 2 when ranks outnumber CPUs)
        """
    @property
    def start_method(self) -> str:
        """
        RINGCOMM_START_METHOD: how ringcomm.core.launch starts its ranks: spawn (a fresh interpreter each) or forkserver (forks of multiprocessing's fork server, which imports the modules of multiprocessing.set_forkserver_preload once, e.g. torch: ranks start faster; each still runs with the launching process's environment as it is at the call)
        """
    @property
    def stream(self) -> str:
        """
        RINGCOMM_STREAM: stores into peers' slots: off (cached), on (streaming, non-temporal), auto (streaming from RINGCOMM_STREAM_MIN_BYTES up), adapt (from RINGCOMM_STREAM_ADAPT_MIN_BYTES, whichever of the two the ranks' own timings found faster, re-measured as the calls go: comm/store_adapt.h); the choice travels in the header, so ranks that differ raise MismatchError
        """
    @property
    def stream_adapt_min_bytes(self) -> int:
        """
        RINGCOMM_STREAM_ADAPT_MIN_BYTES: RINGCOMM_STREAM=adapt decides the store of collectives of at least this many bytes through slots (the message size; for an all_to_all the largest rank's input); smaller ones stay cached; must be equal on every rank
        """
    @property
    def stream_min_bytes(self) -> int:
        """
        RINGCOMM_STREAM_MIN_BYTES: RINGCOMM_STREAM=auto streams collectives of at least this many bytes (the message size; all_to_all never)
        """
    @property
    def threads(self) -> str:
        """
        RINGCOMM_THREADS: threads per rank for copies and reductions of at least RINGCOMM_THREADS_MIN_BYTES: a count >= 1, or auto (OMP_NUM_THREADS where set, at most the rank's CPUs; else the CPUs the rank may use divided by the local ranks sharing them)
        """
    @property
    def threads_min_bytes(self) -> int:
        """
        RINGCOMM_THREADS_MIN_BYTES: a copy or reduction of at least this many bytes (one slot's piece, or a whole buffer) is split over the rank's threads, by element ranges (results are bit-identical to one thread)
        """
    @property
    def timeout(self) -> float:
        """
        RINGCOMM_TIMEOUT: seconds any single wait may take (timeout= per communicator overrides)
        """
    @property
    def torch_backend(self) -> str:
        """
        RINGCOMM_TORCH_BACKEND: torch backend: c10d (a per-device c10d Backend, JIT-built trampoline), group (one ProcessGroup for every device) or auto (c10d, else group with a warning)
        """
    @property
    def trace(self) -> int:
        """
        RINGCOMM_TRACE: keep the last N collectives' phase timestamps per communicator (comm.trace()); 0: off
        """
    @property
    def two_shot_max_bytes(self) -> int:
        """
        RINGCOMM_TWO_SHOT_MAX_BYTES: above the direct range, auto takes two_shot while bytes is at most this (with RINGCOMM_TWO_SHOT_MIN_WORLD ranks or more; the ring above)
        """
    @property
    def two_shot_min_world(self) -> int:
        """
        RINGCOMM_TWO_SHOT_MIN_WORLD: auto takes two_shot only with at least this many ranks
        """
    @property
    def unpinned_backoff_ms(self) -> int:
        """
        RINGCOMM_UNPINNED_BACKOFF_MS: auto: after a spin of ranks not pinned apart lost its CPU (RINGCOMM_DESCHEDULED_US), such spins stop for this long (their waits yield, then sleep)
        """
    @property
    def unpinned_spare_cpus(self) -> int:
        """
        RINGCOMM_UNPINNED_SPARE_CPUS: auto: CPUs beyond one per local rank that the usable CPUs must hold for ranks not pinned apart to take the RINGCOMM_SPIN_UNPINNED_US spin
        """
    @property
    def wait(self) -> str:
        """
        RINGCOMM_WAIT: wait policy: spin (pause-spin, then futex sleep), yield (spin with a sched_yield every RINGCOMM_YIELD_EVERY_NS, then futex), adaptive (spin, switching to yield for the next 64 waits after a spin ran out or was preempted) or auto (where no other local rank may run on this rank's CPUs, by the ranks' affinity masks (ranks pinned apart): a synchronous call's waits spin RINGCOMM_SPIN_OWN_CPU_US, ending early when the thread lost its CPU, then futex; where ranks not pinned apart in effect have a CPU each, the same bounded by RINGCOMM_SPIN_UNPINNED_US; every other wait as yield, with a 2 us spin where ranks or the node's runnable threads outnumber CPUs)
        """
    @property
    def yield_backoff_ms(self) -> int:
        """
        RINGCOMM_YIELD_BACKOFF_MS: after such a lost yield, waits spin and sleep without sched_yield for this long (0: never back off)
        """
    @property
    def yield_every_ns(self) -> int:
        """
        RINGCOMM_YIELD_EVERY_NS: while yielding: sched_yield this often during the spin (min 100)
        """
    @property
    def yield_lost_us(self) -> int:
        """
        RINGCOMM_YIELD_LOST_US: while yielding: a sched_yield that kept the CPU away this long (a whole scheduler slice: another process's task ran, not a rank) with the awaited word still unset ends the wait's spin (it sleeps on the futex) and starts the back-off
        """
    @property
    def yield_us(self) -> int:
        """
        RINGCOMM_YIELD_US: while yielding: microseconds more of spinning with yields before the futex sleep
        """
    @property
    def zero_bucket_mb(self) -> float:
        """
        RINGCOMM_ZERO_BUCKET_MB: ZeRO-1/2 bucket size in MiB
        """
    @property
    def zero_collectives(self) -> str:
        """
        RINGCOMM_ZERO_COLLECTIVES: ZeRO collectives: native, fallback (all_reduce + slice) or auto
        """
    @property
    def zero_max_inflight(self) -> int:
        """
        RINGCOMM_ZERO_MAX_INFLIGHT: ZeRO-2 reduce-scatters in flight during backward
        """
class Work:
    def error_code(self) -> int:
        ...
    def error_message(self) -> str:
        ...
    def is_completed(self) -> bool:
        ...
    def source(self) -> int:
        ...
    def wait(self, timeout: typing.SupportsFloat | typing.SupportsIndex = -1.0) -> None:
        ...
    @property
    def op(self) -> str:
        ...
    @property
    def seq(self) -> int:
        ...
class Communicator:
    @typing.overload
    def __init__(self, rank: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex, timeout: typing.SupportsFloat | typing.SupportsIndex = 0.0) -> None:
        ...
    @typing.overload
    def __init__(self, rank: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex, timeout: typing.SupportsFloat | typing.SupportsIndex, knobs: Knobs) -> None:
        ...
    def _fast_handle(self) -> int:
        """
        A new handle of this communicator for RcFastApi (ringcomm/abi.h); the receiver releases it.
        """
    def abort(self, reason: str = '') -> None:
        ...
    def all_gather(self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex, arg2: typing.SupportsInt | typing.SupportsIndex, arg3: typing.SupportsInt | typing.SupportsIndex, arg4: typing.SupportsInt | typing.SupportsIndex, arg5: bool) -> Work:
        ...
    def all_reduce(self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex, arg2: typing.SupportsInt | typing.SupportsIndex, arg3: typing.SupportsInt | typing.SupportsIndex, arg4: typing.SupportsInt | typing.SupportsIndex, arg5: bool) -> Work:
        ...
    def all_to_all(self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex, arg2: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], arg3: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], arg4: typing.SupportsInt | typing.SupportsIndex, arg5: bool) -> Work:
        ...
    def barrier(self, arg0: bool) -> Work:
        ...
    def broadcast(self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex, arg2: typing.SupportsInt | typing.SupportsIndex, arg3: typing.SupportsInt | typing.SupportsIndex, arg4: bool) -> Work:
        ...
    def close(self) -> None:
        ...
    def connect(self, arg0: collections.abc.Sequence[str]) -> None:
        ...
    def create(self) -> str:
        ...
    def describe_wait(self) -> str:
        """
        The wait policy in words: mode, spin and yield budgets, ranks against CPUs.
        """
    def errored(self) -> typing.Any:
        ...
    def gather(self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex, arg2: typing.SupportsInt | typing.SupportsIndex, arg3: typing.SupportsInt | typing.SupportsIndex, arg4: typing.SupportsInt | typing.SupportsIndex, arg5: bool) -> Work:
        ...
    def next_seq(self) -> int:
        ...
    def recv(self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex, arg2: typing.SupportsInt | typing.SupportsIndex, arg3: typing.SupportsInt | typing.SupportsIndex, arg4: bool) -> Work:
        ...
    def reduce(self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex, arg2: typing.SupportsInt | typing.SupportsIndex, arg3: typing.SupportsInt | typing.SupportsIndex, arg4: typing.SupportsInt | typing.SupportsIndex, arg5: typing.SupportsInt | typing.SupportsIndex, arg6: bool) -> Work:
        ...
    def reduce_scatter(self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex, arg2: typing.SupportsInt | typing.SupportsIndex, arg3: typing.SupportsInt | typing.SupportsIndex, arg4: typing.SupportsInt | typing.SupportsIndex, arg5: bool) -> Work:
        ...
    def reject(self) -> None:
        ...
    def scatter(self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex, arg2: typing.SupportsInt | typing.SupportsIndex, arg3: typing.SupportsInt | typing.SupportsIndex, arg4: typing.SupportsInt | typing.SupportsIndex, arg5: bool) -> Work:
        ...
    def send(self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex, arg2: typing.SupportsInt | typing.SupportsIndex, arg3: typing.SupportsInt | typing.SupportsIndex, arg4: bool) -> Work:
        ...
    def set_cpus(self, threads: typing.SupportsInt | typing.SupportsIndex, min_bytes: typing.SupportsInt | typing.SupportsIndex, where: str = '', ranks_sharing: typing.SupportsInt | typing.SupportsIndex = 0, node_ranks: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        """
        Before connect(): split copies and reductions of >= min_bytes over `threads` threads (1: none); `where` (the rank's placement) ends the INFO line; `ranks_sharing` (the local ranks on this rank's CPUs, where ringcomm pinned them) and `node_ranks` (the ranks on this node, of every group) inform the wait policy (0: not known).
        """
    def set_timeout(self, seconds: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def store_stats(self) -> typing.Any:
        """
        RINGCOMM_STREAM=adapt's state: the store in use, the calls it decided, the calls run under the other store to measure it, and the switches; None where the policy does not run.
        """
    def trace(self) -> list:
        """
        The last RINGCOMM_TRACE collectives' phase timestamps (CLOCK_MONOTONIC ns), oldest first.
        """
    def wait_stats(self) -> dict:
        """
        Counters of this rank's waits' slow paths: futex sleeps, sched_yields that lost the CPU, waits that found their peer on their own CPU, long spins that lost the CPU, unpinned ranks' long spins, load checks that found the node oversubscribed, unpinned waits that skipped the long spin after one lost its CPU.
        """
    @property
    def closed(self) -> bool:
        ...
    @property
    def closed_reason(self) -> str:
        ...
    @property
    def cpu_threads(self) -> int:
        ...
    @property
    def pool_spin_us(self) -> int:
        """
        The split copies' pool's idle spin (us), -1 without a pool.
        """
    @property
    def profile_hash(self) -> str:
        """
        The hash of the cost model's profile this rank loaded (compared across ranks at init).
        """
    @property
    def profile_source(self) -> str:
        ...
    @property
    def rank(self) -> int:
        ...
    @property
    def sync_all_gather(self) -> typing.Any:
        """
        This communicator's synchronous entry, a builtin function sync_all_gather(output, input) -> bool (True: ran the call; False: declined, nothing done)
        """
    @property
    def sync_all_reduce(self) -> typing.Any:
        """
        This communicator's synchronous entry, a builtin function sync_all_reduce(x, out, op) -> bool (True: ran the call; False: declined, nothing done)
        """
    @property
    def sync_all_to_all(self) -> typing.Any:
        """
        This communicator's synchronous entry, a builtin function sync_all_to_all(output, input, output_splits=None, input_splits=None) -> bool (True: ran the call; False: declined, nothing done)
        """
    @property
    def sync_barrier(self) -> typing.Any:
        """
        This communicator's synchronous entry, a builtin function sync_barrier() -> bool (True: ran the call; False: declined, nothing done)
        """
    @property
    def sync_broadcast(self) -> typing.Any:
        """
        This communicator's synchronous entry, a builtin function sync_broadcast(x, root) -> bool (True: ran the call; False: declined, nothing done)
        """
    @property
    def sync_gather(self) -> typing.Any:
        """
        This communicator's synchronous entry, a builtin function sync_gather(output, input, root) -> bool (True: ran the call; False: declined, nothing done)
        """
    @property
    def sync_reduce(self) -> typing.Any:
        """
        This communicator's synchronous entry, a builtin function sync_reduce(x, out, op, root) -> bool (True: ran the call; False: declined, nothing done)
        """
    @property
    def sync_reduce_scatter(self) -> typing.Any:
        """
        This communicator's synchronous entry, a builtin function sync_reduce_scatter(output, input, op) -> bool (True: ran the call; False: declined, nothing done)
        """
    @property
    def sync_scatter(self) -> typing.Any:
        """
        This communicator's synchronous entry, a builtin function sync_scatter(output, input, root) -> bool (True: ran the call; False: declined, nothing done)
        """
    @property
    def timeout(self) -> float:
        ...
    @property
    def world_size(self) -> int:
        ...
class _CpuPool:
    """
    Test/benchmark handle: the CpuPool (kernels/cpu_pool.h) of `threads` threads that a host communicator uses for large copies and reductions.
    """
    def __init__(self, threads: typing.SupportsInt | typing.SupportsIndex, spin_us: typing.SupportsInt | typing.SupportsIndex = 50) -> None:
        ...
    def copy(self, dst: typing.Any, src: typing.Any, dtype: typing.SupportsInt | typing.SupportsIndex, stream: bool = False, min_bytes: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        """
        dst = src split likewise (stream: non-temporal stores, as into a peer's slot).
        """
    def reduce(self, dst: typing.Any, a: typing.Any, b: typing.Any, dtype: typing.SupportsInt | typing.SupportsIndex, op: typing.SupportsInt | typing.SupportsIndex, scale: typing.SupportsFloat | typing.SupportsIndex = 1.0, min_bytes: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        """
        dst = a (op) b split over the pool's threads when the bytes are >= min_bytes (GIL released).
        """
    @property
    def threads(self) -> int:
        ...
def _copy_to_peer(dst: typing_extensions.Buffer, src: typing_extensions.Buffer, stream: bool) -> None:
    ...
def _cpu_pair(cpu_a: typing.SupportsInt | typing.SupportsIndex, cpu_b: typing.SupportsInt | typing.SupportsIndex, handoff_bytes: typing.SupportsInt | typing.SupportsIndex = 262144, seconds: typing.SupportsFloat | typing.SupportsIndex = 0.2) -> dict:
    """
    Two threads pinned to cpu_a and cpu_b (GIL released): the median round trip of a cache line between
    them (ns) and the rate of handing handoff_bytes through two slots (copy in, copy out; GB/s = 1e9 B/s).
    """
def _default_profile() -> dict:
    ...
def _fast_api() -> int:
    """
    Address of the RcFastApi table (ringcomm/abi.h), valid while the process lives.
    """
def _load_profile(path: str) -> dict:
    ...
def _model_choose(bytes: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex, ll_bytes: typing.SupportsInt | typing.SupportsIndex, header_in_slot: bool = True, params: typing.Any = None, ring_piece: typing.SupportsInt | typing.SupportsIndex = 262144, far_piece: typing.SupportsInt | typing.SupportsIndex = 32768, far_depth: typing.SupportsInt | typing.SupportsIndex = 16) -> tuple[str, str]:
    """
    (algorithm, protocol) the cost model picks (comm/cost_model.h)
    """
def _profile(params: typing.Any = None) -> dict:
    """
    The profile (params, hash, source) of `params`, or RINGCOMM_PROFILE's (the defaults when unset).
    """
def _reduce(dst: typing.Any, a: typing.Any, b: typing.Any, dtype: typing.SupportsInt | typing.SupportsIndex, op: typing.SupportsInt | typing.SupportsIndex, scale: typing.SupportsFloat | typing.SupportsIndex = 1.0, isa: str = 'auto') -> None:
    """
    dst[:] = a (op) b elementwise with the CPU reduce kernels (tests/benchmarks).
    dtype/op are rc::DType / rc::ReduceOp codes; scale applies to AVG only; isa is 'auto' (the
    RINGCOMM_CPU_ISA choice for dtype), 'generic', 'avx2' or 'avx512'. Runs with the GIL released.
    """
def _select(collective: str, bytes: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex, device: str = 'host', cma: bool = False) -> tuple[str, str, str]:
    """
    (algorithm, protocol, store) names the selection picks (csrc/comm/selection.h); cma: the host device's ranks may read each other's memory (its probe at connect, transport/shm_cma.h)
    """
def buffer_address(arg0: typing.Any, arg1: bool) -> typing.Any:
    ...
def chunk_bounds(arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex) -> list[tuple[int, int]]:
    ...
def error_class_names() -> dict:
    """
    {ErrorCode value: ringcomm.core.errors class name}: the bindings' table
    """
def knob(name: str) -> typing.Any:
    """
    The knob's current value parsed with its rule (int, float or str; None for an unset knob without a default). Raises InvalidArgumentError for a malformed value, RingcommError for an unregistered name.
    """
def knob_is_set(name: str) -> bool:
    ...
def knobs() -> list:
    """
    The knob registry: a list of {name, field, type, default, choices, doc, build}.
    """
def read_knobs() -> Knobs:
    """
    Every runtime knob parsed from the environment now (Knobs). Raises InvalidArgumentError for a malformed value, naming the knob and what it accepts.
    """
def set_log_level(level: str) -> int:
    """
    Cache RINGCOMM_DEBUG's parsed value (WARN, INFO or TRACE) for the C++ logger; returns 0 WARN, 1 INFO, 2 TRACE.
    """
COLL_CODES: dict = {'all_reduce': 1, 'reduce_scatter': 2, 'all_gather': 3, 'broadcast': 4, 'reduce': 5, 'barrier': 6, 'all_to_all': 7, 'gather': 8, 'scatter': 9}
PROFILE_PARAMS: tuple = ('alpha_s', 'alpha_shared_s', 'slot_s', 'copy_Bps', 'reduce_Bps', 'll_Bps', 'cpus')
PROFILE_VERSION: int = 1

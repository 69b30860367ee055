"""Cases of tests/test_small_message.py that run INSIDE spawned ranks (module-level so that spawn
can pickle them; no torch import here: only the bfloat16 cases load it, through mp_cases)."""
import traceback

import numpy as np
import ringcomm
import ringcomm.core.config
from mp_cases import close_enough, init_under_env, make, pairs, reference, to_lib, to_np
from order_ref import ordered_sum

SENTINEL = -7



# The communicators every correctness case runs on: the LL outbox up to 64 KiB (algo/ll.cpp),
# the in-slot path (header in the first slot) without it, the same with the header exchange
# first, the ring (the reference order), and the in-slot path with 256-byte slots (many pieces:
# only piece 0 travels with the header).
LL_BYTES = {"ll": 65536}
CONFIGS = {
    "ll": {"RINGCOMM_LL_MAX_BYTES": str(LL_BYTES["ll"]), "RINGCOMM_TRACE": "4"},
    "inslot": {"RINGCOMM_HEADER_IN_SLOT": "on", "RINGCOMM_LL_MAX_BYTES": "0", "RINGCOMM_TRACE": "4"},
    "board": {"RINGCOMM_HEADER_IN_SLOT": "off", "RINGCOMM_LL_MAX_BYTES": "0", "RINGCOMM_TRACE": "4"},
    "ring": {"RINGCOMM_ALGO": "ring"},
    "tiny": {"RINGCOMM_ALGO": "direct", "RINGCOMM_SLOT_BYTES": "256", "RINGCOMM_FAR_SLOT_BYTES": "256",
             "RINGCOMM_NSLOTS": "2", "RINGCOMM_LL_MAX_BYTES": "0", "RINGCOMM_TRACE": "4"},
    # the ring and the chains with 256-byte slots: only their first piece travels with the header
    "ring_tiny": {"RINGCOMM_ALGO": "ring", "RINGCOMM_SLOT_BYTES": "256", "RINGCOMM_FAR_SLOT_BYTES": "256",
                  "RINGCOMM_NSLOTS": "2", "RINGCOMM_LL_MAX_BYTES": "0", "RINGCOMM_TRACE": "4"},
}


def _thresholds(world, esize):
    """Element counts at and around the direct threshold (bytes x (world-1) <= DIRECT_MAX) and the
    far piece size (world >= 3), plus the tiny config's piece size."""
    out = set()
    if world > 1:
        thr = int(ringcomm.core.config.knob("RINGCOMM_DIRECT_MAX_BYTES")) // (esize * (world - 1))
        out |= {thr - 1, thr, thr + 1}
        if world >= 3:
            pe = int(ringcomm.core.config.knob("RINGCOMM_FAR_SLOT_BYTES")) // esize
            out |= {c for c in (pe - 1, pe, pe + 1) if c <= thr + 1}
        ll = LL_BYTES["ll"] // esize
        out |= {ll - 1, ll, ll + 1, (56 - 40) // esize, (56 - 40) // esize + 1, 56 // esize + 1}
    tiny_pe = 256 // esize
    out |= {tiny_pe - 1, tiny_pe, tiny_pe + 1, 3 * tiny_pe + 1}
    return sorted(c for c in out if c > 0)


def _direct_expected(world, count, esize, cfg):
    """Whether `cfg` runs all_reduce of `count` elements with the direct algorithm (world > 1)."""
    if cfg == "tiny":
        return True
    return count * esize * (world - 1) <= int(ringcomm.core.config.knob("RINGCOMM_DIRECT_MAX_BYTES"))


def _above_direct(world, nbytes):
    """auto's all_reduce algorithm above the direct range: the two-shot up to
    RINGCOMM_TWO_SHOT_MAX_BYTES with RINGCOMM_TWO_SHOT_MIN_WORLD ranks or more, the ring above
    (csrc/comm/selection.cpp)."""
    if world >= int(ringcomm.core.config.knob("RINGCOMM_TWO_SHOT_MIN_WORLD")) and nbytes <= int(ringcomm.core.config.knob("RINGCOMM_TWO_SHOT_MAX_BYTES")):
        return "two_shot"
    return "ring"


def _algo_expected(world, count, esize, cfg, coll):
    """'algorithm/protocol' the trace names for `coll` of `count` (> 0) elements under `cfg`
    (world > 1)."""
    if count * esize <= LL_BYTES.get(cfg, 0):
        return "direct/ll"
    if cfg == "ring_tiny":
        return "ring/header_in_slot" if coll == "all_reduce" else "chain/header_in_slot"
    direct = _direct_expected(world, count, esize, cfg)
    inslot = "direct/simple" if cfg == "board" else "direct/header_in_slot"
    if coll == "all_reduce":
        if direct:
            return inslot
        above = _above_direct(world, count * esize)
        # the ring's RS step 0 goes with the header (its chunk is not empty above the direct range)
        return above + ("/header_in_slot" if above == "ring" and cfg != "board" else "/simple")
    if cfg == "board":
        return "chain/simple"
    # Above the direct range the chain's head hands its first piece off with its header.
    return "direct/header_in_slot" if direct else "chain/header_in_slot"


def _path(rec):
    return f"{rec['algorithm']}/{rec['protocol']}"


def correctness_cases(rank, world):
    fails, digests = [], []
    comms = {name: init_under_env(rank, world, name, env) for name, env in CONFIGS.items()}

    def check(what, cond):
        if not cond:
            fails.append(f"rank {rank}: {what}")

    try:
        esizes = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
                  "int32": 4, "int64": 8, "bool": 1}
        for dt, op in pairs():
            lib = "torch" if dt == "bfloat16" else "numpy"
            es = esizes[dt]
            counts = sorted({0, 1, 7, 5 * world + 1, *_thresholds(world, es)})
            for count in counts:
                tag = f"{dt} {op} n={count}"
                ins = [make(dt, count, r, 11, op) for r in range(world)]
                ref = reference(ins, dt, op, world)
                got = {}
                for name, comm in comms.items():
                    out_of_place = count % 2 == 1
                    x = to_lib(ins[rank], dt, lib)
                    if out_of_place:
                        y = to_lib(np.full_like(ins[rank], 3), dt, lib)
                        comm.all_reduce(x, op=op, output=y)
                        check(f"{name} input untouched {tag}", np.array_equal(to_np(x), to_np(to_lib(ins[rank], dt, lib))))
                    else:
                        comm.all_reduce(x, op=op)
                        y = x
                    check(f"{name} all_reduce {tag}", close_enough(y, ref, dt, op))
                    got[name] = np.ascontiguousarray(to_np(y)).tobytes()
                    if name != "ring" and world > 1 and count > 0:
                        rec = comm.trace()[-1]
                        algo = _algo_expected(world, count, es, name, "all_reduce")
                        check(f"{name} algorithm {tag}: {_path(rec)}", _path(rec) == algo)
                        if algo.startswith("direct/"):
                            # in-slot and LL: the first piece travelled with the header (trace.h)
                            inslot = name != "board"
                            check(f"{name} trace phases {tag}: {rec}",
                                  (rec["first_slot"] == rec["header_seen"]) == inslot
                                  and rec["header_posted"] <= rec["header_seen"])
                # every algorithm combines in the one promised order: bit-identical to the ring
                for name in comms:
                    check(f"{name} differs bitwise from the ring, {tag}", got[name] == got["ring"])
                digests.append(got["inslot"])
        # broadcast: direct with the header in the root's first slot where the direct all_reduce
        # would run, the chain above (and with the knob off, or the ring config's auto choice).
        for dt, es in esizes.items():
            lib = "torch" if dt == "bfloat16" else "numpy"
            for count in sorted({0, 1, 7, *_thresholds(world, es)}):
                for root in range(world):
                    src = make(dt, count, root, 5, "sum")
                    for name, comm in comms.items():
                        x = to_lib(src if rank == root else np.zeros_like(src), dt, lib)
                        comm.broadcast(x, root=root)
                        tag = f"{name} broadcast {dt} n={count} root={root}"
                        check(tag, np.array_equal(np.ascontiguousarray(to_np(x)).view(np.uint8),
                                                  np.ascontiguousarray(src).view(np.uint8)))
                        if name != "ring" and world > 1 and count > 0:
                            rec = comm.trace()[-1]
                            algo = _algo_expected(world, count, es, name, "broadcast")
                            check(f"{tag}: algorithm {_path(rec)}", _path(rec) == algo)
        # all_gather (the ring) and reduce (the chain) above the LL outbox: the first send (every
        # rank's own block; the chain head's first piece) travels with the header unless the knob
        # is off; blocks of different sizes, an empty one, and many pieces (the tiny config).
        for dt in ("float32", "int32"):
            es = esizes[dt]
            for count in sorted({0, 1, 7, 300, 1025, 16385}):
                blocks = [count + p for p in range(world)]
                if world > 2:
                    blocks[1] = 0
                ins = [make(dt, blocks[p], p, 13, "SUM") for p in range(world)]
                want = np.concatenate(ins)
                for name, comm in comms.items():
                    out = np.full(sum(blocks), SENTINEL, ins[rank].dtype)
                    comm.all_gather(out, ins[rank])
                    tag = f"{name} all_gather {dt} blocks={blocks}"
                    check(tag, np.array_equal(out, want))
                    if name != "ring" and world > 1 and sum(blocks) > 0:
                        path = _path(comm.trace()[-1])
                        # with the header in the direct range's measure (what each rank receives)
                        nbytes = sum(blocks) * es
                        direct_max = int(ringcomm.core.config.knob("RINGCOMM_DIRECT_MAX_BYTES"))
                        inslot = name != "board" and nbytes // world * (world - 1) <= direct_max
                        check(f"{tag}: algorithm {path}", path == ("ring/header_in_slot" if inslot else "ring/simple"))
                if count == 0:
                    continue
                xs = [make(dt, count, p, 17, "SUM") for p in range(world)]
                ref = reference(xs, dt, "SUM", world)
                for root in range(world):
                    got = {}
                    for name, comm in comms.items():
                        x = xs[rank].copy()
                        comm.reduce(x, root=root)
                        tag = f"{name} reduce {dt} n={count} root={root}"
                        if rank == root:
                            check(tag, close_enough(x, ref, dt, "SUM"))
                            got[name] = x.tobytes()
                        if name != "ring" and world > 1:
                            path = _path(comm.trace()[-1])
                            want_path = ("direct/ll" if count * es <= LL_BYTES.get(name, 0)
                                         else "chain/simple" if name == "board" else "chain/header_in_slot")
                            check(f"{tag}: algorithm {path}", path == want_path)
                    for name in got:
                        check(f"{name} reduce differs bitwise from the chain, n={count}", got[name] == got["board"])
        # reduce_scatter: every path bitwise the ring's (ring_tiny: the ring in many pieces, its RS
        # step 0 piece with the header; chunks that are empty at count < world)
        from ringcomm.core.front import chunk_count
        for dt in ("float32", "float64"):
            for count in sorted({1, world - 1, 7 * world + 3, 300 * world + 5, 16385}):
                if count == 0:
                    continue
                xs = [make(dt, count, p, 19, "SUM") for p in range(world)]
                ref = reference(xs, dt, "SUM", world)
                off = sum(chunk_count(count, world, k) for k in range(rank))
                cnt = chunk_count(count, world, rank)
                got = {}
                for name, comm in comms.items():
                    out = np.full(cnt, SENTINEL, xs[rank].dtype)
                    comm.reduce_scatter(out, xs[rank])
                    check(f"{name} reduce_scatter {dt} n={count}", close_enough(out, ref[off:off + cnt], dt, "SUM"))
                    got[name] = out.tobytes()
                for name in got:
                    check(f"{name} reduce_scatter differs bitwise from the ring, n={count}", got[name] == got["ring"])
        # all_to_all (its header always first, whatever the knob): blocks of different sizes (block p -> q holds count + p + 2q elements), an empty one,
        # and many pieces (the tiny config).
        for count in (0, 1, 300, 4097):
            def blk(p, q):
                return 0 if (world > 2 and p == 0 and q == 1) else count + p + 2 * q
            data = {p: [np.full(blk(p, q), 1000 * p + q, np.int32) for q in range(world)] for p in range(world)}
            send = np.concatenate(data[rank])
            want = np.concatenate([data[p][rank] for p in range(world)])
            for name, comm in comms.items():
                out = np.full(want.size, SENTINEL, np.int32)
                comm.all_to_all(out, send, output_splits=[blk(p, rank) for p in range(world)],
                                input_splits=[blk(rank, q) for q in range(world)])
                tag = f"{name} all_to_all n={count}"
                check(tag, np.array_equal(out, want))
                if name != "ring" and world > 1:
                    path = _path(comm.trace()[-1])
                    check(f"{tag}: algorithm {path}", path in ("direct/simple", "direct/cma"))
        # Order-sensitive floating sums: bit for bit the order model (order_ref) on every path.
        for dt in (np.float16, np.float32, np.float64):
            for count in sorted({1, 7, 13, 5 * world + 1, *_thresholds(world, np.dtype(dt).itemsize)}):
                xs = []
                for p in range(world):
                    rng = np.random.default_rng(31 * count + p)
                    xs.append((rng.standard_normal(count) * 10.0 ** rng.uniform(-3, 3, count)).astype(dt))
                want = ordered_sum(xs).tobytes()
                for name, comm in comms.items():
                    y = xs[rank].copy()
                    comm.all_reduce(y)
                    check(f"{name} order model {np.dtype(dt).name} n={count}", y.tobytes() == want)
    except Exception:  # noqa: BLE001
        fails.append(f"rank {rank}: " + traceback.format_exc())
    finally:
        for c in comms.values():
            c.close()
    return fails, digests


# ---------------- mismatches through the in-slot path ----------------

def _attempt(fn):
    try:
        fn()
        return ("no error", "")
    except ringcomm.MismatchError as e:
        return ("MismatchError", str(e))
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))


def mismatch_cases(rank, world):
    """Each scenario: rank 0 (or the last rank) calls something that differs from the others'
    small all_reduce. Returns per scenario (name, outcome, message, outputs untouched, the
    all_reduce after it correct)."""
    out = []
    comms = {
        "inslot": init_under_env(rank, world, "inslot", {"RINGCOMM_LL_MAX_BYTES": "0"}),
        "ll": init_under_env(rank, world, "ll", {}),
        "tiny": init_under_env(rank, world, "tiny", CONFIGS["tiny"]),
        "ring_tiny": init_under_env(rank, world, "ring_tiny", CONFIGS["ring_tiny"]),
        # rank 0 without the in-slot path, the others with it: the headers say so and differ
        "mixed": init_under_env(rank, world, "mixed", {"RINGCOMM_HEADER_IN_SLOT": "off" if rank == 0 else "on",
                                               "RINGCOMM_LL_MAX_BYTES": "0"}),
        # rank 0's all_reduce forced direct (in slot), the others' auto (the LL outbox)
        "mixed_ll": init_under_env(rank, world, "mixed_ll", {"RINGCOMM_ALGO": "direct" if rank == 0 else "auto"}),
    }
    thr = int(ringcomm.core.config.knob("RINGCOMM_DIRECT_MAX_BYTES")) // (4 * (world - 1))
    last = world - 1

    def after_ok(comm, n=9):
        x = np.full(n, rank + 1.0, np.float32)
        comm.all_reduce(x)
        return bool((x == world * (world + 1) / 2).all())

    def scenario(name, comm_name, call):
        # every scenario of the in-slot communicator runs again on the LL outbox's
        if comm_name == "inslot":
            one_scenario(name + " (ll)", "ll", call)
        one_scenario(name, comm_name, call)

    def one_scenario(name, comm_name, call):
        comm = comms[comm_name]
        guard = np.full(1 << 16, SENTINEL, np.float32)
        res = _attempt(lambda: call(comm, guard))
        untouched = bool((guard == SENTINEL).all())
        if comm_name in ("mixed", "mixed_ll"):
            # every small all_reduce of this communicator mismatches (its ranks' headers say they
            # take different paths); it stays usable for everything else
            again = _attempt(lambda: ar(6)(comm, guard))[0] == "MismatchError"
            comm.barrier()
            if comm_name == "mixed":
                # every all_reduce's protocol differs; the all_to_all's is the same on every rank
                y = np.zeros(3 * world, np.float32)
                comm.all_to_all(y, np.full(3 * world, rank + 1.0, np.float32))
                after = again and bool((y == np.repeat(np.arange(1, world + 1, dtype=np.float32), 3)).all())
            else:
                # the same algorithm on every rank: the direct all_reduce above the LL outbox's size
                x = np.full(thr, rank + 1.0, np.float32)
                comm.all_reduce(x)
                after = again and bool((x == world * (world + 1) / 2).all())
        else:
            after = after_ok(comm)
        out.append((name, rank, res[0], res[1], untouched, after))

    def ar(count, dtype=np.float32, op="SUM"):
        # out of place into a guarded buffer: nothing may be written there
        def call(comm, guard):
            x = np.full(count, rank + 1, dtype)
            keep = x.copy()
            y = guard[:count].view(np.float32) if dtype == np.float32 else np.full(count, SENTINEL, dtype)
            try:
                comm.all_reduce(x, op=op, output=y)
            finally:
                if not np.array_equal(x, keep):
                    guard[0] = 0  # the input changed: reported as "written"
                if dtype != np.float32 and not (y == SENTINEL).all():
                    guard[0] = 0
        return call

    def by_rank(fns):
        return lambda comm, guard: fns(rank)(comm, guard)

    scenario("counts differ", "inslot", by_rank(lambda r: ar(5 if r == 0 else 6)))
    scenario("dtypes differ", "inslot", by_rank(lambda r: ar(6, np.float64 if r == 0 else np.float32)))
    scenario("ops differ", "inslot", by_rank(lambda r: ar(6, op="MAX" if r == 0 else "SUM")))
    scenario("in-slot vs ring", "inslot", by_rank(lambda r: ar(thr + 1 if r == 0 else 6)))
    scenario("in-slot vs empty", "inslot", by_rank(lambda r: ar(0 if r == 0 else 6)))

    def bcast(comm, guard):
        comm.broadcast(guard[:6], root=0)
    scenario("in-slot vs broadcast", "inslot", lambda comm, guard: (bcast if rank == last else ar(6))(comm, guard))
    scenario("in-slot vs barrier", "inslot",
             lambda comm, guard: comm.barrier() if rank == last else ar(6)(comm, guard))

    def bad_args(comm, guard):
        buf = np.zeros(16, np.float32)
        comm.all_reduce(buf[0:8], output=buf[4:12])  # partial overlap: refused on this rank
    scenario("in-slot vs rejected arguments", "inslot",
             lambda comm, guard: bad_args(comm, guard) if rank == last else ar(6)(comm, guard))
    scenario("in-slot vs header exchange first (knob differs)", "mixed", ar(6))
    scenario("ll vs in-slot (knob differs)", "mixed_ll", ar(6))
    scenario("counts differ, many pieces", "tiny", by_rank(lambda r: ar(300 if r == 0 else 301)))
    scenario("ring counts differ, many pieces", "ring_tiny", by_rank(lambda r: ar(300 if r == 0 else 301)))
    scenario("in-slot many pieces vs broadcast", "tiny",
             lambda comm, guard: (bcast if rank == last else ar(300))(comm, guard))
    def bc(count, root, dtype=np.float32):
        # non-roots receive into the guarded buffer; the root sends ones (never the sentinel)
        def call(comm, guard):
            buf = np.ones(count, dtype) if rank == root else guard[:count].view(np.float32)
            comm.broadcast(buf, root=root)
        return call

    scenario("broadcast counts differ", "inslot", by_rank(lambda r: bc(5 if r == 0 else 6, 0)))
    scenario("broadcast roots differ", "inslot", by_rank(lambda r: bc(6, 0 if r == 0 else 1)))
    scenario("broadcast in-slot vs chain", "inslot", by_rank(lambda r: bc(thr + 1 if r == 0 else 6, 0)))
    scenario("broadcast in-slot vs all_reduce", "inslot",
             lambda comm, guard: (bc(6, last) if rank == last else ar(6))(comm, guard))
    scenario("broadcast counts differ, many pieces", "tiny", by_rank(lambda r: bc(300 if r == 0 else 301, last)))

    def rs(count):
        # this rank's chunk into the guarded buffer
        def call(comm, guard):
            from ringcomm.core.front import chunk_count
            comm.reduce_scatter(guard[:chunk_count(count, world, rank)], np.full(count, rank + 1, np.float32))
        return call

    scenario("reduce_scatter counts differ", "inslot", by_rank(lambda r: rs(5 * world if r == 0 else 5 * world + 1)))
    scenario("reduce_scatter vs all_reduce", "inslot",
             lambda comm, guard: (rs(6 * world) if rank == last else ar(6))(comm, guard))
    scenario("reduce_scatter counts differ, many pieces", "tiny",
             by_rank(lambda r: rs(300 * world if r == 0 else 300 * world + 1)))
    scenario("reduce_scatter ring counts differ, many pieces", "ring_tiny",
             by_rank(lambda r: rs(300 * world if r == 0 else 300 * world + 1)))
    # the chains and the all_gather ring hand their first piece off with the header
    big = thr + 1  # above the direct range: the broadcast's chain
    scenario("broadcast chain counts differ", "inslot", by_rank(lambda r: bc(big if r == 0 else big + 1, 0)))
    scenario("broadcast chain vs all_reduce", "inslot",
             lambda comm, guard: (bc(big, last) if rank == last else ar(6))(comm, guard))

    def red(count, root):
        # the root reduces into the guarded buffer
        def call(comm, guard):
            x = np.full(count, rank + 1, np.float32)
            comm.reduce(x, root=root, output=guard[:count] if rank == root else None)
        return call

    scenario("reduce counts differ", "inslot", by_rank(lambda r: red(5 if r == 0 else 6, 0)))
    scenario("reduce roots differ", "inslot", by_rank(lambda r: red(6, 0 if r == 0 else last)))
    scenario("reduce counts differ, many pieces", "tiny", by_rank(lambda r: red(300 if r == 0 else 301, last)))

    def ag(mine, total):
        def call(comm, guard):
            comm.all_gather(guard[:total], np.full(mine, rank + 1, np.float32))
        return call

    # rank 0's block is one short of what every output holds; then an empty block on rank 0
    scenario("all_gather blocks differ", "inslot", by_rank(lambda r: ag(5 if r == 0 else 6, 6 * world)))
    scenario("all_gather empty block vs all_reduce", "inslot",
             lambda comm, guard: (ar(6) if rank == last else ag(0 if rank == 0 else 6, 6 * (world - 1)))(comm, guard))
    scenario("all_gather blocks differ, many pieces", "tiny",
             by_rank(lambda r: ag(300 if r == 0 else 301, 301 * world)))
    def a2a(count):
        def call(comm, guard):
            comm.all_to_all(guard[:count * world], np.full(count * world, rank + 1, np.float32))
        return call

    # round 1's first message went with the header: drained by its reader
    scenario("all_to_all vs all_reduce", "inslot", lambda comm, guard: (ar(6) if rank == last else a2a(5))(comm, guard))
    scenario("all_to_all vs broadcast, many pieces", "tiny",
             lambda comm, guard: (bcast if rank == last else a2a(300))(comm, guard))
    ok = all(after_ok(comms[c], 300) for c in ("inslot", "ll", "tiny", "ring_tiny"))
    for c in comms.values():
        c.close()
    return out, ok

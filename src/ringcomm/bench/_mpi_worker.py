"""The MPI phase of ``python -m ringcomm.bench``: started by the CLI as

    mpiexec -n N python -m ringcomm.bench._mpi_worker CONFIG.json OUT.pickle

Each MPI rank runs the same sweep through the same harness as the spawned ringcomm/gloo ranks
(same sizes, same checks, same timing policy), only with the ``mpi`` runner; rank 0 gathers
every rank's records and writes them to OUT.pickle for the parent to merge into its tables.

MPI runs in its own processes because mpi4py's world only exists under its launcher; the
phases run one after the other, never at the same time, so neither disturbs the other's timing.
Imports neither torch nor the ringcomm extension, except torch.distributed's gloo for the
separator of ``--arrival apart|skew`` (the same barrier the other libraries' calls follow).
"""
from __future__ import annotations

import json
import os
import pickle
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: mpiexec -n N python -m ringcomm.bench._mpi_worker CONFIG.json OUT.pickle",
              file=sys.stderr)
        return 2
    cfg_path, out_path = argv
    with open(cfg_path) as f:
        cfg = json.load(f)
    from mpi4py import MPI
    from .harness import rank_sweep

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    if world != cfg["world_size"]:
        raise SystemExit(f"mpiexec started {world} ranks, the bench asked for {cfg['world_size']}")
    result = rank_sweep(rank, world, cfg, ["mpi"], desc="mpi")
    results = comm.gather(result, root=0)
    if rank == 0:
        tmp = out_path + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(results, f)
        os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One rank of a peer phase started by an MPI launcher (the ``impi`` peer):

    LAUNCHER -n N python -m ringcomm.bench.drivers.worker CONFIG.json OUT PEER

The rank and world size come from the launcher's PMI variables (``PMI_RANK``, ``PMI_SIZE``); the
rank runs the bench's sweep (``harness.rank_sweep``) with that peer's runner and writes its
records to ``OUT.<rank>`` (a pickle, written whole then renamed), for the parent to merge.
"""
from __future__ import annotations

import json
import os
import pickle
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    cfg_path, out_path, peer = argv
    with open(cfg_path) as f:
        cfg = json.load(f)
    try:
        rank, world = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    except (KeyError, ValueError):
        raise SystemExit("not started by a PMI launcher (PMI_RANK / PMI_SIZE unset)") from None
    if world != cfg["world_size"]:
        raise SystemExit(f"the launcher started {world} ranks, the bench asked for "
                         f"{cfg['world_size']}")
    from ..harness import rank_sweep
    result = rank_sweep(rank, world, cfg, [peer], desc=peer)
    tmp = f"{out_path}.{rank}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, f"{out_path}.{rank}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

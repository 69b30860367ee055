python -m ringcomm.bench -np 4 -b 1K -e 64M -f 4 --ops all --time-budget 0.02 --peers gloo,mpi,deepspeed,oneccl,impi --tune --arrival b2b --json results/2026-12-07/peers/4ranks_b2b_float32.json

python -m ringcomm.bench -np 2 -b 1K -e 64M -f 4 --ops all --time-budget 0.02 --peers gloo,mpi,deepspeed,oneccl,impi --tune --arrival apart --json results/2026-12-07/peers/2ranks_apart_float32.json

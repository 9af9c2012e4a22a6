#!/bin/sh
# The runtime under Debian's torchrun (python3-torch), when it is installed:
# with --standalone (rank 0 hosts the store) the collectives work; with
# torchrun's default static rendezvous (TORCHELASTIC_USE_AGENT_STORE=True) the
# workers stop with an error that says what to use instead, and torchrun's own
# summary shows it, read from our error file.
# (Debian's torchrun needs -r 1 -t 1 under Python 3.11: its defaults crash.)
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
RANKBIN=$HELPERS/comm_rank
[ -x "$RANKBIN" ] || skip_all "comm_rank helper not built"
/usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || skip_all "python3-torch not installed"
torchrun() { /usr/bin/python3 -m torch.distributed.run --monitor_interval 0.1 -r 1 -t 1 "$@"; }

out=$(torchrun --standalone --nnodes 1 --nproc_per_node 2 --log_dir "$T/logs" --no_python \
    "$RANKBIN" check 1048576 2>&1)
is "$?" 0 "torchrun --standalone: both workers succeed"
like "$out" "\[default0\]:rank 0: all collective checks passed" "rank 0 passed every check"
like "$out" "\[default1\]:rank 1: all collective checks passed" "rank 1 passed every check"

if [ -x "$TRAIN" ]; then
    out=$(torchrun --standalone --nnodes 1 --nproc_per_node 2 --log_dir "$T/logs3" --no_python \
        "$TRAIN" --data synthetic --model mlp --steps 20 --check-replicas 5 2>&1)
    is "$?" 0 "train under torchrun --standalone: 2 processes train"
    like "$out" "\[default0\]:train: done: test accuracy" "and report the test accuracy"
fi

port=$(free_port)
out=$(torchrun --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" \
    --log_dir "$T/logs2" --no_python "$RANKBIN" info 2>&1)
rc=$?
ok test "$rc" -ne 0
like "$out" "TORCHELASTIC_USE_AGENT_STORE=True.*--rdzv_backend=c10d" \
    "static rendezvous: the workers say which torchrun option to use"
like "$out" "traceback : comm_rank \(rank 0 on [^ ]+, pid [0-9]+\): TORCHELASTIC_USE_AGENT_STORE" \
    "torchrun's failure summary reads our error file"
done_testing

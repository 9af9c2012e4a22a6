#!/bin/sh
# SkyPilot's variables read as Slurm's: two nodes on loopback, each with
# SKYPILOT_NUM_NODES=2, its SKYPILOT_NODE_RANK and SKYPILOT_NODE_IPS (node 0's
# address first), as SkyPilot's `run` section starts one command per node,
# with no --nnodes, --node_rank or --master_addr: a static rendezvous of 2
# nodes whose GROUP_RANK is SKYPILOT_NODE_RANK and whose run id is
# skypilot-<SKYPILOT_TASK_ID>, on one node too. (Inconsistent variables:
# test_hostlist.)
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\|SLURM_[A-Z_]*\|SKYPILOT_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

port=$(free_port)
IPS=$(printf '127.0.0.1\n127.0.0.1\n')
for r in 1 0; do
    SKYPILOT_NUM_NODES=2 SKYPILOT_NODE_RANK=$r SKYPILOT_NODE_IPS=$IPS SKYPILOT_NUM_GPUS_PER_NODE=0 \
        SKYPILOT_TASK_ID=sky-2026-11-28-05-00-00-000001_mg_1 \
        bg "$MGLAUNCH" --nproc_per_node 2 --master_port "$port" --log_dir "$T/logs$r" "$FW" print-env \
        >"$T/n$r.out" 2>"$T/n$r.err"
    eval "p$r=\$!"
done
wait "$p0"
rc0=$?
wait "$p1"
rc1=$?
is "$rc0 $rc1" "0 0" "two nodes from SKYPILOT_*: both succeed"
[ "$rc0 $rc1" = "0 0" ] || sed 's/^/# /' "$T/n0.err" "$T/n1.err"
like "$(cat "$T/n0.err")" "SkyPilot: --nnodes 2, --node_rank 0, --master_addr 127.0.0.1 \\(from SKYPILOT_\\*" \
    "node 0 says where its settings come from"
grp() { sed -n "s/^\\(\\[default[0-9]\\]:\\)\\{0,1\\}GROUP_RANK=//p" "$@" | sort -u | tr '\n' ' '; }
is "$(grp "$T/n0.out" "$T"/logs0/*/attempt_0/*/stdout.log)" "0 " "node 0: GROUP_RANK 0"
is "$(grp "$T/n1.out" "$T"/logs1/*/attempt_0/*/stdout.log)" "1 " "node 1: GROUP_RANK 1"
is "$(sed -n 's/^\(\[default[0-9]\]:\)\{0,1\}WORLD_SIZE=//p' "$T"/logs*/*/attempt_0/*/stdout.log | sort -u)" 4 \
    "one world of 4"
ok test -d "$T/logs0/skypilot-sky-2026-11-28-05-00-00-000001_mg_1"

# One node: the run is still named after the task.
SKYPILOT_NUM_NODES=1 SKYPILOT_NODE_RANK=0 SKYPILOT_NODE_IPS=127.0.0.1 SKYPILOT_TASK_ID=sky-one_c_1 \
    "$MGLAUNCH" --nproc_per_node 1 --log_dir "$T/one" "$FW" exit 0 >"$T/out" 2>&1
is $? 0 "a SkyPilot cluster of one node: runs"
ok test -d "$T/one/skypilot-sky-one_c_1"

done_testing

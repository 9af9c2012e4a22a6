#!/bin/sh
# The worker environment (docs/environment.md) for nproc 1 to 8, the GPU
# mapping as the worker sees it, PET_ fallbacks with the command line winning,
# the ${local_rank} macro, and how the program is found and run.
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
unset OMP_NUM_THREADS CUDA_VISIBLE_DEVICES PYTHON_EXEC NCCL_ASYNC_ERROR_HANDLING \
    TORCH_NCCL_ASYNC_ERROR_HANDLING
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

# envvar FILE NAME: the value of NAME in a print-env dump
envvar() { sed -n "s/^$2=//p" "$1"; }

for n in 1 2 3 8; do
    "$MGLAUNCH" --log_dir "$T/logs" --rdzv_id "env$n" --nproc_per_node "$n" "$FW" print-env \
        >"$T/out" 2>"$T/err"
    is $? 0 "nproc $n: success"
    port=""
    for r in $(seq 0 $((n - 1))); do
        f=$T/logs/env$n/attempt_0/$r/stdout.log
        got=""
        for kv in "RANK=$r" "LOCAL_RANK=$r" "GROUP_RANK=0" "ROLE_RANK=$r" "ROLE_NAME=default" \
            "LOCAL_WORLD_SIZE=$n" "WORLD_SIZE=$n" "GROUP_WORLD_SIZE=1" "ROLE_WORLD_SIZE=$n" \
            "MASTER_ADDR=127.0.0.1" "TORCHELASTIC_RESTART_COUNT=0" "TORCHELASTIC_MAX_RESTARTS=0" \
            "TORCHELASTIC_RUN_ID=env$n" "TORCHELASTIC_USE_AGENT_STORE=False" \
            "NCCL_ASYNC_ERROR_HANDLING=1" "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" \
            "TORCHELASTIC_ERROR_FILE=$T/logs/env$n/attempt_0/$r/error.json"; do
            grep -qx "$kv" "$f" || got="$got missing:$kv"
        done
        is "$got" "" "nproc $n rank $r: torchrun's variables and values"
        p=$(envvar "$f" MASTER_PORT)
        like "$p" '^[1-9][0-9]*$' "nproc $n rank $r: MASTER_PORT is a port"
        [ -z "$port" ] && port=$p
        is "$p" "$port" "nproc $n rank $r: same MASTER_PORT for every rank"
        if [ "$n" -gt 1 ]; then
            is "$(envvar "$f" OMP_NUM_THREADS)" 1 "nproc $n rank $r: OMP_NUM_THREADS=1"
        else
            is "$(envvar "$f" OMP_NUM_THREADS)" "" "nproc 1: OMP_NUM_THREADS left unset"
        fi
        is "$(envvar "$f" CUDA_VISIBLE_DEVICES)" "" "nproc $n rank $r: no GPU mapping asked"
    done
done

OMP_NUM_THREADS=7 "$MGLAUNCH" --log_dir "$T/logs" --rdzv_id omp --nproc_per_node 2 "$FW" \
    print-env >/dev/null 2>&1
is "$(envvar "$T/logs/omp/attempt_0/1/stdout.log" OMP_NUM_THREADS)" 7 "OMP_NUM_THREADS kept"

# ---- GPU mapping: CUDA_VISIBLE_DEVICES lists gpu_ids in local-rank order, so
# device LOCAL_RANK is gpu_ids[LOCAL_RANK] for every worker.
"$MGLAUNCH" --log_dir "$T/logs" --rdzv_id gpu1 --nproc_per_node 2 --gpu_ids 3,1 "$FW" print-env \
    >/dev/null 2>&1
for r in 0 1; do
    f=$T/logs/gpu1/attempt_0/$r/stdout.log
    cvd=$(envvar "$f" CUDA_VISIBLE_DEVICES)
    lr=$(envvar "$f" LOCAL_RANK)
    is "$cvd" "3,1" "rank $r sees the listed GPUs in order"
    dev=$(echo "$cvd" | cut -d, -f$((lr + 1)))
    is "$dev" "$(echo 3,1 | cut -d, -f$((r + 1)))" "rank $r: device LOCAL_RANK is gpu_ids[$r]"
done
"$MGLAUNCH" --log_dir "$T/logs" --rdzv_id gpu2 --nproc_per_node 2 --gpu-ids 2 --gpu-ids 0 "$FW" \
    print-env >/dev/null 2>&1
is "$(envvar "$T/logs/gpu2/attempt_0/1/stdout.log" CUDA_VISIBLE_DEVICES)" "2,0" \
    "repeated --gpu-ids (DeepLIIF style)"
"$MGLAUNCH" --log_dir "$T/logs" --rdzv_id gpu3 --nproc_per_node 2 --gpu_ids 0,1,2,3 "$FW" \
    print-env >/dev/null 2>&1
is "$(envvar "$T/logs/gpu3/attempt_0/0/stdout.log" CUDA_VISIBLE_DEVICES)" "0,1" \
    "a longer list: the first nproc ids"
# GPU UUIDs are long: 16 of them (over 600 bytes) reach every worker whole
uuids=$(for i in $(seq 10 25); do printf 'GPU-%s-aaaa-bbbb-cccc-dddddddddddd,' "0000${i}00"; done)
uuids=${uuids%,}
"$MGLAUNCH" --log_dir "$T/logs" --rdzv_id gpu6 --nproc_per_node 16 --gpu_ids "$uuids" "$FW" \
    print-env >/dev/null 2>&1
is "$(envvar "$T/logs/gpu6/attempt_0/15/stdout.log" CUDA_VISIBLE_DEVICES)" "$uuids" \
    "16 GPU UUIDs ($(printf %s "$uuids" | wc -c) bytes) arrive whole"
PET_GPU_IDS=5,4 "$MGLAUNCH" --log_dir "$T/logs" --rdzv_id gpu4 --nproc_per_node gpu "$FW" \
    print-env >/dev/null 2>&1
is "$?" 0 "--nproc_per_node gpu with PET_GPU_IDS"
is "$(ls "$T/logs/gpu4/attempt_0" | wc -l | tr -d ' ')" 2 "one worker per listed GPU"
is "$(envvar "$T/logs/gpu4/attempt_0/1/stdout.log" CUDA_VISIBLE_DEVICES)" "5,4" "PET_GPU_IDS"
CUDA_VISIBLE_DEVICES=6,7 "$MGLAUNCH" --log_dir "$T/logs" --rdzv_id gpu5 --nproc_per_node 2 "$FW" \
    print-env >/dev/null 2>&1
is "$(envvar "$T/logs/gpu5/attempt_0/1/stdout.log" CUDA_VISIBLE_DEVICES)" "6,7" \
    "without --gpu_ids an inherited CUDA_VISIBLE_DEVICES is left alone"

# ---- PET_ fallbacks, command line wins
PET_NPROC_PER_NODE=3 PET_MAX_RESTARTS=4 PET_RDZV_ID=petjob PET_MASTER_ADDR=localhost \
    PET_MASTER_PORT=23456 PET_ROLE=trainer PET_LOG_DIR="$T/logs" "$MGLAUNCH" "$FW" print-env \
    >/dev/null 2>&1
is "$?" 0 "configured only through PET_ variables"
f=$T/logs/petjob/attempt_0/2/stdout.log
is "$(envvar "$f" WORLD_SIZE)" 3 "PET_NPROC_PER_NODE"
is "$(envvar "$f" TORCHELASTIC_MAX_RESTARTS)" 4 "PET_MAX_RESTARTS"
is "$(envvar "$f" MASTER_ADDR)" localhost "PET_MASTER_ADDR"
is "$(envvar "$f" MASTER_PORT)" 23456 "PET_MASTER_PORT"
is "$(envvar "$f" ROLE_NAME)" trainer "PET_ROLE"
PET_NPROC_PER_NODE=3 PET_RDZV_ID=petjob "$MGLAUNCH" --log_dir "$T/logs" --nproc-per-node=2 \
    --rdzv_id=cmdjob --master_port 23457 --role=boss "$FW" print-env >/dev/null 2>&1
is "$(ls "$T/logs/cmdjob/attempt_0" | wc -l | tr -d ' ')" 2 "--nproc-per-node=2 beats PET_"
f=$T/logs/cmdjob/attempt_0/1/stdout.log
is "$(envvar "$f" TORCHELASTIC_RUN_ID)" cmdjob "--rdzv_id= beats PET_RDZV_ID"
is "$(envvar "$f" MASTER_PORT)" 23457 "--master_port"
is "$(envvar "$f" ROLE_NAME)" boss "--role="
ok test ! -e "$T/logs/petjob/attempt_1" # the overridden id got no new attempt

# ---- arguments: torchrun's ${local_rank} macro
out=$("$MGLAUNCH" --nproc_per_node 2 --local_ranks_filter 1 "$FW" out 'lr=${local_rank} $$x' \
    2>/dev/null)
is "$out" 'lr=1 $x' "\${local_rank} substituted per worker, \$\$ -> \$"

# ---- the program: PATH, then next to mglaunch; .py under python3 -u; PYTHON_EXEC; -m
mkdir -p "$T/bin" "$T/pkg"
cp "$MGLAUNCH" "$T/bin/mglaunch"
cp "$FW" "$T/bin/faketrain"
out=$(PATH=/usr/bin:/bin "$T/bin/mglaunch" faketrain out found-next-to-mglaunch 2>&1)
is "$out" found-next-to-mglaunch "a bare name is looked up next to mglaunch"
cat >"$T/w.py" <<'EOF'
import os, sys
print("py", int(sys.stdout.write_through), os.environ["RANK"], " ".join(sys.argv[1:]))
EOF
out=$("$MGLAUNCH" --nproc_per_node 2 --local_ranks_filter 0 "$T/w.py" a b 2>&1)
is "$out" "py 1 0 a b" ".py runs under python3 -u with its arguments"
cat >"$T/bin/mypython" <<'EOF'
#!/bin/sh
echo "wrapped python: $*"
EOF
chmod +x "$T/bin/mypython"
out=$(PYTHON_EXEC=$T/bin/mypython "$MGLAUNCH" "$T/w.py" x 2>&1)
is "$out" "wrapped python: -u $T/w.py x" "PYTHON_EXEC is the interpreter"
echo 'import os; print("module", __name__, os.environ["LOCAL_RANK"])' >"$T/pkg/mgmod.py"
out=$(cd "$T/pkg" && "$MGLAUNCH" -m mgmod 2>&1)
is "$out" "module __main__ 0" "-m runs python3 -u -m"
cp "$FW" "$T/bin/tool.py"
out=$("$MGLAUNCH" --no_python "$T/bin/tool.py" out direct 2>&1)
is "$out" direct "--no_python runs a .py program directly"

# ---- without --log_dir: the private default directory, error files only
"$MGLAUNCH" --rdzv_id deflt --nproc_per_node 2 "$FW" print-env >"$T/out" 2>&1
d=$T/mglaunch-$(id -u)/deflt/attempt_0
ok test -d "$d/1"
grep -q "^TORCHELASTIC_ERROR_FILE=$d/1/error.json\$" "$T/out"
is $? 0 "TORCHELASTIC_ERROR_FILE points into the default directory"
ok test ! -e "$d/0/stdout.log" # not saved without --log_dir or -r/-t
done_testing

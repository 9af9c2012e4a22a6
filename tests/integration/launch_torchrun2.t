#!/bin/sh
# torchrun 2.x's flags and variables, each by its effect on the workers:
# --signals-to-handle, --virtual-local-rank, --numa-binding (the message on a
# machine without GPUs; the placement itself is test_launch_numa's),
# --event-log-handler, --nproc-per-node xpu, --run_path, --logs_specs,
# --duplicate-std*-filters, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE and
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT; --exit-barrier-timeout and
# TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT (pytorch/pytorch#195543).
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset CUDA_VISIBLE_DEVICES TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE TORCH_ELASTIC_SHUTDOWN_TIMEOUT
unset TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT
L=$T/logs
DFL="env --default-signal=INT,QUIT"

# ---- --signals-to-handle: a listed SIGUSR1 stops the workers (with it) and the run
bg "$MGLAUNCH" --signals-to-handle SIGTERM,SIGUSR1 --nproc_per_node 2 --log_dir "$L" \
    --rdzv_id usr "$FW" trap USR1 "$T/usr.got.\${local_rank}" touch "$T/usr.\${local_rank}" \
    sleep 30 >/dev/null 2>"$T/err"
pid=$!
ok wait_for 10 files_ready 2 "$T/usr"
kill -USR1 "$pid"
ok wait_for 10 files_ready 2 "$T/usr.got"
kill -USR1 "$pid" # a second one kills at once, as for SIGTERM
wait "$pid"
is $? 138 "SIGUSR1 listed: the run stops, exit 128+10"
like "$(cat "$T/err")" "SIGUSR1: stopping the workers" "said so"
# without it in the list (mglaunch's default) SIGUSR1 is only passed on
bg "$MGLAUNCH" --nproc_per_node 1 "$FW" trap USR1 "$T/usr2.got.0" touch "$T/usr2.0" sleep 1 \
    >/dev/null 2>&1
pid=$!
ok wait_for 10 files_ready 1 "$T/usr2"
kill -USR1 "$pid"
wait "$pid"
is $? 0 "SIGUSR1 not listed: passed on, the run completes"
is "$(cat "$T/usr2.got.0")" USR1 "  the worker got it"
# a stop signal left out of the list is not handled: its default action ends
# mglaunch (SIGHUP: a SIGQUIT would dump core), and the sentinel takes the
# workers with it
bg "$MGLAUNCH" --signals-to-handle SIGTERM --nproc_per_node 1 "$FW" pidfile "$T/q.pid" \
    touch "$T/q.0" sleep 30 >/dev/null 2>"$T/err"
pid=$!
ok wait_for 10 files_ready 1 "$T/q"
kill -HUP "$pid"
{ wait "$pid"; } 2>/dev/null # bash would print "Hangup" for the job's death on the TAP stream
is $? 129 "SIGHUP not listed: mglaunch dies of it"
unlike "$(cat "$T/err")" "SIGHUP" "  without handling it (which would say so)"
wpid=$(cat "$T/q.pid")
gone() { ! kill -0 "$wpid" 2>/dev/null; }
ok wait_for 5 gone
"$MGLAUNCH" --signals-to-handle SIGTERM,SIGNOPE true >"$T/out" 2>"$T/err"
is "$?" 2 "an unknown signal name: exit 2"
like "$(cat "$T/err")" "invalid value 'SIGTERM,SIGNOPE' for --signals-to-handle: 'SIGNOPE' is not a signal name" \
    "  named"

# ---- --virtual-local-rank: LOCAL_RANK 0 everywhere, one GPU each
out=$(CUDA_VISIBLE_DEVICES=4,6 "$MGLAUNCH" --nproc_per_node 2 --virtual-local-rank --no_python \
    sh -c 'echo "r=$RANK lr=$LOCAL_RANK cvd=$CUDA_VISIBLE_DEVICES"' | sort)
is "$out" "r=0 lr=0 cvd=4
r=1 lr=0 cvd=6" "--virtual-local-rank: LOCAL_RANK=0, CUDA_VISIBLE_DEVICES its own entry"
out=$("$MGLAUNCH" --nproc_per_node 2 --virtual_local_rank --gpu_ids 3,1 --no_python \
    sh -c 'echo "lr=$LOCAL_RANK cvd=$CUDA_VISIBLE_DEVICES"' | sort)
is "$out" "lr=0 cvd=1
lr=0 cvd=3" "  with --gpu_ids: each worker sees its id"
CUDA_VISIBLE_DEVICES=4 "$MGLAUNCH" --nproc_per_node 2 --virtual-local-rank true >"$T/out" 2>"$T/err"
is "$?" 2 "  more workers than visible GPUs: exit 2"
like "$(cat "$T/err")" "local rank 1 has no GPU: CUDA_VISIBLE_DEVICES='4' lists fewer than 2" "  why"

# ---- --numa-binding on a machine without GPUs: say so
if [ ! -d /proc/driver/nvidia/gpus ] && ! grep -qs 0x10de /sys/bus/pci/devices/*/vendor; then
    "$MGLAUNCH" --numa-binding node true >"$T/out" 2>"$T/err"
    is "$?" 2 "--numa-binding without GPUs: exit 2"
    like "$(cat "$T/err")" "^mglaunch: --numa-binding: no NVIDIA GPU in .*the binding follows each worker's GPU" \
        "  and why"
else
    # With GPUs: each worker runs on its GPU's NUMA node's CPUs.
    out=$("$MGLAUNCH" --numa-binding node --no_python sh -c 'grep Cpus_allowed_list /proc/self/status')
    like "$out" "Cpus_allowed_list:" "--numa-binding node: the worker runs ($out)"
fi
"$MGLAUNCH" --numa-binding rack true >"$T/out" 2>"$T/err"
like "$(cat "$T/err")" "invalid value 'rack' for --numa-binding: expected node, socket, exclusive or core-complex" \
    "--numa-binding rack: the modes"

# ---- --event-log-handler: accepted; a named one is said to have no effect
"$MGLAUNCH" --event-log-handler null true >"$T/out" 2>"$T/err"
is "$?:$(cat "$T/err")" "0:" "--event-log-handler null: silent"
"$MGLAUNCH" --event-log-handler console --log_dir "$L" --rdzv_id ev true >"$T/out" 2>"$T/err"
is "$?" 0 "--event-log-handler console: the run goes on"
like "$(cat "$T/err")" "no effect; mglaunch writes its own event log \\($L/ev/events.jsonl" \
    "  and where mg's event log is"
ok test -s "$L/ev/events.jsonl"

# ---- --nproc-per-node xpu
if ls /sys/class/drm/card[0-9]*/device/driver >/dev/null 2>&1; then
    diag "this machine has DRM cards: the xpu count is test_launch_numa's"
else
    "$MGLAUNCH" --nproc-per-node xpu true >"$T/out" 2>"$T/err"
    is "$?" 2 "--nproc-per-node xpu without an Intel GPU: exit 2"
    like "$(cat "$T/err")" "invalid value 'xpu' for --nproc-per-node: no Intel GPU found" "  why"
fi

# ---- --run_path: the program runs under python3 whatever its name (not --no_python)
if [ -x /usr/bin/python3 ]; then
    printf 'import sys, os\nprint("py", sys.argv[1], os.environ["RANK"])\n' >"$T/script"
    out=$(PYTHON_EXEC=/usr/bin/python3 "$MGLAUNCH" --run_path --no_python "$T/script" hello)
    is "$out" "py hello 0" "--run_path: a script without .py runs under python, over --no_python"
fi

# ---- --logs_specs: what to use instead
"$MGLAUNCH" --logs_specs custom true >"$T/out" 2>"$T/err"
is "$?" 2 "--logs_specs: exit 2"
like "$(cat "$T/err")" "names a Python class .* use --log_dir, -r/-t" "  and what to use instead"

# ---- --duplicate-stdout-filters / --duplicate-stderr-filters
"$MGLAUNCH" --nproc_per_node 2 -t 3 --log_dir "$L" --rdzv_id dup \
    --duplicate-stdout-filters 'loss,a,,b' --duplicate-stderr-filters warn "$FW" \
    out "loss 1.0" out "acc 0.5" out "a,b" err "warning: x" err "info" >"$T/out" 2>"$T/err"
is "$?" 0 "--duplicate-std*-filters: the run succeeds"
is "$(sort "$L/dup/attempt_0/filtered_stdout.log")" "[default0]:a,b
[default0]:loss 1.0
[default1]:a,b
[default1]:loss 1.0" "  filtered_stdout.log: the tee'd lines that match, with their prefix"
is "$(sort "$L/dup/attempt_0/filtered_stderr.log")" "[default0]:warning: x
[default1]:warning: x" "  filtered_stderr.log"

# ---- TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
out=$(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='<${role_name}:${rank}> ' "$MGLAUNCH" --nproc_per_node 2 \
    "$FW" out hi | sort)
is "$out" "<default:0> hi
<default:1> hi" "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: the console prefix"
out=$(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='<x> ' "$MGLAUNCH" --log_line_prefix_template '[${rank}]' \
    "$FW" out hi)
is "$out" "[0]hi" "  the flag wins"

# ---- TORCH_ELASTIC_SHUTDOWN_TIMEOUT: the grace period before SIGKILL
bg env TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1 "$MGLAUNCH" --log_dir "$L" --rdzv_id grace "$FW" ignore-term \
    touch "$T/g.0" pause >/dev/null 2>"$T/err"
pid=$!
ok wait_for 10 files_ready 1 "$T/g"
kill -TERM "$pid"
wait "$pid"
is $? 143 "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1: stopped"
like "$(cat "$T/err")" "SIGTERM: stopping the workers \\(1 s grace period" "  with a 1 s grace period"
like "$(grep '"event":"kill"' "$L/grace/events.jsonl")" '"reason":"grace period over"' \
    "  then SIGKILL"

# The exit barrier: a node whose workers finished waits for the others at
# most this long (default 300 s). Node 1 finishes at once; node 0, which
# hosts the store, runs on.
for how in flag env; do
    port=$(free_port)
    bg "$MGLAUNCH" --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 --master_port "$port" \
        --rdzv_id "eb$how" --log_dir "$T/logs0" --no_python sleep 60 >"$T/eb0.out" 2>&1
    p0=$!
    if [ $how = flag ]; then
        bg "$MGLAUNCH" --nnodes 2 --node_rank 1 --master_addr 127.0.0.1 --master_port "$port" \
            --rdzv_id "eb$how" --log_dir "$L" --exit-barrier-timeout 1 --no_python true \
            >"$T/eb1.out" 2>&1
    else
        TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT=1 bg "$MGLAUNCH" --nnodes 2 --node_rank 1 \
            --master_addr 127.0.0.1 --master_port "$port" --rdzv_id "eb$how" --log_dir "$L" \
            --no_python true >"$T/eb1.out" 2>&1
    fi
    p1=$!
    wait "$p1"
    is $? 0 "exit barrier of 1 s ($how): the finished node leaves"
    ok alive "$p0" # while the other node's worker still runs
    kill -TERM "$p0"
    wait "$p0"
done
"$MGLAUNCH" --exit-barrier-timeout 0 true >"$T/out" 2>&1
is $? 2 "--exit-barrier-timeout 0: a usage error"
like "$(cat "$T/out")" "invalid value '0' for --exit-barrier-timeout" "  naming the flag"
done_testing

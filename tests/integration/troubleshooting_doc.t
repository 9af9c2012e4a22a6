#!/bin/sh
# docs/troubleshooting.md quotes what the programs print: every line of each
# ```text block marked <!-- check: NAME --> must be a line the real binaries
# print in the case NAME, run here (<...> in the doc stands for what varies).
# timeout: 150
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset MG_RDZV_TOKEN PYTHON_EXEC MG_COMM_TIMEOUT
FW=$HELPERS/fakeworker
DOC=$TOP/docs/troubleshooting.md
O=$T/out
mkdir -p "$O"
skip_case() { echo "$2" >"$O/$1.skip"; }

# ---- the cases
"$MGLAUNCH" --nproc_per_node 2 "$FW" 'if' rank=1 err "ValueError: lr must be positive" \
    'if' rank=1 exit 3 sleep 5 >"$O/failure" 2>&1

P=$(free_port)
bg "$HELPERS/storesrv" --port "$P" --port-file "$T/port.ready"
srv=$!
wait_for 5 test -s "$T/port.ready"
"$MGLAUNCH" --nnodes 2 --node_rank 0 --master_port "$P" --rdzv_conf join_timeout=2 true \
    >"$O/port" 2>&1
"$MGLAUNCH" --nproc_per_node 2 --master_port "$P" "$FW" >"$O/port1" 2>&1
kill "$srv"

"$MGLAUNCH" --nnodes 2 --node_rank 1 --master_addr no-such-host.invalid --master_port "$P" \
    --rdzv_conf join_timeout=4 true >"$O/dns" 2>&1
"$MGLAUNCH" --master_addr '[::1]:29500' true >"$O/brackets" 2>&1

"$MGLAUNCH" --nnodes 2 --node_rank 0 --master_port "$(free_port)" --rdzv_conf join_timeout=7 true \
    >"$O/join" 2>&1
MG_COMM_TIMEOUT=2 "$MGLAUNCH" --nproc_per_node 2 "$HELPERS/comm_rank" hang 1 30 >"$O/comm-hang" 2>&1
"$MGLAUNCH" --nproc_per_node 2 --hang-timeout 2 "$HELPERS/comm_rank" steps 400 1 100 sleep \
    >"$O/watchdog" 2>&1

bg "$MGLAUNCH" --nproc_per_node 2 "$FW" touch "$T/up.\${local_rank}" pause >"$O/sigterm" 2>&1
pid=$!
wait_for 10 test -e "$T/up.1"
kill -TERM "$pid"
wait "$pid"

"$MGLAUNCH" --nproc_per_node 2 -t 3 "$FW" out "step 1 loss 0.5" >"$O/tee" 2>&1
"$MGLAUNCH" --nproc_per_node 1 "$FW" signal SEGV >"$O/segv" 2>&1
"$MGLAUNCH" --nnodes 2 --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$(free_port)" \
    --rdzv_conf join_timeout=1 true >"$O/none" 2>&1

# Debian's torchrun 1.13 under Python 3.11 with its default -r/-t (the crash the doc explains)
if /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null; then
    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 1 --no_python true \
        >"$O/torchrun-crash" 2>&1
else
    skip_case torchrun-crash "no Debian torch"
fi

if command -v python3 >/dev/null; then
    printf 'import mg_no_such_module\n' >"$T/imp.py"
    "$MGLAUNCH" --nproc_per_node 2 "$T/imp.py" >"$O/import" 2>&1
else
    skip_case import "no python3"
fi

# OOM: in a memory cgroup of this test's own (as launch_oom.t)
v1=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' /proc/self/cgroup)
v2=$(sed -n 's/^0::\(.*\)$/\1/p' /proc/self/cgroup)
CG= LIMIT=
if [ "$(id -u)" = 0 ] && [ -n "$v1" ] && [ -w "/sys/fs/cgroup/memory$v1" ]; then
    CG=/sys/fs/cgroup/memory${v1%/}/mgtest-doc-$$ LIMIT=memory.limit_in_bytes
elif [ "$(id -u)" = 0 ] && [ -n "$v2" ] && [ -w "/sys/fs/cgroup${v2%/}" ] &&
    grep -qw memory "/sys/fs/cgroup${v2%/}/cgroup.controllers" 2>/dev/null; then
    CG=/sys/fs/cgroup${v2%/}/mgtest-doc-$$ LIMIT=memory.max
fi
if [ -n "$CG" ] && mkdir "$CG" 2>/dev/null; then
    at_cleanup 'rmdir "$CG" 2>/dev/null'
    echo 96M >"$CG/$LIMIT"
    [ -e "$CG/memory.swap.max" ] && echo 0 >"$CG/memory.swap.max"
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$CG" \
        "$MGLAUNCH" --nproc_per_node 2 "$FW" 'if' local_rank=1 alloc 400 sleep 5 >"$O/oom" 2>&1
else
    skip_case oom "no memory cgroup of our own here"
fi

# a rerun of train continues its job's checkpoints; another job is refused
if [ -x "$TRAIN" ]; then
    RA="--data synthetic --train-samples 256 --test-samples 64 --model mlp --hidden 16
        --checkpoint-every 10 --checkpoint-dir $T/rck"
    "$MGLAUNCH" --nproc_per_node 2 "$TRAIN" $RA --steps 10 >/dev/null 2>&1
    "$MGLAUNCH" --nproc_per_node 2 "$TRAIN" $RA --steps 20 >"$O/rerun" 2>&1
    "$MGLAUNCH" --nproc_per_node 2 "$TRAIN" $RA --steps 30 --lr 0.1 >"$O/otherjob" 2>&1
else
    skip_case rerun "train not built"
    skip_case otherjob "train not built"
fi

# ---- the doc against them
awk '/^<!-- check: [a-z-]+ -->$/ { name = $3; next }
     name && /^```text$/ { inblock = 1; next }
     inblock && /^```$/ { inblock = 0; name = ""; next }
     inblock { print name "\t" $0 }' "$DOC" >"$T/quoted"
ok test -s "$T/quoted"
for name in $(cut -f1 "$T/quoted" | uniq); do
    if [ -e "$O/$name.skip" ]; then
        diag "$name: not run here ($(cat "$O/$name.skip"))"
        continue
    fi
    if [ ! -e "$O/$name" ]; then
        ok false "the doc quotes a case '$name' this test does not run"
        continue
    fi
    bad=
    while IFS="$(printf '\t')" read -r n line; do
        [ "$n" = "$name" ] || continue
        pat=$(printf '%s' "$line" | sed -e 's/[][\.*^$(){}?+|/]/\\&/g' -e 's/<[^>]*>/.*/g')
        grep -Exq -- "$pat" "$O/$name" || bad="$bad
  $line"
    done <"$T/quoted"
    is "$bad" "" "docs/troubleshooting.md, $name: every quoted line is printed"
    [ -n "$bad" ] && sed 's/^/#   printed: /' "$O/$name" | head -n 15
done
done_testing

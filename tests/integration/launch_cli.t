#!/bin/sh
# mglaunch's command line against the real binary: every bad input exits 2
# with one line naming the flag and the value; torchrun flags that are not
# implemented yet are refused, never ignored; --help and --version.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset CUDA_VISIBLE_DEVICES

# bad WANT_REGEX ARGS...: exit 2, exactly one line on stderr matching WANT_REGEX, nothing run
bad() {
    want=$1
    shift
    "$MGLAUNCH" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    is "$rc" 2 "exit 2: $*"
    is "$(wc -l <"$T/err" | tr -d ' ')" 1 "one line: $*"
    like "$(cat "$T/err")" "^mglaunch: .*$want" "names the problem: $*"
}

bad "invalid value '0' for --nproc_per_node: expected an integer from 1 to 4096, cpu, gpu, xpu or auto" \
    --nproc_per_node 0 "$FW"
bad "invalid value '4097' for --nproc_per_node: expected an integer from 1 to 4096" \
    --nproc_per_node 4097 "$FW"
bad "invalid value 'abc' for --nproc_per_node" --nproc_per_node abc "$FW"
bad "invalid value 'abc' for --nproc-per-node" --nproc-per-node=abc "$FW"
bad "invalid value '0' for --gpu_ids: 1 GPU id for 2 workers" --nproc_per_node 2 --gpu_ids 0 "$FW"
bad "unknown option '--bogus'" --bogus "$FW"
bad "unknown option '-x'" -x "$FW"
# a near miss names the option it was probably meant to be
bad "unknown option '--nprocs_per_node': did you mean --nproc_per_node\\?$" --nprocs_per_node 2 "$FW"
bad "unknown option '--nproc-per-nodes': did you mean --nproc_per_node\\?$" --nproc-per-nodes=2 "$FW"
bad "unknown option '--rdvz_id': did you mean --rdzv_id\\?$" --rdvz_id x "$FW"
bad "unknown option '--logdir': did you mean --log_dir\\?$" --logdir x "$FW"
bad "unknown option '--bogus' \\(see mglaunch --help\\)$" --bogus "$FW"
bad "missing the program" --nproc_per_node 2
bad "the program name is empty" --nproc_per_node 2 ""
bad "invalid value '70000' for --nnodes: .*<= 65536" --nnodes 70000 "$FW"
bad "invalid value '-1' for --max_restarts" --max_restarts -1 "$FW"
bad "invalid value '5' for -t" -t 5 "$FW"
bad "invalid value '0:3,x' for --redirects" --redirects 0:3,x "$FW"
bad "invalid value '99999' for --master_port" --master_port 99999 "$FW"
bad "needs a value" --nproc_per_node
bad "option --standalone takes no value" --standalone=yes "$FW"
bad "invalid value '\\\$\\{bogus\\}' for --log_line_prefix_template" \
    --log_line_prefix_template '${bogus}' "$FW"
bad "invalid value 'a/b' for --rdzv_id" --rdzv_id a/b "$FW"
export PET_NPROC_PER_NODE=x
bad "invalid value 'x' for PET_NPROC_PER_NODE \\(--nproc_per_node\\)" "$FW"
unset PET_NPROC_PER_NODE
bad "no local rank 4" --nproc_per_node 2 --local_ranks_filter 4 "$FW"
bad "ambiguous option '--n'" --n 2 "$FW"
bad "cannot be used together" --no_python -m x
bad "invalid value '\\[::1\\]:29500' for --master_addr: expected a host without a port; the port goes in --master_port" \
    --master_addr '[::1]:29500' "$FW"
bad "invalid value '\\[::1' for --master_addr: expected an IPv6 address in brackets" --master_addr '[::1' "$FW"
bad "invalid value 'a\\[1\\]' for --local_addr" --local_addr 'a[1]' "$FW"
# torchrun waits for the second node of a --standalone run until its timeout.
bad "--standalone is a single-node run: it cannot be combined with --nnodes 2" \
    --standalone --nnodes 2 "$FW"

# Multi-node settings are checked before anything starts (docs/rendezvous.md): exit 2
bad "--rdzv_endpoint is required with --rdzv_backend c10d" --nnodes 2 --rdzv_backend c10d "$FW"
bad "invalid value 'http://u:\\*\\*\\*@h:x' for --rdzv_endpoint: expected HOST\\[:PORT\\] without a scheme" \
    --nnodes 2 --rdzv_backend c10d --rdzv_endpoint 'http://u:pw@h:x' "$FW"
unlike "$(cat "$T/err")" "pw@" "  its password is not shown"
bad "invalid value '\\*\\*\\*@host:29400' for --rdzv_endpoint: expected HOST\\[:PORT\\], without a user or password" \
    --nnodes 2 --rdzv_backend c10d --rdzv_endpoint 'alice:s3cret@host:29400' "$FW"
unlike "$(cat "$T/err")" "s3cret|alice" "  neither the user nor the password is shown"
bad "invalid value 'h:99999' for --rdzv_endpoint: expected HOST\\[:PORT\\], PORT from 1 to 65535" \
    --nnodes 2 --rdzv_backend c10d --rdzv_endpoint h:99999 "$FW"
bad "invalid value 'a:b:c' for --rdzv_endpoint: expected HOST" --nnodes 2 --rdzv_backend c10d \
    --rdzv_endpoint a:b:c "$FW"
bad "--nnodes 1:4: the static backend needs a fixed node count" --nnodes=1:4 "$FW"
bad "--rdzv_id is required with --rdzv_backend etcd" --rdzv_backend etcd \
    --rdzv_endpoint 127.0.0.1:1 "$FW"
bad "invalid value 'etcd-v2' for --rdzv-backend: etcd's v2 API is gone" --rdzv-backend etcd-v2 "$FW"
export PET_RDZV_BACKEND=etcd
bad "--rdzv_endpoint is required with --rdzv_backend etcd" --nnodes 2 "$FW"
unset PET_RDZV_BACKEND
bad "--rdzv_conf: unknown key 'bogus'" --rdzv_conf bogus=5 "$FW"
export MG_RDZV_TOKEN="$(printf '%0300d' 0)"
bad "MG_RDZV_TOKEN: 300 bytes, the limit is 256" "$FW"
unset MG_RDZV_TOKEN
bad "--rdzv_conf join_timeout=abc" --nnodes 2 --rdzv_backend c10d --rdzv_endpoint x:1 \
    --rdzv_conf join_timeout=abc "$FW"
# --logs_specs names a Python class: refused with what to use instead, exit 2
bad "--logs_specs my_specs: names a Python class .*use --log_dir" --logs_specs my_specs "$FW"

if [ -z "$(ls /dev/nvidia[0-9]* 2>/dev/null)" ] && [ ! -d /proc/driver/nvidia/gpus ]; then
    bad "invalid value 'gpu' for --nproc_per_node: no GPU found" --nproc_per_node gpu "$FW"
    export CUDA_VISIBLE_DEVICES=0
    bad "no GPU found" --nproc_per_node gpu "$FW"
else
    export CUDA_VISIBLE_DEVICES=
    bad "no GPU found \\(CUDA_VISIBLE_DEVICES='' hides" --nproc_per_node gpu "$FW"
fi
unset CUDA_VISIBLE_DEVICES

# the forms that work
for form in "--nproc_per_node 2" "--nproc-per-node 2" "--nproc_per_node=2" "--nproc-per-node=2" \
    "--nproc 2"; do
    # shellcheck disable=SC2086
    out=$("$MGLAUNCH" $form "$FW" out x 2>&1)
    is "$out" "x
x" "two workers with $form"
done
out=$("$MGLAUNCH" --nnodes 1 --nnodes=1:1 --standalone --node_rank 0 --monitor_interval 0.1 \
    --start_method spawn --rdzv_backend c10d --rdzv_endpoint localhost:29400 --rdzv_id cli \
    --master_addr 127.0.0.1 --master_port 0 "$FW" out ok 2>&1)
is "$out" ok "single-node torchrun flags accepted"
"$MGLAUNCH" --nproc_per_node auto "$FW" >/dev/null 2>&1
is $? 0 "--nproc_per_node auto works without a GPU (CPU count)"
"$MGLAUNCH" --nproc_per_node cpu --local_ranks_filter 0 "$FW" >/dev/null 2>&1
is $? 0 "--nproc_per_node cpu"

out=$("$MGLAUNCH" --help)
is $? 0 "--help exits 0"
like "$out" "^usage: mglaunch \\[options\\] PROGRAM" "--help shows the usage"
like "$out" "--nproc_per_node N\\|cpu\\|gpu\\|xpu\\|auto" "--help lists the flags"
like "$("$MGLAUNCH" -h)" "^usage:" "-h"
like "$("$MGLAUNCH" --version)" "^mglaunch [0-9]+\\.[0-9]+\\.[0-9]+" "--version"
like "$("$MGLAUNCH" logs --help)" "^usage: mglaunch logs" "logs --help"
"$MGLAUNCH" logs "$T" --tail abc >/dev/null 2>"$T/err"
is $? 2 "mglaunch logs with a bad value exits 2"
like "$(cat "$T/err")" "invalid value 'abc' for --tail" "and says which"

# --master_port held by another process on this node: mglaunch says so before any worker starts
P=$(free_port)
bg "$HELPERS/storesrv" --port "$P" --port-file "$T/port.ready"
wait_for 5 test -s "$T/port.ready"
"$MGLAUNCH" --log_dir "$T/mp" --nproc_per_node 2 --master_port "$P" "$FW" out started \
    >"$T/out" 2>"$T/err"
is $? 1 "--master_port in use: exit 1"
is "$(cat "$T/err")" "mglaunch: --master_port $P: already in use on this host, so rank 0 could not listen there (another job, or a rank 0 still running, holds it: \`ss -ltnp 'sport = :$P'\` names the process); give another port, or leave --master_port out and mglaunch picks a free one for each attempt" \
    "  one line: what, who may hold it, what to do"
is "$(cat "$T/out")" "" "  no worker started"
ok [ ! -e "$T/mp" ]
done_testing

#!/bin/sh
# TorchX's dist.ddp command lines (meta-pytorch/torchx, torchx/components/dist.py),
# exactly as TorchX writes them into `bash -c`, run with `torchrun` on PATH
# being mglaunch and an unmodified PyTorch DDP script (Debian's torch, gloo):
# one node (endpoint localhost:0), the rdzv_conf variant
# (join_timeout=1800,close_timeout=600,timeout=1800), two c10d nodes on
# ${TORCHX_RANK0_HOST:=localhost}:PORT, the static backend with --node_rank,
# and -m. Every one passes --tee 3 --role '': ROLE_NAME is empty and the
# console prefix is "[0]:", as under torchrun.
# timeout: 150
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || skip_all "python3-torch not installed"
export PYTHON_EXEC=/usr/bin/python3

mkdir -p "$T/bin" "$T/app/pkg"
ln -s "$MGLAUNCH" "$T/bin/torchrun"
PATH="$T/bin:$PATH"
export PATH

cat >"$T/app/ddp.py" <<'EOF'
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1, bias=False))
with torch.no_grad():
    model.module.weight.fill_(1.0)
model(torch.full((2, 4), float(rank + 1))).sum().backward()
g = model.module.weight.grad[0, 0].item()
print(f"rank {rank}/{world} role=[{os.environ['ROLE_NAME']}] grad {g:.1f} args {' '.join(sys.argv[1:])}")
dist.destroy_process_group()
EOF
cp "$T/app/ddp.py" "$T/app/pkg/train.py"
: >"$T/app/pkg/__init__.py"
cd "$T/app" || bail "cd"

# 1. One node (-j 1x2): TorchX gives localhost:0, a free port.
out=$(bash -c "torchrun --rdzv_backend c10d --rdzv_endpoint localhost:0 --rdzv_id ddp-a1 --nnodes 1 --nproc_per_node 2 --tee 3 --role '' ddp.py --lr 0.1" 2>"$T/err1")
is $? 0 "TorchX dist.ddp, one node: accepted and the DDP job runs"
[ -s "$T/err1" ] && sed 's/^/# /' "$T/err1" | head -20
is "$(printf '%s\n' "$out" | sort)" "[0]:rank 0/2 role=[] grad 3.0 args --lr 0.1
[1]:rank 1/2 role=[] grad 3.0 args --lr 0.1" "--tee 3 --role '': empty ROLE_NAME, prefix [0]: (torchrun's)"

# 2. The rdzv_conf variant: join_timeout and timeout together, equal.
out=$(bash -c "torchrun --rdzv_backend c10d --rdzv_conf join_timeout=1800,close_timeout=600,timeout=1800 --rdzv_endpoint localhost:0 --rdzv_id ddp-a2 --nnodes 1 --nproc_per_node 2 --tee 3 --role '' ddp.py" 2>"$T/err2")
is $? 0 "TorchX's --rdzv_conf join_timeout=1800,close_timeout=600,timeout=1800: accepted"
like "$out" "^\\[0\\]:rank 0/2 role=\\[\\] grad 3.0" "  and the job runs"
is "$(cat "$T/err2")" "" "  nothing to say when the two timeouts agree"
# They differ: the c10d backend uses join_timeout, as torchrun's does, and says so.
out=$(bash -c "torchrun --rdzv_backend c10d --rdzv_conf join_timeout=1800,close_timeout=600,timeout=900 --rdzv_endpoint localhost:0 --rdzv_id ddp-a3 --nnodes 1 --nproc_per_node 1 --tee 3 --role '' ddp.py" 2>"$T/err3")
is $? 0 "join_timeout=1800 and timeout=900: accepted"
like "$(cat "$T/err3")" "join_timeout=1800s and timeout=900s differ; the c10d backend uses join_timeout" \
    "  with a note that says which one wins"

# 3. Two nodes (-j 2x1) on c10d: the endpoint is ${TORCHX_RANK0_HOST:=localhost}:29500
# in TorchX; here a free port. The first agent binds it and hosts the store.
port=$(free_port)
cmd="torchrun --rdzv_backend c10d --rdzv_endpoint \${TORCHX_RANK0_HOST:=localhost}:$port --rdzv_id ddp-b1 --nnodes 2 --nproc_per_node 1 --tee 3 --role '' ddp.py"
TORCHX_RANK0_HOST=127.0.0.1 bash -c "$cmd" >"$T/n0.out" 2>"$T/n0.err" &
p0=$!
at_cleanup "kill $p0 2>/dev/null"
listening() { [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ]; }
wait_for 20 listening || diag "the first agent has not bound :$port yet"
bash -c "$cmd" >"$T/n1.out" 2>"$T/n1.err"
rc1=$?
wait $p0
rc0=$?
is "$rc0 $rc1" "0 0" "TorchX dist.ddp on two c10d nodes: both agents succeed"
[ "$rc0 $rc1" = "0 0" ] || sed 's/^/# /' "$T/n0.err" "$T/n1.err" | tail -20
is "$(cat "$T/n0.out" "$T/n1.out" | sed 's/^\[0\]://' | sort)" "rank 0/2 role=[] grad 3.0 args 
rank 1/2 role=[] grad 3.0 args " "  one DDP group of 2 across the nodes"

# 4. The static backend: TorchX adds --node_rank (its replica id).
port=$(free_port)
for r in 0 1; do
    TORCHX_RANK0_HOST=127.0.0.1 bash -c "torchrun --rdzv_backend static --rdzv_endpoint \${TORCHX_RANK0_HOST:=localhost}:$port --rdzv_id ddp-c1 --nnodes 2 --nproc_per_node 1 --tee 3 --role '' --node_rank $r ddp.py" >"$T/s$r.out" 2>"$T/s$r.err" &
    eval "ps$r=\$!"
done
at_cleanup "kill $ps0 $ps1 2>/dev/null"
wait $ps0
rc0=$?
wait $ps1
rc1=$?
is "$rc0 $rc1" "0 0" "TorchX dist.ddp with --rdzv_backend static and --node_rank: both succeed"
[ "$rc0 $rc1" = "0 0" ] || sed 's/^/# /' "$T/s0.err" "$T/s1.err" | tail -20
is "$(cat "$T/s0.out")" "[0]:rank 0/2 role=[] grad 3.0 args " "  node_rank 0 holds rank 0"
is "$(cat "$T/s1.out")" "[0]:rank 1/2 role=[] grad 3.0 args " "  node_rank 1 holds rank 1"

# 5. -m (TorchX's m=pkg.train).
out=$(bash -c "torchrun --rdzv_backend c10d --rdzv_endpoint localhost:0 --rdzv_id ddp-d1 --nnodes 1 --nproc_per_node 2 --tee 3 --role '' -m pkg.train --x 1" 2>"$T/err5")
is $? 0 "TorchX dist.ddp with -m: runs"
like "$out" "\\[1\\]:rank 1/2 role=\\[\\] grad 3.0 args --x 1" "  a module as the entry point"

# PET_ROLE="" stays unset (Kubeflow's empty values), unlike --role ''.
out=$(PET_ROLE= "$MGLAUNCH" --nproc_per_node 1 --tee 3 --no_python /bin/sh -c 'echo "role=[$ROLE_NAME]"' 2>&1)
is "$out" "[default0]:role=[default]" "PET_ROLE='' counts as unset: the role is default"

done_testing

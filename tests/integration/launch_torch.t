#!/bin/sh
# Unmodified PyTorch scripts (Debian's python3-torch) under mglaunch: a DDP
# step with the gloo backend and env:// initialisation, as under torchrun, and
# torch's own @record error file feeding the failure summary.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || skip_all "python3-torch not installed"
export PYTHON_EXEC=/usr/bin/python3

cat >"$T/ddp.py" <<'EOF'
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env:// : MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1, bias=False))
with torch.no_grad():
    model.module.weight.fill_(1.0)
x = torch.full((2, 4), float(rank + 1))
model(x).sum().backward()
# DDP averages the gradients: every rank ends up with the mean over ranks
g = model.module.weight.grad[0, 0].item()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
print(f"rank {rank}/{world} grad {g:.1f} sum {t.item():.0f}")
dist.destroy_process_group()
EOF
out=$("$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" --rdzv_id ddp "$T/ddp.py" 2>"$T/err")
is $? 0 "a DDP script runs under mglaunch"
[ -s "$T/err" ] && sed 's/^/# /' "$T/err" | head -20
is "$(cat "$T/logs/ddp/attempt_0/0/stdout.log")" "rank 0/2 grad 3.0 sum 1" \
    "rank 0: averaged gradient and all_reduce"
is "$(cat "$T/logs/ddp/attempt_0/1/stdout.log")" "rank 1/2 grad 3.0 sum 1" "rank 1 agrees"

# torchrun's help asks for IPv6 as [0:0:0:0:0:0:0:1]; torch's TCPStore resolves it
# only without the brackets, which is what the workers get.
if /usr/bin/python3 -c 'import socket; s = socket.socket(socket.AF_INET6); s.bind(("::1", 0))' 2>/dev/null; then
    for a in '[::1]' '[0:0:0:0:0:0:0:1]' '::1'; do
        "$MGLAUNCH" --nproc_per_node 2 --master_addr "$a" --log_dir "$T/logs" --rdzv_id v6 \
            --no_python /usr/bin/python3 -c 'import os; print(os.environ["MASTER_ADDR"])' \
            >"$T/v6addr" 2>&1
        rm -rf "$T/logs/v6"
        out=$("$MGLAUNCH" --nproc_per_node 2 --master_addr "$a" --log_dir "$T/logs" --rdzv_id v6 \
            "$T/ddp.py" 2>"$T/err")
        is "$?" 0 "--master_addr $a: the DDP group forms over IPv6 loopback"
        is "$(cat "$T/logs/v6/attempt_0/1/stdout.log")" "rank 1/2 grad 3.0 sum 1" "  and agrees"
        like "$(cat "$T/v6addr")" "^(\\[default[01]\\]:)?(::1|0:0:0:0:0:0:0:1)$" "  MASTER_ADDR has no brackets"
        rm -rf "$T/logs/v6"
    done
else
    diag "no IPv6 loopback here: the [::1] cases are not run"
fi

cat >"$T/fail.py" <<'EOF'
import os
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("learning rate must be positive")

main()
EOF
"$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" --rdzv_id rec "$T/fail.py" >/dev/null \
    2>"$T/err"
is $? 1 "a worker failing under @record: exit code 1 (Python's)"
e=$(cat "$T/err")
like "$e" "error file: $T/logs/rec/attempt_0/1/error.json" "torch wrote its error file where told"
like "$e" "message   : ValueError: learning rate must be positive" "its message in the summary"
like "$e" "traceback :
    Traceback \\(most recent call last\\):" "its traceback in the summary"
done_testing

#!/bin/sh
# The static backend across nodes as torchrun has it: MASTER_PORT is
# --master_port and TORCHELASTIC_USE_AGENT_STORE=True, rank 0's agent hosting
# the workers' store on that port beside the agents' own. Between two test
# hosts whose firewalls (nftables, in their own namespaces) drop every other
# port, a job of real torch workers (Debian's python3-torch, TCPStore
# clients) and one of mg workers (the mg store client libmg uses) both work.
# And `--master_addr '[::1]'`, the IPv6 form torchrun's help asks for, with
# torch workers forming a gloo group across two agents.
# timeout: 180
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/mn_lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
HAVE_TORCH=0
/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null && HAVE_TORCH=1
export PYTHON_EXEC=/usr/bin/python3

# ---- the worker environment the static backend gives
hosts_up 2
M=$(host_addr 0)
PORT=29500
[ "$HOSTS_MODE" = loopback ] && PORT=$(free_port)
C="--nproc_per_node 2 --master_addr $M --master_port $PORT --rdzv_conf $MN_HB"
node 0 a $C --nnodes 2 --node_rank 0 "$HELPERS/fakeworker" print-env
node 1 b $C --nnodes 2 --node_rank 1 "$HELPERS/fakeworker" print-env
check_exits "static, 2 nodes: both succeed" "0 0" a b
for n in a b; do
    e=$(cat "$T/$n.out")
    like "$e" "^MASTER_PORT=$PORT$" "node $n: MASTER_PORT is --master_port"
    like "$e" "^MASTER_ADDR=$M$" "node $n: MASTER_ADDR is --master_addr"
    like "$e" "^TORCHELASTIC_USE_AGENT_STORE=True$" "node $n: TORCHELASTIC_USE_AGENT_STORE=True"
    like "$e" "^MG_AGENT_STORE=mg$" "node $n: MG_AGENT_STORE=mg, for libmg"
done

# ---- every port but --master_port blocked between the hosts
if [ "$HOSTS_MODE" != netns ]; then
    diag "no network namespaces here: the blocked-ports job is not run"
elif ! command -v nft >/dev/null; then
    diag "nft is not installed (apt-get install nftables): the blocked-ports job is not run"
else
    block() { # block HOST OTHER: HOST drops TCP and UDP with OTHER but on $PORT
        on "$1" nft -f - <<EOF
table inet mgtest {
    chain input {
        type filter hook input priority 0; policy accept;
        ip saddr $2 tcp dport $PORT accept
        ip saddr $2 tcp sport $PORT accept
        ip saddr $2 meta l4proto { tcp, udp } drop
    }
    chain output {
        type filter hook output priority 0; policy accept;
        ip daddr $2 tcp dport $PORT accept
        ip daddr $2 tcp sport $PORT accept
        ip daddr $2 meta l4proto { tcp, udp } drop
    }
}
EOF
    }
    B=$(host_addr 1)
    DESC="nftables: host 0 drops every port but $PORT from host 1"
    ok block 0 "$B"
    DESC="nftables: host 1 drops every port but $PORT to host 0"
    ok block 1 "$M"
    unset DESC
    # The wall is real: host 0 listens on another port, host 1 cannot reach it.
    other=$((PORT + 7))
    bg_on 0 "$HELPERS/storesrv" --host 0.0.0.0 --port "$other"
    srv=$!
    DESC="a store on host 0 port $other"
    pinged() { on 0 "$HELPERS/storectl" "127.0.0.1:$other" ping >/dev/null; }
    ok wait_for 5 pinged
    cut() { ! on 1 "$HELPERS/storectl" --connect-timeout 1000 "$M:$other" ping 2>/dev/null; }
    DESC="from host 1, port $other of host 0 cannot be reached"
    ok cut
    unset DESC
    kill "$srv" 2>/dev/null

    C="--nproc_per_node 2 --master_addr $M --master_port $PORT --rdzv_conf $MN_HB"
    # mg workers: the mg store client, as libmg joins the agent store
    node 0 a $C --nnodes 2 --node_rank 0 "$MN_WORKER" --reach
    node 1 b $C --nnodes 2 --node_rank 1 "$MN_WORKER" --reach
    check_exits "blocked ports: mg workers through the agent store" "0 0" a b
    check_world "  ranks 0..3 traded through MASTER_PORT alone" 4 a b

    if [ "$HAVE_TORCH" = 1 ]; then
        # torch workers: torch's own env:// rendezvous, a TCPStore client of the agent store
        cat >"$T/st.py" <<'EOF'
import os, socket, time
from datetime import timedelta
from torch.distributed import rendezvous
store, rank, world = next(rendezvous("env://", timeout=timedelta(seconds=60)))
store.set(f"host/{rank}", socket.gethostname() + "@" + os.environ["GROUP_RANK"])
seen = sorted(store.get(f"host/{r}").decode() for r in range(world))
store.add("done", 1)
while int(store.get("done")) < world:
    time.sleep(0.05)
print(f"rank {rank}/{world} sees", " ".join(sorted(set(s.split("@")[1] for s in seen))), flush=True)
EOF
        node 0 a $C --nnodes 2 --node_rank 0 "$T/st.py"
        node 1 b $C --nnodes 2 --node_rank 1 "$T/st.py"
        check_exits "blocked ports: torch workers through the agent store (TCPStore)" "0 0" a b
        is "$(cat "$T/a.out" "$T/b.out" | grep -c '^rank [0-3]/4 sees 0 1$')" 4 \
            "  every rank saw both nodes' keys"
    else
        diag "python3-torch not installed: the torch job is not run"
    fi
fi

# ---- --master_addr '[::1]' with torch workers forming a gloo group, two agents
if [ "$HAVE_TORCH" = 1 ] &&
    /usr/bin/python3 -c 'import socket; s = socket.socket(socket.AF_INET6); s.bind(("::1", 0))' 2>/dev/null; then
    cat >"$T/ddp.py" <<'EOF'
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank}/{world} sum {t.item():.0f} master {os.environ['MASTER_ADDR']}", flush=True)
dist.destroy_process_group()
EOF
    p6=$(free_port)
    for r in 0 1; do
        bg "$MGLAUNCH" --nnodes 2 --node_rank $r --nproc_per_node 1 --master_addr '[::1]' \
            --master_port "$p6" --rdzv_conf "$MN_HB" "$T/ddp.py" >"$T/v6$r.out" 2>"$T/v6$r.err"
        eval "V6_$r=\$!"
    done
    wait "$V6_0"
    rc0=$?
    wait "$V6_1"
    is "$rc0 $?" "0 0" "--master_addr '[::1]', 2 agents: the torch group forms"
    is "$(cat "$T/v60.out" "$T/v61.out" | sort)" "rank 0/2 sum 3 master ::1
rank 1/2 sum 3 master ::1" "  all_reduce over it; MASTER_ADDR without brackets"
    [ "$rc0" = 0 ] || sed 's/^/#   /' "$T/v60.err" | tail -n 10
else
    diag "no python3-torch or no IPv6 loopback: the [::1] job is not run"
fi
done_testing

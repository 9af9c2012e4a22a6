#!/bin/sh
# Every manifest under k8s/ run the way its cluster would run it: each pod a
# network namespace with its own host name, /etc/hosts (the kubelet's entry,
# then the records the cluster DNS publishes, pod 0's late) and volumes, and
# the container's exact command with exactly the environment its operator
# injects (tests/lib/podsim.py, read from the operators' source). Two pods
# train together for each. What the simulation changes, and only that: the
# image is the build directory, volumes live under /srv, one worker per pod
# instead of one per GPU, and `train --steps 30` on 2048 samples instead of
# --epochs 5 (each pod's changes are printed when a case fails).
# timeout: 300
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/podsim.sh"

pods_have 2>"$T/why" || skip_all "pods cannot be simulated here: $(head -n 1 "$T/why")"
hosts_up 3
[ "$HOSTS_MODE" = netns ] || skip_all "pods need network namespaces"

TOKEN=$(head -c 18 /dev/urandom | base64)
SMALL="--steps 30 --train-samples 2048 --test-samples 512 --log-every 10"

# run_pods MANIFEST SECS [podsim.py render options]: the manifest's pods, until
# the training pods exit or SECS pass.
run_pods() {
    _rm=$1
    _rs=$2
    shift 2
    pods_up "$TOP/k8s/$_rm.yaml" --secret "mg-train-token/token=$TOKEN" \
        --env PET_NPROC_PER_NODE=1 --sub "--nproc_per_node gpu" "--nproc_per_node 1" \
        --sub "--epochs 5" "$SMALL" "$@" || bail "podsim.py renders k8s/$_rm.yaml"
    pods_wait "$_rs"
}

# Both training pods exited 0, and rank 0 (in either pod) trained with one
# rank in each pod to the end.
trained() {
    [ "$PODS_RC" = "0 0" ] &&
        cat "$PODS_DIR"/0/log "$PODS_DIR"/1/log | grep -q 'train: 2 processes, cpu: tcp ring of 2 ranks on 2 hosts' &&
        cat "$PODS_DIR"/0/log "$PODS_DIR"/1/log | grep -q '^train: done: .* 30 steps'
}

report() {
    diag "exit codes: $PODS_RC; what the simulation changed:"
    sed 's/^/#   /' "$PODS_DIR/changes"
    pods_show
}

# The MASTER_ADDR every pod's workers got (the event logs in the pods' /tmp).
master_addrs() {
    cat "$PODS_DIR"/*/tmp/mglaunch-*/*/events.jsonl 2>/dev/null | grep '"event":"attempt_start"' |
        sed 's/.*"master_addr":"\([^"]*\)".*/\1/' | sort -u | paste -sd ' ' -
}

expect_trained() {
    if trained; then _result 0 "$1"; else
        _result 1 "$1"
        report
    fi
}

# Plain Indexed Job + headless Service: c10d in pod 0, whose name is
# published late (late enough here for pod 1 to say it is waiting).
PODS_DNS_DELAY=8
run_pods indexed-job 40
PODS_DNS_DELAY=2
expect_trained "k8s/indexed-job.yaml: two pods train together (c10d hosted by pod 0)"
DESC="rank 0 checkpointed into the shared volume" ok test -f "$PODS_DIR/vol/pvc-mg-train-ckpt/ckpt-000000000030.mgc"
w=$(grep 'mg-train-0.mg-train' "$PODS_DIR/1/log" | head -n 1)
like "$w" "mg-train-0.mg-train:29400" "pod 1 says it waits for pod 0's name until the cluster DNS publishes it"
like "$w" "does not resolve" "pod 1 says the name does not resolve (yet)"

# Kubeflow PyTorchJob, static: PET_MASTER_ADDR is the Master's per-pod Service.
run_pods pytorchjob 40
expect_trained "k8s/pytorchjob.yaml: Master and Worker train together (static)"
DESC="rank 0 checkpointed into the shared volume" ok test -f "$PODS_DIR/vol/pvc-mg-train-ckpt/ckpt-000000000030.mgc"

# Kubeflow PyTorchJob, elastic: c10d at mg-train-worker-0, PET_NNODES=1:4.
run_pods pytorchjob-elastic 40
expect_trained "k8s/pytorchjob-elastic.yaml: two workers train together (elastic c10d)"

# etcd as the backend: the StatefulSet's etcd runs as a third pod.
run_pods etcd-elastic 40
expect_trained "k8s/etcd-elastic.yaml: two interchangeable pods train together through etcd"
# Without PET_LOCAL_ADDR, rank 0 (either pod) advertises the address its
# connection to etcd leaves from: its pod IP, never its host name.
run_pods etcd-elastic 40 --drop-env PET_LOCAL_ADDR
expect_trained "k8s/etcd-elastic.yaml without PET_LOCAL_ADDR: the pods train together"
like "$(master_addrs)" "^$(host_addr 0)$|^$(host_addr 1)$" "  MASTER_ADDR is rank 0's pod IP"

# Trainer's TrainJob, JobSet and Volcano: static, with a --master_addr that
# every pod resolves but a pod host name that only its own pod resolves
# (pytorch/pytorch#150532). Rank 0 advertises the --master_addr it was given.
for m in trainjob:mg-train-node-0-0.mg-train jobset:mg-train-node-0-0.mg-train \
    volcano:mg-train-master-0.mg-train; do
    run_pods "${m%%:*}" 40
    expect_trained "k8s/${m%%:*}.yaml: two pods train together"
    is "$(master_addrs)" "${m#*:}" "  MASTER_ADDR is the --master_addr node 0 was given"
done
done_testing

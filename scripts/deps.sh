#!/bin/sh
# Checks the Debian packages mg needs to build, run its main job and run its tests.
# As root, installs the missing ones; otherwise prints the exact apt-get line and fails.
#   scripts/deps.sh            build + run + test packages
#   scripts/deps.sh --bench    also the reference tools the benchmarks compare against
set -u
# clang and its runtimes (libclang-rt-dev): the sanitizer build CI runs
# (make test CC=clang SANITIZE=address,undefined) and make fuzz (libFuzzer). qemu-user:
# tests/integration/train_cpu_kernels.t runs OpenBLAS on emulated CPUs it does not know.
# elfutils (eu-stack), gdb: the stacks mglaunch's watchdog takes of a hung job (watchdog.t).
pkgs="gcc make libc6-dev libopenblas-dev zlib1g-dev libcurl4-openssl-dev libmicrohttpd-dev
      dataset-fashion-mnist perl etcd-server etcd-client iproute2 procps coreutils
      clang-format python3 openssl protobuf-compiler python3-crcmod python3-yaml libxml2-utils
      nodejs slurmctld slurmd slurm-client munge chromium nginx curl
      tmux nftables groff-base bash-completion clang libclang-rt-dev qemu-user elfutils gdb"
[ "${1:-}" = "--bench" ] && pkgs="$pkgs python3-torch time"

missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# tests/k8s/npm-setup.sh and tests/lib/node.sh need npm, which NodeSource's nodejs carries and Debian's does not.
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    echo "mg: installing missing Debian packages:$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    # Refresh the index only when it is missing or the install fails with the cached one.
    if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ]; then
        apt-get update -qq || exit 1
    fi
    apt-get install -y -qq --no-install-recommends $missing >/dev/null ||
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null; } ||
        { echo "mg: apt-get install failed for:$missing" >&2; exit 1; }
    exit 0
fi
echo "mg: missing Debian packages. Install them with:" >&2
echo "    sudo apt-get install -y$missing" >&2
exit 1

# Shared by the DDP integration tests (ddp.t, ddp_zero.t); sourced after lib.sh.

# The parameter hash on train's last "param hash" line in FILE.
hash_of() { sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p' "$1" | tail -n 1; }

# kill_at_checkpoints LAUNCHER_PID CKDIR MIN SPAN: three times, once a new
# checkpoint in CKDIR is complete, wait a random MIN to MIN+SPAN s (a random
# step, sometimes in the middle of the next checkpoint) and SIGKILL one of the
# launcher's workers at random; each kill adds a line to $T/kills.
kill_at_checkpoints() {
    n=0
    seen=0
    while [ $n -lt 3 ] && kill -0 "$1" 2>/dev/null; do
        done_now=$(ls "$2" 2>/dev/null | grep -c '\.done$')
        if [ "$done_now" -le "$seen" ]; then
            sleep 0.02
            continue
        fi
        sleep "$(awk -v s="$$$n" -v min="$3" -v span="$4" \
            'BEGIN { srand(s); printf "%.2f", min + rand() * span }')"
        # Workers only: the launcher's other child is its sentinel, which must not count.
        w=$(pgrep -P "$1" -x train | shuf -n 1)
        [ -n "$w" ] && kill -KILL "$w" 2>/dev/null && n=$((n + 1)) && echo kill >>"$T/kills"
        seen=$(ls "$2" 2>/dev/null | grep -c '\.done$')
    done
}

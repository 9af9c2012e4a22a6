# The soak's node part (sourced by scripts/soak.sh, which describes it): an
# elastic job of three agents on loopback, worker kills, node losses and
# rejoins, each run checked against the replay of its recorded schedule.
# Uses soak.sh's rnd, tagged, $W, $OUT, $MGLAUNCH, $TRAIN, $TOP, $B.

node_train_args() {
    echo "--data synthetic --train-samples 12800 --test-samples 200 --model cnn --batch-size 32 --steps $NODE_STEPS --log-every 1 --seed 7 --snapshot-every 1"
}

# node_start RUN NAME HOST(1|0) INDEX: agent NAME of RUN in the background,
# in its own session; pid in NP_<NAME>. INDEX, the scheduler's index of the
# node (JOB_COMPLETION_INDEX), orders the first round: the first agent, the
# store's host that no fault takes, holds rank 0 and says its steps.
node_start() {
    _r=$W/$1
    mkdir -p "$_r/tmp"
    # shellcheck disable=SC2046
    TMPDIR=$_r/tmp SOAK_TAG=$NTAG MG_COMM=tcp JOB_COMPLETION_INDEX=$4 setsid "$MGLAUNCH" --rdzv_backend c10d \
        --rdzv_endpoint "127.0.0.1:$NPORT" --rdzv_id "$1" --nnodes 2:3 --nproc_per_node 1 \
        --max_restarts 30 --monitor_interval 0.1 --rdzv_conf "is_host=$3" \
        --log_dir "$_r/logs_$2" "$TRAIN" $(node_train_args) >"$_r/$2.out" 2>"$_r/$2.err" </dev/null &
    eval "NP_$2=$!"
    NODE_PIDS="$NODE_PIDS $!"
}

node_alive() { eval "kill -0 \"\$NP_$1\"" 2>/dev/null && ! eval "grep -q '^State:.*Z' /proc/\$NP_$1/status" 2>/dev/null; }
# the steps agent a's rank logged, and how many times it resumed
a_steps() { grep -c '^step ' "$W/$1/a.out" 2>/dev/null; }
a_resumes() { grep -c 'resumed from' "$W/$1/a.out" 2>/dev/null; }
a_last_step() { sed -n 's/^step \([0-9]*\)\/.*/\1/p' "$W/$1/a.out" 2>/dev/null | tail -n 1; }

# wait_training RUN: until agent a trains again after its latest resume (3
# more steps logged after it), or the run ends; 1 on a timeout.
wait_training() {
    _end=$(($(date +%s) + 120))
    while [ "$(date +%s)" -lt "$_end" ]; do
        node_alive a || return 0
        _n=$(awk '/resumed from|^train: [0-9]+ processes/ { n = 0; next } /^step / { n++ } END { print n + 0 }' \
            "$W/$1/a.out" 2>/dev/null)
        [ "${_n:-0}" -ge 3 ] && return 0
        sleep 0.1
    done
    return 1
}

# check_resumes EVENTS: every attempt after the first went on from memory,
# with at most one step trained again; prints "problems|redone counts".
check_resumes() {
    awk '
        function num(k,   m) { if (match($0, "\"" k "\":-?[0-9]+")) { m = substr($0, RSTART, RLENGTH); sub(/.*:/, "", m); return m + 0 } return -1 }
        function str(k,   m) { if (match($0, "\"" k "\":\"[^\"]*\"")) { m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:"/, "", m); sub(/"$/, "", m); return m } return "" }
        /"event":"resume"/ {
            a = num("attempt"); f = str("from"); s = num("step")
            if (seen) {
                if (f != "memory") bad = bad " attempt " a " from " f " (step " s ");"
                else if (prev < 0) bad = bad " attempt " a ": the step before it is not known;"
                else {
                    # this rank had done prev steps; -1: it died in the step whose
                    # update the others finished and kept (a peer copy resumed it)
                    d = prev - s
                    if (d < -1 || d > 1) bad = bad " attempt " a ": " d " steps redone (" prev " -> " s ");"
                    else redone = redone " " (d < 0 ? 0 : d)
                }
            }
            seen = 1; cur = a; prev = -1; next
        }
        /"event":"attempt_end"/ { if (num("attempt") == cur) prev = num("step") }
        END { print bad "|" redone }' "$1"
}

soak_nodes() {
    problems_nodes=0
    [ "$NODE_FAULTS" -gt 0 ] || return 0
    echo "soak: nodes: $NODE_FAULTS worker kills and node losses, 3 agents on loopback (c10d, --nnodes 2:3)," \
        "train --steps $NODE_STEPS, snapshots every step, MG_COMM=tcp"
    nfaults=0 nruns=0 nhangs=0 norphans=0 nlost=0 nmismatch=0 nbadlog=0 nk=0 nl=0 nj=0
    redone_all=""
    while [ "$nfaults" -lt "$NODE_FAULTS" ]; do
        nruns=$((nruns + 1))
        name=n$nruns
        NTAG="soak-$$-$name"
        NODE_PIDS=""
        NPORT=$("$B/tests/helpers/freeport" 2>/dev/null ||
            python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
        t0=$(date +%s)
        node_start "$name" a 1 0
        node_start "$name" b 0 1
        node_start "$name" c 0 2
        live="b c" lostn="" spare=0 what="" sent=0 problems=""
        rnd 3
        want=$((1 + R))
        wait_training "$name" || problems="$problems no progress;"
        while [ "$sent" -lt "$want" ] && [ "$nfaults" -lt "$NODE_FAULTS" ] && node_alive a; do
            rnd 100
            sleep "$(awk -v n="$R" 'BEGIN { printf "%.2f", 0.2 + n / 80 }')"
            node_alive a || break
            [ "$(a_last_step "$name")" -lt $((NODE_STEPS * 3 / 4)) ] 2>/dev/null || break
            rnd 3
            kind=$R
            # a node lost when three run; when one is missing, a rejoin first, at times
            if [ "$kind" = 1 ] && [ -n "$lostn" ]; then
                spare=$((spare + 1))
                node_start "$name" "s$spare" 0 $((spare + 2))
                live="$live s$spare"
                lostn=""
                nj=$((nj + 1))
                what="$what rejoin"
                wait_training "$name" || { problems="$problems no progress after a rejoin;"; break; }
                continue
            fi
            before=$(a_resumes "$name")
            if [ "$kind" = 1 ]; then
                set -- $live
                rnd $#
                shift "$R"
                victim=$1
                eval "vp=\$NP_$victim"
                wp=$(pgrep -P "$vp" -x train | head -n 1)
                kill -KILL "$vp" $wp 2>/dev/null # the agent and its worker: a machine that dies
                wait "$vp" 2>/dev/null
                live=$(printf '%s\n' $live | grep -vx "$victim" | tr '\n' ' ')
                lostn=$victim
                nl=$((nl + 1))
                what="$what loss:$victim"
            else
                set -- a $live
                rnd $#
                shift "$R"
                eval "vp=\$NP_$1"
                wp=$(pgrep -P "$vp" -x train | head -n 1)
                [ -n "$wp" ] && kill -KILL "$wp" 2>/dev/null || continue
                nk=$((nk + 1))
                what="$what kill:$1"
            fi
            sent=$((sent + 1))
            nfaults=$((nfaults + 1))
            # the group resumes before the next fault
            _end=$(($(date +%s) + 120))
            while [ "$(a_resumes "$name")" -le "$before" ] && node_alive a && [ "$(date +%s)" -lt "$_end" ]; do
                sleep 0.1
            done
            wait_training "$name" || { problems="$problems no progress after a fault;"; break; }
        done
        # the run's end: every agent left exits (or a hang)
        end=$(($(date +%s) + 300))
        for n in a $live; do
            while node_alive "$n" && [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done
        done
        rcs=""
        for n in a $live; do
            if node_alive "$n"; then
                nhangs=$((nhangs + 1))
                problems="$problems hang ($n);"
                eval "kill -KILL -- -\$NP_$n" 2>/dev/null
            fi
            eval "wait \$NP_$n"
            rcs="$rcs $n:$?"
        done
        for p in $NODE_PIDS; do wait "$p" 2>/dev/null; done
        case "$rcs" in *:[1-9]*) problems="$problems exits$rcs;" ;; esac
        sleep 0.2
        left=$(tagged "$NTAG" | tr '\n' ' ')
        if [ -n "$left" ]; then
            norphans=$((norphans + 1))
            problems="$problems orphans: $left;"
            for p in $left; do kill -KILL "$p" 2>/dev/null; done
        fi
        ev=$W/$name/logs_a/$name/events.jsonl
        starts=$(grep -c '"event":"attempt_start"' "$ev" 2>/dev/null)
        ends=$(grep -c '"event":"attempt_end"' "$ev" 2>/dev/null)
        if [ "$starts" != "$ends" ] || ! tail -n 1 "$ev" 2>/dev/null | grep -q '"event":"run_end"'; then
            nbadlog=$((nbadlog + 1))
            problems="$problems events: $starts attempt_start, $ends attempt_end, last: $(tail -n 1 "$ev" 2>/dev/null | cut -c1-40);"
        fi
        res=$(check_resumes "$ev")
        if [ -n "${res%%|*}" ]; then
            nlost=$((nlost + 1))
            problems="$problems lost:${res%%|*}"
        fi
        redone=${res#*|}
        redone_all="$redone_all$redone"
        got=$(sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p' "$W/$name/a.out" | tail -n 1)
        MG_COMM=tcp "$TOP/scripts/replay.sh" "$W/$name/logs_a" "$name" "$W/$name/replay" "$TRAIN" \
            $(node_train_args) >"$W/$name/replay.out" 2>&1
        want_hash=$(sed -n 's/^replay: param hash //p' "$W/$name/replay.out")
        if [ -z "$got" ] || [ "$got" != "$want_hash" ]; then
            nmismatch=$((nmismatch + 1))
            problems="$problems hash ${got:-none}, replay ${want_hash:-failed: $(tail -n 1 "$W/$name/replay.out")};"
        fi
        segs=$(grep -c '^attempt' "$W/$name/replay/schedule" 2>/dev/null)
        printf 'node run %3d: %s, %s segment(s), steps redone:%s, %d s: %s\n' "$nruns" "${what# }" "${segs:-0}" \
            "${redone:- none}" $(($(date +%s) - t0)) "${problems:-ok}"
        if [ -n "$problems" ]; then
            rm -rf "$OUT/$name"
            cp -r "$W/$name" "$OUT/$name"
        fi
        rm -rf "${W:?}/$name"
    done
    NODE_PIDS=""
    r0=$(printf '%s\n' $redone_all | grep -c '^0$')
    r1=$(printf '%s\n' $redone_all | grep -c '^1$')
    echo "soak: nodes: $nfaults faults (worker SIGKILL $nk, node lost $nl; $nj rejoins) over $nruns runs:" \
        "$nhangs hangs, $norphans orphans, $nbadlog bad event logs, $nlost lost, $nmismatch mismatches;" \
        "steps redone per resume: 0 x $r0, 1 x $r1"
    problems_nodes=$((nhangs + norphans + nbadlog + nlost + nmismatch))
}

#!/bin/sh
# 100 MB of output from one rank, without newlines and then as lines: every
# byte reaches the log file, the console gets it in prefixed pieces, the other
# rank's line stays whole, and the launcher's memory stays bounded.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
L=$T/logs
N=100000000
case $MG_BUILD in *san-*) sanitized=1 ;; *) sanitized=0 ;; esac

# maxrss of mglaunch and every process it waited for (the workers are small)
"$HELPERS/maxrss" "$T/rss" "$MGLAUNCH" --log_dir "$L" --rdzv_id big --nproc_per_node 2 -t 3 \
    "$FW" 'if' rank=0 out-bytes $N 'if' rank=1 out "rank one line" >"$T/out" 2>"$T/err"
is $? 0 "100 MB without a newline: success"
is "$(wc -c <"$L/big/attempt_0/0/stdout.log" | tr -d ' ')" $N "every byte in stdout.log"
is "$(grep -c '^\[default1\]:rank one line$' "$T/out")" 1 "the other rank's line is whole"
# pieces of at most 16 KiB, each with the prefix
res=$(awk 'length($0) > 16384 + 11 { long++ } !/^\[default[01]\]:/ { bare++ }
           /^\[default0\]:/ { n += length($0) - 11 } END { print long + 0, bare + 0, n }' "$T/out")
is "$res" "0 0 $N" "console: prefixed pieces of at most 16 KiB carrying every byte"
rss=$(cat "$T/rss")
diag "peak RSS with 100 MB of output: $rss KiB"
if [ $sanitized = 0 ]; then
    ok test "$rss" -lt 16384 # bounded: nothing near the 100 MB went through memory
fi

"$HELPERS/maxrss" "$T/rss" "$MGLAUNCH" --log_dir "$L" --rdzv_id lines --nproc_per_node 2 \
    "$FW" 'if' rank=0 out-lines $N >/dev/null 2>&1
is $? 0 "100 MB of lines: success"
is "$(wc -c <"$L/lines/attempt_0/0/stdout.log" | tr -d ' ')" $N "every byte in stdout.log"
[ $sanitized = 0 ] && ok test "$(cat "$T/rss")" -lt 16384

# stderr without newlines: also bounded (it also feeds the in-memory tail)
"$HELPERS/maxrss" "$T/rss" "$MGLAUNCH" --nproc_per_node 1 "$FW" err-bytes 20000000 exit 3 \
    >/dev/null 2>"$T/err"
is $? 3 "20 MB of stderr, then exit 3"
like "$(tail -n 3 "$T/err")" "logs      :" "the summary still comes out"
[ $sanitized = 0 ] && ok test "$(cat "$T/rss")" -lt 16384
done_testing

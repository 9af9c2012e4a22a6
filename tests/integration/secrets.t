#!/bin/sh
# Secrets never reach what a run writes (docs/logs.md#secrets): runs with a
# password in --upload's URL, a token flag, AWS keys and a rendezvous token in
# their arguments and environment, a usage error echoing an ftp:// URL, and
# an upload that fails; then every file under the test's directory (logs,
# event log, error files, checkpoints, temporary files, the consoles) is
# searched for each secret, which must appear nowhere, while the redacted
# forms are there. Files of a run are not world-readable. And an unclosed
# IPv6 address in --upload is a usage error, not a run that exits 0.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

L=$T/logs
DEAD=$(free_port) # nobody listens: the upload fails, and says so
export AWS_ACCESS_KEY_ID=AKIAMGTESTKEYID0001 AWS_SECRET_ACCESS_KEY=mgSecretAwsKey0002
export AWS_SESSION_TOKEN=mgSessionToken0003 MG_RDZV_TOKEN=mgRdzvToken0004

"$MGLAUNCH" --nproc_per_node 2 --log_dir "$L/up" --tee 3 "$TRAIN" --model mlp \
    --data synthetic --steps 10 --checkpoint-dir "$T/ck" \
    --upload "http://mguser:mgUrlPassword0005@127.0.0.1:$DEAD/bucket/" --upload-wait 1 \
    >"$T/run1.out" 2>&1
is "$?" 3 "a run whose upload fails: exit 3"
like "$(cat "$L"/up/*/events.jsonl)" '"http://mguser:\*\*\*@127.0.0.1:[0-9]+/bucket/"' \
    "  the event log records --upload with its password hidden"

"$MGLAUNCH" --log_dir "$L/args" /bin/sh -c 'exit 0' sh --hf-token mgFlagToken0006 \
    AWS_SECRET_ACCESS_KEY=mgArgAwsKey0007 'https://h/x?api_key=mgQueryKey0008&n=1' \
    'https://mgGhToken0009@github.com/x.git' >"$T/run2.out" 2>&1
is "$?" 0 "a run with secrets in its arguments"
ev=$(cat "$L"/args/*/events.jsonl)
like "$ev" '"--hf-token","\*\*\*","AWS_SECRET_ACCESS_KEY=\*\*\*","https://h/x\?api_key=\*\*\*&n=1","https://\*\*\*@github.com/x.git"' \
    "  the event log records them hidden"

"$MGLAUNCH" --log_dir "$L/usage" "$TRAIN" --upload 'ftp://mguser:mgFtpPassword0010@h/x' \
    >"$T/run3.out" 2>&1
is "$?" 2 "an ftp:// --upload: a usage error"
like "$(cat "$T/run3.out")" "--upload 'ftp://h/x': want s3://BUCKET/PREFIX" "  saying what is wrong"

out=$("$TRAIN" --upload 'http://u:mgV6Password0011@[::1' 2>&1)
is "$?" 2 "--upload 'http://u:p@[::1': a usage error"
like "$out" "an IPv6 address without its closing '\]'" "  saying what is wrong: $out"
echo "$out" >"$T/run4.out"
out=$("$TRAIN" --upload 'https://u:mgPortPassword0012@host:99999/x' 2>&1)
like "$out" "the port is not a number from 1 to 65535" "a port over 65535: a usage error"
echo "$out" >"$T/run5.out"

for s in AKIAMGTESTKEYID0001 mgSecretAwsKey0002 mgSessionToken0003 mgRdzvToken0004 \
    mgUrlPassword0005 mgFlagToken0006 mgArgAwsKey0007 mgQueryKey0008 mgGhToken0009 \
    mgFtpPassword0010 mgV6Password0011 mgPortPassword0012; do
    found=$(grep -rl -- "$s" "$T" 2>/dev/null)
    is "$found" "" "$s is in no file the runs wrote"
done
n=$(find "$L" "$T/ck" -type f | wc -l)
DESC="the runs wrote files ($n) that were searched"
ok test "$n" -gt 10
unset DESC
is "$(find "$L"/*/* -type d -perm -o=x)" "" "a run's directories are closed to other users (0750)"
is "$(find "$L"/*/* -type f \( -name events.jsonl -o -name error.json -o -name '*.log' \) -perm -o=r)" \
    "" "  its event log, error files and logs are not world-readable (0640)"
done_testing

#!/bin/sh
# TensorBoard event files from libmg's writer, read by two readers that share
# no code with it: the TFRecord framing's masked CRC32Cs with crcmod (Debian's
# python3-crcmod) and the Event payloads with `protoc --decode_raw` (Debian's
# protobuf-compiler). A flipped byte fails the check; a writer that is still
# running has a file that reads whole; a restart writes a file of its own.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
W=$HELPERS/metrics_write
[ -x "$W" ] || bail "metrics_write helper is built ($W)"
PY=/usr/bin/python3
$PY -c 'import crcmod' 2>/dev/null || skip_all "python3-crcmod is not installed (scripts/deps.sh)"
command -v protoc >/dev/null || skip_all "protoc is not installed (scripts/deps.sh)"

tfcheck() { $PY "$(dirname "$0")/../lib/tfcheck.py" "$@" 2>&1; }

"$W" --tb "$T/tb" --run-id job7 --to 100 --every 10 --eval-every 50 2>"$T/err"
is "$?" 0 "the writer ran ($(cat "$T/err"))"
files=$(ls "$T/tb")
like "$files" "^events\.out\.tfevents\.[0-9]{10}\.[^.]+(\.[^.]+)*\.[0-9]+\.0$" \
    "one file named events.out.tfevents.<time>.<host>.<pid>.<n>"
f=$T/tb/$files
mkdir "$T/pb"
# file_version, start, hparams, 10 train, 2 eval, the summary
is "$(tfcheck "$f" "$T/pb")" "ok: 16 records" "crcmod: all 16 records' CRCs are valid"

decode() { protoc --decode_raw <"$T/pb/$1.pb" 2>&1 | tr '\n' ' ' | tr -s ' '; }
bad=0
for k in $(seq 0 15); do protoc --decode_raw <"$T/pb/$k.pb" >/dev/null 2>&1 || bad=$((bad + 1)); done
is "$bad" 0 "protoc decodes every payload"
like "$(decode 0)" '^1: 0x[0-9a-f]{16} 3: "brain\.Event:2" $' "record 0: wall_time and file_version brain.Event:2"
like "$(decode 1)" '^1: 0x[0-9a-f]{16} 7 \{ 1: 1 \} $' "record 1: SessionLog START at step 0"
like "$(decode 2)" '5 \{ 1 \{ 1: "hparams" 8 \{ 1: 7 .*8: "\| setting \| value \|.*\| lr \| 0\.05 \|.* 9 \{ 1 \{ 1: "text" \} \}' \
    "record 2: the hparams table as a text summary (DT_STRING tensor, text plugin)"
r3=$(decode 3)
like "$r3" '^1: 0x[0-9a-f]{16} 2: 10 5 \{' "record 3: step 10, a summary"
# 2.3 / 1.1 as float32 is 0x4005d174, 1 - 2.3 / 1.1 / 2.5 is 0x3e27904a: TensorBoard
# gets the full value (the digits kept apply to the text formats only)
like "$r3" '1: "train/loss" 2: 0x4005d174' "record 3: train/loss = 2.090909 (simple_value)"
like "$r3" '1: "train/accuracy" 2: 0x3e27904a' "record 3: train/accuracy"
like "$r3" '1: "train/lr" 2: 0x3d4ccccd .*1: "train/samples_per_s" 2: 0x459c4000 .*1: "train/time_s"' \
    "record 3: lr, samples/s, time in the caller's order"
like "$(decode 7)" '2: 50 5 \{ .*1: "train/loss"' "record 7: train at step 50"
like "$(decode 8)" '2: 50 5 \{ .*1: "eval/test_loss" .*1: "eval/test_accuracy"' "record 8: eval at step 50"
like "$(decode 15)" '2: 100 5 \{ 1 \{ .* 1: "summary/test_accuracy" 2: 0x3f600000 \} \} $' \
    "record 15: the summary's number, without its text field"

# A flipped byte in a payload, then in a length: the reader refuses the record.
cp "$f" "$T/flip"
$PY - "$T/flip" <<'EOF'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0x01; open(p, "wb").write(b)
EOF
like "$(tfcheck "$T/flip")" "^record [0-9]+: bad data crc$" "a flipped payload byte fails the data CRC"
cp "$f" "$T/flip2"
$PY - "$T/flip2" <<'EOF'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[0] ^= 0x04; open(p, "wb").write(b)
EOF
is "$(tfcheck "$T/flip2")" "record 0: bad length crc" "a flipped length byte fails the length CRC"
head -c $(($(wc -c <"$f") - 3)) "$f" >"$T/short"
is "$(tfcheck "$T/short")" "record 15: truncated data" "a cut file: every record before the cut is whole"

# A running writer's file is whole at every moment it is read: each record is
# written (not buffered) as it is made.
bg "$W" --tb "$T/live" --run-id job8 --to 200 --every 10 --hold 30
live=$!
# 3 + 20 train + 4 eval + the summary
wait_for 10 sh -c "ls '$T/live' | grep -q tfevents && $PY '$(dirname "$0")/../lib/tfcheck.py' '$T/live'/events* | grep -qx 'ok: 28 records'"
DESC="the writer is still running" ok kill -0 "$live"
is "$(tfcheck "$T/live"/events*)" "ok: 28 records" "all its records are in its file, CRCs valid"
kill "$live"

# A restart (resumed from step 50) writes its own file beside the first one.
"$W" --tb "$T/tb" --run-id job7 --restart 1 --from 50 --to 100 --every 10 --eval-every 50
is "$(ls "$T/tb" | wc -l | tr -d ' ')" 2 "a restart writes a second file"
g=$(ls "$T/tb" | grep -v "^$files\$")
rm -f "$T"/pb/*
# 3 + train 60..100 + eval 100 + the summary
is "$(tfcheck "$T/tb/$g" "$T/pb")" "ok: 10 records" "the restart's file: CRCs valid"
like "$(decode 1)" '^1: 0x[0-9a-f]{16} 2: 50 7 \{ 1: 1 \} $' \
    "it starts with SessionLog START at step 50 (TensorBoard drops the older steps after it)"
done_testing

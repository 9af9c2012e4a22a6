#!/bin/sh
# train --upload and --upload-cmd against real servers on loopback that this
# test starts: an S3 server that verifies SigV4 signatures (@20minutes/s3rver,
# tests/node/s3server.js), Debian's nginx with WebDAV PUT and basic auth (its
# own config, daemon off, a free port), and a command. Checkpoints, their
# markers, LATEST and the metrics arrive byte for byte; a wrong secret or a
# missing password is refused, counted and said, and the run still trains to
# the end (exit 3: output incomplete); the S3 server killed mid-run: training
# goes on, the failed tries are counted, and the files arrive once it is back;
# --resume auto on an empty checkpoint directory takes the remote copy.
# timeout: 300
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/node.sh"
. "$(dirname "$0")/../lib/nginx.sh"
[ -n "$NGINX" ] || skip_all "nginx is not installed (scripts/deps.sh)"
command -v curl >/dev/null || skip_all "curl is not installed"
need_node_modules
DATA="--data synthetic --train-samples 512 --test-samples 128 --model mlp --hidden 32"
hash_of() { sed -n 's/.*done: .*param hash \([0-9a-f]*\).*/\1/p' "$1"; }

# ---- a command ----
mkdir "$T/cmd"
"$TRAIN" $DATA --steps 30 --checkpoint-every 10 --checkpoint-dir "$T/ck_cmd" --log-every 5 \
    --metrics "$T/m.jsonl" \
    --upload-cmd "mkdir -p '$T/cmd'/\$(dirname \"\$MG_UPLOAD_NAME\") && cp {} '$T/cmd'/\"\$MG_UPLOAD_NAME\"" \
    >"$T/cmd.out" 2>&1
is "$?" 0 "--upload-cmd: train runs the command for each file"
like "$(cat "$T/cmd.out")" "upload to command .*: ([0-9]+) of \\1 copies made" \
    "every copy made (3 checkpoints, snapshots of the metrics)"
same=0
for s in 10 20 30; do
    f=ckpt-0000000000$s
    cmp -s "$T/ck_cmd/$f.mgc" "$T/cmd/checkpoints/$f.mgc" && cmp -s "$T/ck_cmd/$f.done" "$T/cmd/checkpoints/$f.done" &&
        same=$((same + 1))
done
is "$same" 3 "every checkpoint and its marker arrive byte for byte, under MG_UPLOAD_NAME"
is "$(cat "$T/cmd/checkpoints/LATEST")" "ckpt-000000000030.mgc" "LATEST names the newest"
ok cmp "$T/m.jsonl" "$T/cmd/metrics/m.jsonl"
"$TRAIN" $DATA --steps 10 --checkpoint-every 5 --checkpoint-dir "$T/ck_cmd2" --upload-cmd 'exit 7' \
    --upload-wait 2 >"$T/cmd2.out" 2>&1
is "$?" 3 "a command that fails: trained to the end, exit status 3"
like "$(cat "$T/cmd2.out")" "train: done: " "the training finished"
like "$(cat "$T/cmd2.out")" "0 of 2 copies made \(0\.0 MB\), 0 given up, 0 dropped \(queue full\), 2 not sent in 2 s; [1-9][0-9]* failed tr(y was|ies were) tried again; not copied: checkpoints/ckpt-000000000005.mgc: not sent before the end; checkpoints/ckpt-000000000010.mgc: not sent before the end; the last error: checkpoints/ckpt-000000000005.mgc: the command exited with status 7" \
    "after --upload-wait 2: what was not copied, the tries, the last error"

# ---- nginx: WebDAV PUT with basic auth ----
NG=$T/nginx
nginx_dav "$NG" mg:s3cret || bail "nginx starts"
NPORT=$NGINX_PORT
"$TRAIN" $DATA --steps 20 --checkpoint-every 10 --checkpoint-dir "$T/ck_dav" --log-every 5 \
    --metrics "$T/dav.jsonl" --upload "http://mg:s3cret@127.0.0.1:$NPORT/runs/a" >"$T/dav.out" 2>&1
is "$?" 0 "--upload http://...: PUT to nginx's WebDAV"
unlike "$(cat "$T/dav.out")" "s3cret" "the password is never printed"
ok cmp "$T/ck_dav/ckpt-000000000020.mgc" "$NG/dav/runs/a/checkpoints/ckpt-000000000020.mgc"
ok cmp "$T/dav.jsonl" "$NG/dav/runs/a/metrics/dav.jsonl"
"$TRAIN" $DATA --steps 10 --checkpoint-every 10 --checkpoint-dir "$T/ck_dav2" \
    --upload "http://127.0.0.1:$NPORT/runs/b" >"$T/dav2.out" 2>&1
is "$?" 3 "without the password: exit status 3"
like "$(cat "$T/dav2.out")" "not copied: checkpoints/ckpt-000000000010.mgc: HTTP 401" "refused with 401, said"
"$TRAIN" $DATA --steps 30 --checkpoint-every 10 --checkpoint-dir "$T/ck_dav3" --resume auto \
    --upload "http://mg:s3cret@127.0.0.1:$NPORT/runs/a" >"$T/dav3.out" 2>&1
is "$?" 0 "--resume auto on an empty directory, from the WebDAV copy"
like "$(cat "$T/dav3.out")" "resumed from .*ckpt-000000000020.mgc \(step 20, .*param hash $(hash_of "$T/dav.out")" \
    "it resumes from step 20 with the weights that run ended with"

# ---- S3 ----
S3=$T/s3
S3PORT=$(free_port)
start_s3() {
    bg node "$NODE_DIR/s3server.js" "$S3PORT" "$S3" ckpt >>"$T/s3.out" 2>&1
    s3pid=$!
    wait_for 20 curl -s -o /dev/null "http://127.0.0.1:$S3PORT/"
}
start_s3 || bail "the S3 server starts ($(cat "$T/s3.out"))"
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1
export AWS_ENDPOINT_URL_S3=http://127.0.0.1:$S3PORT
s3get() { # KEY FILE
    curl -s -f --aws-sigv4 "aws:amz:us-east-1:s3" --user S3RVER:S3RVER \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -o "$2" "http://127.0.0.1:$S3PORT/ckpt/$1"
}
"$MGLAUNCH" --nproc_per_node 2 --rdzv_id s3job --log_dir "$T/logs" "$TRAIN" $DATA --steps 30 \
    --checkpoint-every 10 --checkpoint-dir "$T/ck_s3" --log-every 5 --tensorboard \
    --upload s3://ckpt/job1 >"$T/s3run.out" 2>&1
is "$?" 0 "--upload s3://ckpt/job1 from rank 0 of 2, signed with SigV4"
like "$(cat "$T/s3run.out")" "upload to s3://ckpt/job1: ([0-9]+) of \\1 copies made" \
    "every copy made: 3 checkpoints, the metrics and the TensorBoard file"
ok s3get job1/checkpoints/ckpt-000000000030.mgc "$T/got.mgc"
ok cmp "$T/got.mgc" "$T/ck_s3/ckpt-000000000030.mgc"
ok s3get job1/metrics/attempt_0/metrics.jsonl "$T/got.jsonl"
ok cmp "$T/got.jsonl" "$T/logs/s3job/attempt_0/metrics.jsonl"
tb=$(ls "$T/logs/s3job/tensorboard")
ok s3get "job1/tensorboard/$tb" "$T/got.tfevents"
ok cmp "$T/got.tfevents" "$T/logs/s3job/tensorboard/$tb"

AWS_SECRET_ACCESS_KEY=wrong "$TRAIN" $DATA --steps 10 --checkpoint-every 10 \
    --checkpoint-dir "$T/ck_bad" --upload s3://ckpt/bad >"$T/bad.out" 2>&1
is "$?" 3 "a wrong secret: trained to the end, exit status 3"
like "$(cat "$T/bad.out")" "not copied: checkpoints/ckpt-000000000010.mgc: HTTP 403 \(SignatureDoesNotMatch" \
    "the S3 server refused the signature (403 SignatureDoesNotMatch), and train says so"
unlike "$(cat "$T/bad.out")" "wrong" "the secret is never printed"
AWS_ACCESS_KEY_ID= "$TRAIN" $DATA --steps 2 --upload s3://ckpt/x >"$T/nokey.out" 2>&1
is "$?" 1 "no credentials: exit 1"
like "$(cat "$T/nokey.out")" "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set" \
    "without credentials it stops before training"

# ---- the S3 server killed mid-run ----
"$TRAIN" --data synthetic --train-samples 2048 --test-samples 128 --model cnn --steps 60 \
    --checkpoint-every 10 --checkpoint-dir "$T/ck_kill" --keep-checkpoints 2 --log-every 5 \
    --upload s3://ckpt/kill \
    >"$T/kill.out" 2>&1 &
tp=$!
at_cleanup "kill -KILL $tp 2>/dev/null"
wait_for 60 s3get kill/checkpoints/LATEST "$T/latest" || bail "the first checkpoint arrives"
kill -KILL "$s3pid"
diag "S3 server killed after $(cat "$T/latest")"
wait_for 120 grep -q 'train: done: ' "$T/kill.out"
DESC="training went on to the end without the server" ok grep -q 'train: done: ' "$T/kill.out"
sleep 1
start_s3 || bail "the S3 server starts again"
wait "$tp"
is "$?" 0 "once it is back, every copy is made and train exits 0"
like "$(cat "$T/kill.out")" "upload to s3://ckpt/kill: ([0-9]+) of \\1 copies made \([0-9.]+ MB\); [1-9][0-9]* failed tr(y was|ies were) tried again" \
    "the failed tries are counted"
got=0
for s in 10 20 30 40 50 60; do
    s3get "kill/checkpoints/ckpt-0000000000$s.mgc" "$T/k$s.mgc" && got=$((got + 1))
done
is "$got" 6 "all 6 checkpoints arrived, the 4 that --keep-checkpoints 2 removed here too"
ok cmp "$T/k60.mgc" "$T/ck_kill/ckpt-000000000060.mgc"
ok cmp "$T/k50.mgc" "$T/ck_kill/ckpt-000000000050.mgc"

# ---- --resume auto from the remote copy ----
"$TRAIN" $DATA --steps 40 --checkpoint-every 10 --checkpoint-dir "$T/ck_new" --resume auto \
    --upload s3://ckpt/job1 >"$T/resume.out" 2>&1
is "$?" 0 "--resume auto with an empty checkpoint directory"
like "$(cat "$T/resume.out")" "no checkpoint in '.*ck_new': fetched .*ckpt-000000000030.mgc from s3://ckpt/job1" \
    "fetches the newest checkpoint LATEST names"
like "$(cat "$T/resume.out")" "resumed from .*ckpt-000000000030.mgc \(step 30, .*param hash $(hash_of "$T/s3run.out")" \
    "and resumes with the weights the first run ended with"
ok test -f "$T/ck_new/ckpt-000000000030.done"
"$TRAIN" $DATA --steps 5 --checkpoint-dir "$T/ck_none" --resume auto --upload s3://ckpt/nothing \
    >"$T/none.out" 2>&1
is "$?" 0 "a destination without checkpoints: start from step 0"
done_testing

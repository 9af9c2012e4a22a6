#!/bin/sh
# train on real Fashion-MNIST files: a short run on a few hundred samples from
# Debian's dataset-fashion-mnist, and broken data directories (missing,
# truncated, wrong magic, wrong dimensions) each fail with one line that names
# the file and the problem.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] || skip_all "train not built"
src=/usr/share/datasets/fashion-mnist
[ -r "$src/t10k-images-idx3-ubyte.gz" ] || skip_all "dataset-fashion-mnist not installed"

"$TRAIN" --model mlp --train-samples 512 --test-samples 500 --epochs 2 --batch-size 32 \
    --log-every 8 >"$T/out" 2>&1
is $? 0 "mlp on 512 Fashion-MNIST samples"
like "$(cat "$T/out")" "data fashion-mnist \(512 train / 500 test samples\)" "uses the real data"
acc=$(sed -n 's/.*done: test accuracy \([0-9.]*\).*/\1/p' "$T/out")
ok /usr/bin/python3 -c "import sys; sys.exit(0 if float('$acc') > 0.6 else 1)"
diag "test accuracy after 32 steps on 512 samples: $acc"
"$TRAIN" --model cnn --train-samples 256 --test-samples 200 --steps 8 --batch-size 32 >"$T/cnn" 2>&1
is $? 0 "cnn on real samples"

# broken copies of the directory
d=$T/data
mkdir -p "$d"
gunzip -c "$src/t10k-images-idx3-ubyte.gz" >"$d/t10k-images-idx3-ubyte"
cp "$src/t10k-labels-idx1-ubyte.gz" "$src/train-labels-idx1-ubyte.gz" "$d/"
gunzip -c "$src/train-images-idx3-ubyte.gz" | head -c 1000000 >"$d/train-images-idx3-ubyte"
fails() {
    want=$1
    shift
    "$TRAIN" --steps 1 "$@" >"$T/o" 2>"$T/e"
    is $? 1 "fails: $*"
    is "$(wc -l <"$T/e" | tr -d ' ')" 1 "one line: $*"
    like "$(cat "$T/e")" "$want" "message: $(cat "$T/e")"
}
fails "^train: cannot load fashion-mnist: '$d/train-images-idx3-ubyte': truncated: the header promises 47040000 data bytes, the file has 999984" \
    --data-dir "$d"
printf 'JUNK' | dd of="$d/train-images-idx3-ubyte" bs=1 conv=notrunc 2>/dev/null
fails "'$d/train-images-idx3-ubyte': bad magic 0x4a554e4b" --data-dir "$d"
# labels file with two dimensions
printf '\000\000\010\002\000\000\000\001\000\000\000\001\007' >"$d/train-labels-idx1-ubyte"
gunzip -c "$src/train-images-idx3-ubyte.gz" >"$d/train-images-idx3-ubyte"
fails "'$d/train-labels-idx1-ubyte': has 2 dimensions, expected 1" --data-dir "$d"
fails "'$T/nowhere': cannot find train-images-idx3-ubyte or train-images-idx3-ubyte.gz" \
    --data-dir "$T/nowhere"
fails "cannot find" --data mnist --data-dir "$T/nowhere"
done_testing

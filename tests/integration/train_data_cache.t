#!/bin/sh
# train's dataset cache (docs/train.md): the first run builds it, the next ones
# map it and train to the same bits as a run without it; a corrupt or stale
# cache is rebuilt with a warning and never changes the result; two ranks
# starting at once build it once; a cache that cannot be written is said once
# and does not stop training; --profile-startup names the phases.
# timeout: 180
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] || skip_all "train not built"
src=/usr/share/datasets/fashion-mnist
[ -r "$src/train-images-idx3-ubyte.gz" ] || skip_all "dataset-fashion-mnist not installed"
# a copy, so the test can make the sources change
d=$T/data
mkdir -p "$d"
cp "$src"/*.gz "$d/"
export MG_DATA_CACHE=$T/cache
args="--model mlp --data-dir $d --train-samples 512 --test-samples 300 --steps 6 --batch-size 32"
hash_of() { sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p' "$1"; }

"$TRAIN" $args --profile-startup >"$T/o1" 2>"$T/e1"
is $? 0 "first run"
is "$(grep -c "dataset cache '$T/cache/.*' built" "$T/e1")" 2 "builds the training and test caches"
like "$(cat "$T/e1")" "startup: rank 0: dist [0-9.]+ ms, backend [0-9.]+ ms, data [0-9.]+ ms, model [0-9.]+ ms, checkpoint [0-9.]+ ms, sync [0-9.]+ ms, first step [0-9.]+ ms; total [0-9.]+ ms" \
    "--profile-startup: one line with the phases"
h=$(hash_of "$T/o1")
is "$(ls "$T/cache" | grep -c '\.mgd$')" 2 "two cache files"

"$TRAIN" $args --profile-startup >"$T/o2" 2>"$T/e2"
is $? 0 "second run"
is "$(grep -c 'dataset cache' "$T/e2")" 0 "maps the caches: nothing built, nothing to say"
is "$(hash_of "$T/o2")" "$h" "same bits as the run that built them"
"$TRAIN" $args --data-cache off >"$T/o3" 2>"$T/e3"
is "$(hash_of "$T/o3")" "$h" "--data-cache off: same bits"
is "$(ls "$T/cache" | grep -c '\.mgd$')" 2 "and no other cache file"
MG_DATA_CACHE=off "$TRAIN" $args --profile-startup >"$T/o3" 2>"$T/e3"
is "$(grep -c 'dataset cache' "$T/e3")" 0 "MG_DATA_CACHE=off: no cache"

# corrupt: one byte of the training images
f=$(ls "$T/cache"/train-images-*.mgd)
printf '\377' | dd of="$f" bs=1 seek=9000 conv=notrunc 2>/dev/null
"$TRAIN" $args >"$T/o4" 2>"$T/e4"
is $? 0 "a run over a corrupt cache"
like "$(cat "$T/e4")" "warning: dataset cache '.*train-images.*' rebuilt: it was corrupt: its data does not match its hash" \
    "warns that it rebuilt it"
is "$(hash_of "$T/o4")" "$h" "and trains to the same bits"
"$TRAIN" $args >"$T/o5" 2>"$T/e5"
is "$(cat "$T/e5")" "" "the next run has nothing to say"

# stale: the test labels rewritten (other content; the cache must follow)
gunzip -c "$d/t10k-labels-idx1-ubyte.gz" >"$T/labels"
/usr/bin/python3 -c "
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
for i in range(8, 8 + 300):
    b[i] = (b[i] + 1) % 10
open(sys.argv[1], 'wb').write(bytes(b))" "$T/labels"
gzip -c "$T/labels" >"$d/t10k-labels-idx1-ubyte.gz"
"$TRAIN" $args >"$T/o6" 2>"$T/e6"
like "$(cat "$T/e6")" "warning: dataset cache '.*t10k-images.*' rebuilt: it was stale: '$d/t10k-labels-idx1-ubyte.gz' changed since it was built" \
    "new test labels: the cache is rebuilt"
"$TRAIN" $args --data-cache off >"$T/o7" 2>&1
is "$(sed -n 's/.*done: \(test accuracy [^;]*\);.*/\1/p' "$T/o6")" \
    "$(sed -n 's/.*done: \(test accuracy [^;]*\);.*/\1/p' "$T/o7")" \
    "and evaluates on the new labels, as without a cache"

# two ranks at once, empty cache: both train, one builds
if [ -x "$MGLAUNCH" ]; then
    rm -rf "$T/cache"
    "$MGLAUNCH" --nproc_per_node 2 --tee 3 "$TRAIN" $args --profile-startup >"$T/o8" 2>&1
    is $? 0 "two ranks start together on an empty cache"
    is "$(grep -c "dataset cache .* built" "$T/o8")" 2 "the caches are built once (one rank builds each)"
    is "$(grep -c 'startup: rank' "$T/o8")" 2 "each rank profiles its start"
    "$MGLAUNCH" --nproc_per_node 2 "$TRAIN" $args >"$T/o9" 2>&1
    is "$(hash_of "$T/o8")" "$(hash_of "$T/o9")" "cached or not, the same bits"
fi

# a cache that cannot be used: said once, training goes on
touch "$T/notadir"
"$TRAIN" $args --data-cache "$T/notadir/cache" >"$T/o10" 2>"$T/e10"
is $? 0 "an unusable cache directory is no error"
like "$(cat "$T/e10")" "warning: dataset cache not used: cannot create '$T/notadir/cache'" "it is said"
is "$(hash_of "$T/o10")" "$(hash_of "$T/o6")" "same bits"
"$TRAIN" $args --data-cache= >"$T/o" 2>"$T/e"
is $? 2 "--data-cache with an empty value is a usage error"
done_testing

#!/bin/sh
# The fuzz harnesses' corpora replayed (tests/fuzz/, docs/development.md):
# every input in tests/fuzz/corpus/NAME, seeds and past findings, runs through
# harness NAME built with the normal compiler (replay.c), so a parser that
# regresses on one of them fails here, without clang or libFuzzer. Under
# SANITIZE=... the replay is sanitized too.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"

for src in "$TOP"/tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    name=${name#fuzz_}
    bin=$MG_BUILD/tests/fuzz/replay_$name
    corpus=$TOP/tests/fuzz/corpus/$name
    n=$(ls "$corpus" 2>/dev/null | wc -l | tr -d ' ')
    DESC="$name: a corpus of seeds ($n inputs)" ok test "$n" -gt 0
    if [ ! -x "$bin" ]; then
        bail "$name: the replay harness is built ($bin)"
    fi
    out=$("$bin" "$corpus" 2>&1)
    rc=$?
    is "$rc $(printf '%s\n' "$out" | tail -n 1)" "0 replayed $n inputs" "$name: every input replays cleanly"
    [ "$rc" = 0 ] || printf '%s\n' "$out" | tail -n 20 | sed 's/^/#   /'
done

done_testing

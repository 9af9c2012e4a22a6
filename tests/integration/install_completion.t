#!/bin/sh
# `make install` puts the programs, their man pages (mglaunch.1, train.1, clean
# for groff) and their bash completions in place; the completions, loaded by a
# real bash, offer every option the programs' --help lists, the values of
# options with a fixed set, `mglaunch logs --run`'s run ids (mglaunch's runs
# and torchrun's directories), and after PROGRAM hand over to its completion.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
command -v bash >/dev/null || skip_all "no bash"
I=$T/inst
make -s -C "$TOP" install DESTDIR="$I" PREFIX=/usr BUILD="$MG_BUILD" >"$T/make.out" 2>&1
is "$?" 0 "make install DESTDIR=... PREFIX=/usr"
[ -s "$T/make.out" ] && sed 's/^/#   /' "$T/make.out" | tail -n 5
for f in bin/mglaunch bin/train share/man/man1/mglaunch.1 share/man/man1/train.1 \
    share/bash-completion/completions/mglaunch share/bash-completion/completions/train; do
    ok test -s "$I/usr/$f"
done
for m in mglaunch train; do
    out=$(groff -man -ww -z "$I/usr/share/man/man1/$m.1" 2>&1)
    is "$out" "" "$m.1: groff finds nothing to warn about"
done
like "$(MANWIDTH=100 man -l "$I/usr/share/man/man1/train.1" 2>/dev/null | col -b)" \
    "train - train one of mg's models with libmg" "man train renders"
# every option train --help lists is in its man page
missing=
for o in $("$I/usr/bin/train" --help 2>&1 | grep -oE -- '--[a-z][a-z-]*' | sort -u); do
    grep -q -- "$(printf '%s' "$o" | sed 's/-/\\\\-/g')" "$I/usr/share/man/man1/train.1" || missing="$missing $o"
done
is "$missing" "" "train.1 documents every option of train --help"

# complete LINE: the completions bash offers for LINE (the last word is the one completed)
complete_line() {
    PATH="$I/usr/bin:$PATH" BC="$BC" LOGS="$T/logs" bash -c '
        [ -n "$BC" ] && . "$BC"
        . "$0/share/bash-completion/completions/mglaunch"
        . "$0/share/bash-completion/completions/train"
        COMP_LINE=$1
        read -ra COMP_WORDS <<<"$1"
        [ "${1% }" != "$1" ] && COMP_WORDS+=("")
        COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
        COMP_POINT=${#COMP_LINE}
        f=$(complete -p "${COMP_WORDS[0]}" | sed "s/.*-F \([^ ]*\).*/\1/")
        "$f" "${COMP_WORDS[0]}" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
        printf "%s\n" "${COMPREPLY[@]}" | sort -u' "$I/usr" "$1"
}
BC=
[ -r /usr/share/bash-completion/bash_completion ] && BC=/usr/share/bash-completion/bash_completion

out=$(complete_line "mglaunch --nproc")
like "$out" "^--nproc_per_node$" "mglaunch --nproc<TAB>: --nproc_per_node"
is "$(complete_line "mglaunch --rdzv_backend ")" "c10d
etcd
static" "mglaunch --rdzv_backend <TAB>: the backends"
is "$(complete_line "mglaunch --numa-binding c")" "core-complex" "--numa-binding c<TAB>"
want=$("$I/usr/bin/mglaunch" --help | grep -oE -- '(^|[ ,])--[a-zA-Z][a-zA-Z_-]*' | sed 's/^[ ,]*//' | sort -u)
is "$(complete_line "mglaunch --")" "$want" "mglaunch --<TAB>: every option of mglaunch --help"

# mglaunch logs --run: the runs of LOG_DIR, mglaunch's and torchrun's
"$I/usr/bin/mglaunch" --log_dir "$T/logs" --rdzv_id alpha true >/dev/null 2>&1
"$I/usr/bin/mglaunch" --log_dir "$T/logs" --rdzv_id beta true >/dev/null 2>&1
mkdir -p "$T/logs/job_abcd1234/attempt_0/0" "$T/logs/not-a-run"
is "$(complete_line "mglaunch logs $T/logs --run ")" "alpha
beta
job_abcd1234" "mglaunch logs DIR --run <TAB>: its run ids"
is "$(complete_line "mglaunch logs $T/logs --run b")" "beta" "  and their prefixes"
is "$(complete_line "mglaunch logs --stream ")" "both
stderr
stdout" "mglaunch logs --stream <TAB>"

out=$(complete_line "train --sch")
is "$out" "--schedule" "train --sch<TAB>: --schedule"
is "$(complete_line "train --model ")" "cnn
mlp" "train --model <TAB>: the models"
want=$("$I/usr/bin/train" --help 2>&1 | grep -oE -- '(^|[ ,])--[a-z][a-z-]*' | sed 's/^[ ,]*//' | sort -u)
is "$(complete_line "train --")" "$want" "train --<TAB>: every option of train --help"
if [ -n "$BC" ]; then
    is "$(complete_line "mglaunch --nproc_per_node 2 train --mod")" "--model" \
        "after PROGRAM, the program's completion: mglaunch ... train --mod<TAB>"
    is "$(complete_line "mglaunch -t 3 train --data s")" "synthetic" "  with its values"
else
    diag "bash-completion is not installed: the hand-over to PROGRAM's completion is not checked"
fi
done_testing

#!/bin/sh
# Which Python runs a .py worker when PYTHON_EXEC is unset: a script that
# imports torch runs under the system's python3 when the python3 first on
# PATH (here a pyenv-like shim without torch) lacks it, and mglaunch says so
# once; PYTHON_EXEC always wins; a script without torch, or a PATH python3
# that has torch, keeps PATH's python3 without a word. A missing script is
# a one-line usage error before any worker starts.
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset PYTHON_EXEC

# ---- a missing script (needs no torch)
cd "$T" || bail "cd $T"
"$MGLAUNCH" --log_dir "$T/l0" --nproc_per_node 2 nothere.py --lr 1 >"$T/out" 2>"$T/err"
is $? 2 "a missing .py script: usage error, exit 2"
is "$(cat "$T/err")" "mglaunch: script 'nothere.py' does not exist" "  one line naming it"
DESC="  no run directory: no worker was started" ok [ ! -e "$T/l0" ]
"$MGLAUNCH" --nproc_per_node 1 --run_path "$T/nothere" >/dev/null 2>"$T/err"
is "$(cat "$T/err")" "mglaunch: script '$T/nothere' does not exist" "  --run_path too"

/usr/bin/python3 -c 'import torch' 2>/dev/null || skip_all "Debian's /usr/bin/python3 has no torch"

# pyenv-like shims: bad/python3 has no torch (no site packages), good/python3 has it
mkdir -p "$T/bad" "$T/good"
printf '#!/bin/sh\nMG_SHIM=bad exec /usr/bin/python3 -S "$@"\n' >"$T/bad/python3"
printf '#!/bin/sh\nMG_SHIM=good exec /usr/bin/python3 "$@"\n' >"$T/good/python3"
chmod +x "$T/bad/python3" "$T/good/python3"
cat >"$T/ddp.py" <<'PY'
import os
import torch.distributed as dist
print("rank", os.environ["RANK"], "shim", os.environ.get("MG_SHIM", "none"), "torch", __import__("torch").__version__)
PY
cat >"$T/plain.py" <<'PY'
import os, sys
print("rank", os.environ["RANK"], "shim", os.environ.get("MG_SHIM", "none"))
PY
cat >"$T/nested.py" <<'PY'
# import torch   (a comment does not count)
def main():
    from torch import nn
    print("nested", nn.__name__)
if __name__ == "__main__":
    main()
PY

# ---- PATH's python3 lacks torch, the script imports it: the system's, said once
PATH="$T/bad:$PATH" "$MGLAUNCH" --nproc_per_node 2 ddp.py >"$T/out" 2>"$T/err"
is $? 0 "a torch script with a torch-less python3 first on PATH runs"
is "$(sort "$T/out")" "rank 0 shim none torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')
rank 1 shim none torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')" \
    "  under /usr/bin/python3 (not the shim)"
is "$(cat "$T/err")" "mglaunch: ddp.py imports torch; the python3 first on PATH ($T/bad/python3) has no torch, /usr/bin/python3 has: running the workers under /usr/bin/python3 (PYTHON_EXEC=/path/to/python chooses another)" \
    "  and mglaunch says which and why, once"
PATH="$T/bad:$PATH" "$MGLAUNCH" --nproc_per_node 1 nested.py >"$T/out" 2>"$T/err"
is "$(cat "$T/out")" "nested torch.nn" "an indented 'from torch import' counts (the system's ran it)"

# ---- PYTHON_EXEC always wins, even a torch-less one
PATH="$T/bad:$PATH" PYTHON_EXEC="$T/bad/python3" "$MGLAUNCH" --nproc_per_node 2 ddp.py \
    >"$T/out" 2>"$T/err"
is $? 1 "PYTHON_EXEC without torch: it runs, and fails as it would"
unlike "$(cat "$T/err")" "running the workers under" "  no choice made"
like "$(cat "$T/err")" "^hint: rank [01] could not import 'torch' under $T/bad/python3 \\(from PYTHON_EXEC\\)" \
    "  the hint names PYTHON_EXEC"

# ---- a script without torch: PATH's python3, silently
PATH="$T/bad:$PATH" "$MGLAUNCH" --nproc_per_node 1 plain.py >"$T/out" 2>"$T/err"
is "$(cat "$T/out")" "rank 0 shim bad" "a script without torch runs under PATH's python3"
is "$(cat "$T/err")" "" "  without a word"

# ---- PATH's python3 has torch: it stays, silently
PATH="$T/good:$PATH" "$MGLAUNCH" --nproc_per_node 1 ddp.py >"$T/out" 2>"$T/err"
like "$(cat "$T/out")" "^rank 0 shim good torch " "PATH's python3 with torch keeps the script"
is "$(cat "$T/err")" "" "  without a word"
done_testing

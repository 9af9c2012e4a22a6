#!/bin/sh
# A .py program runs under the first python3 on PATH (python3 script.py's
# meaning). When it cannot import a module and no rank says anything else
# (the others are stopped after the first failure), the summary says which
# interpreter ran and how to name another (PYTHON_EXEC); when a rank
# succeeded or failed otherwise, no such hint.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset PYTHON_EXEC
command -v python3 >/dev/null || skip_all "no python3 on PATH"
py=$(command -v python3)

printf 'import mg_no_such_module_anywhere\n' >"$T/imp.py"
"$MGLAUNCH" --nproc_per_node 3 "$T/imp.py" >"$T/out" 2>"$T/err"
is "$?" 1 "every rank fails to import: Python's exit code 1"
like "$(cat "$T/err")" "^hint: rank [0-2] could not import 'mg_no_such_module_anywhere' under $py \\(python3, the first one on PATH\\), and no rank reported anything else\\. If another Python has it, name that one: PYTHON_EXEC=/path/to/python mglaunch \\.\\.\\.$" \
    "the summary names the interpreter and PYTHON_EXEC"
PYTHON_EXEC=$py "$MGLAUNCH" --nproc_per_node 2 "$T/imp.py" >"$T/out" 2>"$T/err"
like "$(cat "$T/err")" "under $py \\(from PYTHON_EXEC\\)" "  and says when PYTHON_EXEC chose it"

# One rank misses a module after another succeeded: no interpreter hint.
cat >"$T/one.py" <<'EOF'
import os, time
if os.environ["RANK"] == "1":
    time.sleep(1)
    import mg_no_such_module_anywhere
EOF
"$MGLAUNCH" --nproc_per_node 2 "$T/one.py" >"$T/out" 2>"$T/err"
is "$?" 1 "rank 1 fails to import after rank 0 succeeded"
unlike "$(cat "$T/err")" "^hint:" "  no interpreter hint"
# Another rank failed otherwise: no hint either.
cat >"$T/two.py" <<'EOF'
import os, sys, time
if os.environ["RANK"] == "0":
    sys.stderr.write("ValueError: bad data\n")
    sys.exit(3)
time.sleep(1)
import mg_no_such_module_anywhere
EOF
"$MGLAUNCH" --nproc_per_node 2 "$T/two.py" >"$T/out" 2>"$T/err"
is "$?" 3 "rank 0 fails otherwise"
unlike "$(cat "$T/err")" "^hint:" "  no interpreter hint"
printf 'raise SystemExit(3)\n' >"$T/three.py"
"$MGLAUNCH" --nproc_per_node 2 "$T/three.py" >"$T/out" 2>"$T/err"
unlike "$(cat "$T/err")" "^hint:" "a failure that is not an import: no hint"

# The python3 on PATH lacks torch, Debian's has it: mglaunch chooses Debian's
# for a torch script (launch_python_choice.t); with PYTHON_EXEC naming the
# torch-less one, the hint.
if ! python3 -c 'import torch' 2>/dev/null && /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    printf 'import torch\nprint("torch", torch.__version__)\n' >"$T/t.py"
    PYTHON_EXEC=$py "$MGLAUNCH" --nproc_per_node 2 "$T/t.py" >"$T/out" 2>"$T/err"
    like "$(cat "$T/err")" "^hint: rank [01] could not import 'torch' under $py \\(from PYTHON_EXEC\\)" \
        "torch missing from PYTHON_EXEC's python3: the hint"
    out=$("$MGLAUNCH" --nproc_per_node 2 "$T/t.py" 2>/dev/null | sort -u)
    like "$out" "^torch " "  and without PYTHON_EXEC, mglaunch takes the python3 that has torch"
else
    diag "PATH's python3 has torch, or /usr/bin/python3 lacks it: the torch case is not run"
fi
done_testing

#!/bin/sh
# `mglaunch logs` reads a log directory the real torchrun (Debian's, 1.13)
# wrote: its <run_id>_<random>/attempt_<n>/<local_rank>/ layout, no event log,
# and error.json files, enough to name the failed rank and its error.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
/usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || skip_all "python3-torch not installed"
unset PYTHON_EXEC
L=$T/tlogs

cat >"$T/fail.py" <<'EOF'
import os
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    print("hello from", os.environ["RANK"], flush=True)
    if os.environ["RANK"] == "1":
        raise ValueError("learning rate must be positive")

main()
EOF
# Debian's torchrun under Python 3.11 needs -r/-t as 1 or 2 (3 trips its Std enum)
# and --monitor_interval 0.1 (docs/distributed.md).
torchrun() {
    /usr/bin/python3 -m torch.distributed.run --monitor_interval 0.1 "$@"
}
torchrun --nproc_per_node 2 --log_dir "$L" --rdzv_id job --max_restarts 1 -r 2 -t 2 \
    "$T/fail.py" >"$T/tr.out" 2>"$T/tr.err"
is "$?" 1 "torchrun: the job fails (rank 1, twice)"
dir=$(ls "$L")
like "$dir" '^job_[a-z0-9_]{8}$' "torchrun's run directory: <run_id>_<random>"
ok test -s "$L/$dir/attempt_1/1/error.json"

out=$("$MGLAUNCH" logs "$L" 2>&1)
is "$?" 0 "mglaunch logs reads it"
like "$out" "\\* $dir +[0-9-]+ [0-9:]+ +failed \\(torchrun's log\\) +2" "the run: failed, 2 attempts"
like "$out" "a torchrun log directory: run id job;" "known for what it is"
like "$out" "attempt 0 \\(restart 0\\), directory from .*: failed" "attempt 0 failed"
like "$out" "local rank 1 +rank 1 +pid \\? +failed \\(error.json\\), exit code unknown \"ValueError: learning rate must be positive\"" \
    "rank 1 failed, with its error"
like "$out" "local rank 0 +rank 0 +pid \\? +no error file" "rank 0: no error file"
like "$out" "Root cause \\(first failure\\):
  rank      : 1 \\(local rank 1\\)" "the root cause: rank 1"
like "$out" "  attempt   : 0 \\(restart 0\\)" "  in the first attempt"
like "$out" "  error file: $L/$dir/attempt_0/1/error.json" "  its error file"
like "$out" "  message   : ValueError: learning rate must be positive" "  its message"
like "$out" "  traceback :
    Traceback \\(most recent call last\\):" "  its traceback"

# torchrun's run id selects it, and the content selectors work on its files
out=$("$MGLAUNCH" logs "$L" --run job 2>&1)
like "$out" "^  RUN .*
\\* $dir " "--run job: torchrun's run id finds its directory"
out=$("$MGLAUNCH" logs "$L" --run job --rank 1 --stream stderr --tail 1)
is "$out" "ValueError: learning rate must be positive" "--rank 1 --stream stderr --tail 1"
out=$("$MGLAUNCH" logs "$L" --run job --attempt 0 --grep 'raise ValueError')
like "$out" "raise ValueError" "--grep in attempt 0"

# A torchrun run that succeeded: no error file anywhere
printf 'print("ok")\n' >"$T/ok.py"
torchrun --nproc_per_node 2 --log_dir "$L" --rdzv_id good -r 1 -t 1 "$T/ok.py" >/dev/null 2>&1
is "$?" 0 "torchrun: a job that succeeds"
out=$("$MGLAUNCH" logs "$L" --run good)
like "$out" "\\* good_[a-z0-9_]{8} .* no error file \\(torchrun's\\) +1" "its run: no error file"
unlike "$out" "Root cause" "no root cause"
is "$("$MGLAUNCH" logs "$L" --run good --rank 0 --stream stdout)" "ok" "its rank 0 stdout"
done_testing

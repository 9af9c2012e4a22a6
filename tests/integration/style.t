#!/bin/sh
# The C sources follow .clang-format (machine-checked style, DESIGN.md).
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
cd "$TOP"
command -v clang-format >/dev/null || skip_all "clang-format not installed"
files=$(git ls-files '*.c' '*.h' 2>/dev/null)
[ -n "$files" ] || skip_all "not a git checkout"
# -Werror: a violation, or a .clang-format this clang-format cannot read, fails
out=$(clang-format --dry-run -Werror $files 2>&1)
rc=$?
is "$rc" 0 "clang-format finds nothing to change"
[ "$rc" = 0 ] || printf '%s\n' "$out" | grep -E 'warning:|error:' | head -20 | sed 's/^/# /'
done_testing

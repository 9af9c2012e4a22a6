#!/bin/sh
# The C sources follow .clang-format (machine-checked style, DESIGN.md).
# timeout: 60
. "$(dirname "$0")/../lib.sh"
cd "$TOP"
command -v clang-format >/dev/null || skip_all "clang-format not installed"
files=$(git ls-files '*.c' '*.h' 2>/dev/null)
[ -n "$files" ] || skip_all "not a git checkout"
out=$(clang-format --dry-run $files 2>&1 | grep -c 'warning:')
is "$out" 0 "clang-format finds nothing to change"
[ "$out" = 0 ] || clang-format --dry-run $files 2>&1 | grep 'warning:' | head -20 | sed 's/^/# /'
done_testing

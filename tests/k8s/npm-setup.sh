#!/bin/sh
# Installs the npm packages tests/k8s/validate.js needs (tests/k8s/package.json,
# pinned by package-lock.json) into DIR, a directory under the build: once, and
# again when the lock file changes. Nothing from npm is committed.
#   tests/k8s/npm-setup.sh DIR      then: NODE_PATH=DIR/node_modules node tests/k8s/validate.js ...
set -eu
dir=$1
src=$(cd "$(dirname "$0")" && pwd)
stamp=$dir/node_modules/.mg-package-lock.json
if [ -f "$stamp" ] && cmp -s "$stamp" "$src/package-lock.json"; then
    exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "npm-setup: no npm (scripts/deps.sh installs it)" >&2; exit 1; }
mkdir -p "$dir"
cp "$src/package.json" "$src/package-lock.json" "$dir/"
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
cp "$src/package-lock.json" "$stamp"

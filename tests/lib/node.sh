# The npm packages some integration tests drive (tests/node/package.json and
# its package-lock.json): installed on first use with `npm ci` into
# tests/node/node_modules (git-ignored), again only when the lock file changes.
# Tests running at once wait for each other's install (flock).
#
#   . "$(dirname "$0")/../lib/node.sh"   (after lib.sh)
#   need_node_modules     skips the test without node or npm; bails when npm ci fails
#   $NODE_DIR             tests/node: run its scripts with node "$NODE_DIR/x.js"

NODE_DIR=$TOP/tests/node

need_node_modules() {
    command -v node >/dev/null || skip_all "node is not installed (scripts/deps.sh)"
    command -v npm >/dev/null || skip_all "npm is not installed (scripts/deps.sh)"
    _want=$(sha256sum "$NODE_DIR/package-lock.json" | cut -d' ' -f1)
    _stamp=$NODE_DIR/node_modules/.mg-lock-sha256
    [ "$(cat "$_stamp" 2>/dev/null)" = "$_want" ] && return 0
    (
        flock 9
        [ "$(cat "$_stamp" 2>/dev/null)" = "$_want" ] && exit 0
        cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error >"$T/npm.log" 2>&1 &&
            echo "$_want" >"$_stamp"
    ) 9>"$NODE_DIR/.npm-lock" || bail "npm ci in tests/node ($(tail -n 3 "$T/npm.log" 2>/dev/null))"
}

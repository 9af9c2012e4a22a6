# The npm packages some integration tests drive (tests/node/package.json,
# pinned by its package-lock.json), installed with `npm ci` into a directory
# under the build ($MG_BUILD/npm/tests-node) on first use and again when the
# lock file changes, as tests/k8s/npm-setup.sh does for its own: nothing from
# npm is in the source tree. Tests running at once wait for each other's
# install (flock).
#
#   . "$(dirname "$0")/../lib/node.sh"   (after lib.sh)
#   need_node_modules     skips the test without node or npm; bails when npm ci fails;
#                         exports NODE_PATH so the scripts below find the packages
#   $NODE_DIR             tests/node: run its scripts with node "$NODE_DIR/x.js"

NODE_DIR=$TOP/tests/node

need_node_modules() {
    command -v node >/dev/null || skip_all "node is not installed (scripts/deps.sh)"
    command -v npm >/dev/null || skip_all "npm is not installed (scripts/deps.sh)"
    _npm=$MG_BUILD/npm/tests-node
    _stamp=$_npm/node_modules/.mg-package-lock.json
    mkdir -p "$_npm"
    (
        flock 9
        cmp -s "$_stamp" "$NODE_DIR/package-lock.json" && exit 0
        cp "$NODE_DIR/package.json" "$NODE_DIR/package-lock.json" "$_npm/" &&
            cd "$_npm" && npm ci --no-audit --no-fund --loglevel=error >"$T/npm.log" 2>&1 &&
            cp "$NODE_DIR/package-lock.json" "$_stamp"
    ) 9>"$_npm/.lock" || bail "npm ci of tests/node's packages ($(tail -n 3 "$T/npm.log" 2>/dev/null))"
    export NODE_PATH=$_npm/node_modules
}

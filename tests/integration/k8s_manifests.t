#!/bin/sh
# The manifests under k8s/, checked offline against the schemas of Kubernetes
# (npm's kubernetes-models) and of each operator's CRD (tests/k8s/crds/), so
# that a misspelt field, a wrong type or a value outside an enum fails here
# rather than at `kubectl apply` (tests/k8s/validate.js); the JobSet that
# Kubeflow Trainer makes of the TrainJob is checked too. Then the rules every
# training pod follows (tests/lib/podsim.py check): a grace period longer
# than --shutdown_timeout, the token from a Secret, GPUs requested with
# --nproc_per_node gpu or auto.
# timeout: 180
. "$(dirname "$0")/../lib/lib.sh"

command -v node >/dev/null 2>&1 || skip_all "no node (scripts/deps.sh installs nodejs)"
/usr/bin/python3 -c 'import yaml' 2>/dev/null || skip_all "no python3-yaml (scripts/deps.sh installs it)"
NPM_DIR=$MG_BUILD/npm/k8s-validate
"$TOP/tests/k8s/npm-setup.sh" "$NPM_DIR" >"$T/npm.log" 2>&1 ||
    bail "tests/k8s/npm-setup.sh installs kubernetes-models: $(tail -n 3 "$T/npm.log" | tr '\n' ' ')"
validate() { NODE_PATH=$NPM_DIR/node_modules node "$TOP/tests/k8s/validate.js" "$@"; }
PODSIM="/usr/bin/python3 $TOP/tests/lib/podsim.py"

n=0
for f in "$TOP"/k8s/*.yaml; do
    m=k8s/$(basename "$f")
    n=$((n + 1))
    validate "$f" >"$T/out" 2>&1
    rc=$?
    is "$rc $(grep -vc ': ok$' "$T/out")" "0 0" "$m: every object matches its schema"
    [ $rc = 0 ] || sed 's/^/#   /' "$T/out"
    out=$($PODSIM check "$f" 2>&1)
    like "$out" "^ok: 2 training pods$" "$m: grace period, token, GPU request and --nproc_per_node"
done
DESC="k8s/ has the 7 manifests docs/kubernetes.md describes" ok test "$n" -ge 7
$PODSIM jobset "$TOP/k8s/trainjob.yaml" >"$T/jobset.yaml"
validate "$T/jobset.yaml" >"$T/out" 2>&1
rc=$?
is "$rc" 0 "the JobSet Kubeflow Trainer makes of k8s/trainjob.yaml matches JobSet's CRD"
[ $rc = 0 ] || sed 's/^/#   /' "$T/out"

# A misspelt field, a wrong type, a value outside an enum: each one fails.
bad() {
    _desc=$1
    _file=$2
    _want=$3
    shift 3
    sed "$@" "$TOP/k8s/$_file" >"$T/bad.yaml"
    if cmp -s "$T/bad.yaml" "$TOP/k8s/$_file"; then
        _result 1 "$_desc (the edit changed nothing)"
        return
    fi
    _out=$(validate "$T/bad.yaml" 2>&1)
    _rc=$?
    like "$_rc $(printf '%s' "$_out" | tr '\n' ' ')" "^1 .*$_want" "$_desc"
}
bad "Job: a misspelt pod field (subdomian) is an unknown field" indexed-job.yaml \
    "Job/mg-train: /spec/template/spec/subdomian: unknown field" -e 's/subdomain: mg-train /subdomian: mg-train /'
bad "Job: completionMode Indxed is outside the enum" indexed-job.yaml \
    "/spec/completionMode: enum" -e 's/completionMode: Indexed/completionMode: Indxed/'
bad "Service: a port as a string is the wrong type" indexed-job.yaml \
    "/spec/ports/0/port: type" -e 's/port: 29400/port: "29400"/'
bad "StatefulSet: a misspelt container field (volumeMount) is an unknown field" etcd-elastic.yaml \
    "StatefulSet/mg-etcd: .*/volumeMount: unknown field" -e '0,/volumeMounts:/s//volumeMount:/'
bad "PyTorchJob: a misspelt field (nprocsPerNode) fails against the CRD" pytorchjob.yaml \
    "PyTorchJob/mg-train: /spec/nprocsPerNode: unknown field" -e 's/nprocPerNode:/nprocsPerNode:/'
bad "PyTorchJob: elasticPolicy.minReplicas as a string is the wrong type" pytorchjob-elastic.yaml \
    "/spec/elasticPolicy/minReplicas: type" -e 's/minReplicas: 1 /minReplicas: "1" /'
bad "TrainingRuntime: a misspelt pod field deep in the JobSet template fails" trainjob.yaml \
    "TrainingRuntime/mg-torch: .*/terminationGracePeriodSecs: unknown field" -e 's/terminationGracePeriodSeconds/terminationGracePeriodSecs/'
bad "TrainJob: a misspelt trainer field (numNode) fails" trainjob.yaml \
    "TrainJob/mg-train: /spec/trainer/numNode: unknown field" -e 's/numNodes: 2/numNode: 2/'
bad "JobSet: a misspelt field (failurePolicies) fails" jobset.yaml \
    "JobSet/mg-train: /spec/failurePolicies: unknown field" -e 's/failurePolicy:/failurePolicies:/'
bad "Volcano Job: minAvailable as a word is the wrong type" volcano.yaml \
    "/spec/minAvailable: type" -e 's/minAvailable: 2/minAvailable: two/'
bad "metadata of a CRD object: a misspelt field (label) fails" volcano.yaml \
    "/metadata/label: unknown field" -e 's/^  name: mg-train$/  name: mg-train\n  label: {}/'

# The rules catch what they are for.
sed 's/terminationGracePeriodSeconds: 60/terminationGracePeriodSeconds: 30/' "$TOP/k8s/indexed-job.yaml" >"$T/bad.yaml"
like "$($PODSIM check "$T/bad.yaml" 2>&1)" "terminationGracePeriodSeconds 30 is not longer than --shutdown_timeout 30" \
    "a grace period no longer than --shutdown_timeout is caught"

# Every vendored CRD names its source (repository, commit, path) and license.
for f in "$TOP"/tests/k8s/crds/*.json; do
    src=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["source"])' "$f")
    like "$src" '^[^/ ]+/[^@ ]+@[0-9a-f]{40}:' "$(basename "$f"): source $src"
    DESC="tests/k8s/crds/README.md lists it" ok grep -qF "$src" "$TOP/tests/k8s/crds/README.md"
done
DESC="the CRDs' license is there" ok grep -q "Apache License" "$TOP/tests/k8s/crds/LICENSE"
done_testing

#!/usr/bin/python3
"""Pods from a Kubernetes manifest, the way a cluster and its operator would make
them, for tests that run the manifest's real command on test hosts
(tests/lib/podsim.sh runs what this renders).

For every workload in the manifest (Job, StatefulSet, JobSet, Kubeflow
PyTorchJob and TrainJob, Volcano Job) it makes the pods the controller would:
their names, host names, subdomains, labels and annotations, and the
environment the operator injects, as read from the operators' source
(docs/kubernetes.md has the table). Then, per pod: the environment with
fieldRefs, secretKeyRefs and $(VAR) expanded as the kubelet does, the command
and args, the kubelet's /etc/hosts, and the DNS records the cluster publishes
for it. The only changes to the manifest are the ones asked for (--sub, --env,
--add-env, --add-env-field, --drop-env) and those no test host can avoid:
volumes are mounted under /srv, so their paths are rewritten, and the image is
the build directory (PATH).

    podsim.py pods MANIFEST                  one line per pod: index, name, role
    podsim.py jobset MANIFEST                the JobSet Kubeflow Trainer makes of a TrainJob (YAML)
    podsim.py check MANIFEST                 the rules every training pod follows (docs/kubernetes.md)
    podsim.py render MANIFEST --out DIR --ips IP,IP,... --image BUILD_DIR
              [--secret NAME/KEY=VALUE]... [--env NAME=VALUE]... [--sub FROM TO]...
              [--add-env NAME=VALUE]... [--add-env-field NAME=FIELDPATH]... [--drop-env NAME]...
"""
import argparse
import copy
import os
import re
import shlex
import sys
import uuid

import yaml

NS = "default"
DOMAIN = "svc.cluster.local"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_ROOT = "/srv/image"  # where the pod sees the build directory
VOLUME_ROOT = "/srv"  # where the pod sees its volumes: /srv/<mountPath>


class Fail(Exception):
    pass


def uid(*parts):
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "podsim/" + "/".join(parts)))


def env_value(name, value):
    return {"name": name, "value": str(value)}


def env_field(name, path):
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def upsert_env(container, entries):
    """Trainer's apply.UpsertEnvVars: replace a variable of the same name in place, else append."""
    env = container.setdefault("env", [])
    for e in entries:
        for i, old in enumerate(env):
            if old.get("name") == e["name"]:
                env[i] = copy.deepcopy(e)
                break
        else:
            env.append(copy.deepcopy(e))


class Pod:
    def __init__(self, name, spec, workload, role="main"):
        self.name = name
        self.spec = copy.deepcopy(spec.get("spec", {}))
        meta = spec.get("metadata", {}) or {}
        self.labels = dict(meta.get("labels", {}) or {})
        self.annotations = dict(meta.get("annotations", {}) or {})
        self.hostname = self.spec.get("hostname") or name
        self.subdomain = self.spec.get("subdomain")
        self.workload = workload
        self.role = role
        self.uid = uid("pod", name)
        self.waits = []  # (why, name): init containers the operator adds, waiting for a DNS name
        self.ip = None

    def containers(self):
        return self.spec.get("containers", [])


# ---- controllers -------------------------------------------------------------------------------


def job_pods(job, extra_labels=None, extra_annotations=None, role="main"):
    """batch/v1 Job: the Job controller's pods."""
    name = job["metadata"]["name"]
    spec = job["spec"]
    indexed = spec.get("completionMode", "NonIndexed") == "Indexed"
    n = spec.get("parallelism", 1)
    if spec.get("completions") is not None:
        n = min(n, spec["completions"])
    juid = uid("job", name)
    pods = []
    for i in range(n):
        t = copy.deepcopy(spec["template"])
        meta = t.setdefault("metadata", {})
        labels = meta.setdefault("labels", {}) or {}
        meta["labels"] = labels
        annotations = meta.setdefault("annotations", {}) or {}
        meta["annotations"] = annotations
        labels.update(extra_labels or {})
        annotations.update(extra_annotations or {})
        labels.update(
            {
                "batch.kubernetes.io/controller-uid": juid,
                "controller-uid": juid,
                "batch.kubernetes.io/job-name": name,
                "job-name": name,
            }
        )
        suffix = uid("suffix", name, str(i))[:5]
        if indexed:
            labels["batch.kubernetes.io/job-completion-index"] = str(i)
            annotations["batch.kubernetes.io/job-completion-index"] = str(i)
            pod = Pod(f"{name}-{i}-{suffix}", t, f"Job {name}, index {i}", role)
            # The Job controller names an Indexed Job's pods' hosts <job>-<index>.
            pod.hostname = t["spec"].get("hostname") or f"{name}-{i}"
            for c in pod.containers():
                c.setdefault("env", []).append(env_field("JOB_COMPLETION_INDEX", "metadata.annotations['batch.kubernetes.io/job-completion-index']"))
        else:
            pod = Pod(f"{name}-{suffix}", t, f"Job {name}, pod {i}", role)
        pods.append(pod)
    return pods


def statefulset_pods(sts):
    name = sts["metadata"]["name"]
    pods = []
    for i in range(sts["spec"].get("replicas", 1)):
        t = copy.deepcopy(sts["spec"]["template"])
        meta = t.setdefault("metadata", {})
        meta.setdefault("labels", {}).update(
            {"statefulset.kubernetes.io/pod-name": f"{name}-{i}", "apps.kubernetes.io/pod-index": str(i)}
        )
        pod = Pod(f"{name}-{i}", t, f"StatefulSet {name}, pod {i}", role="service")
        pod.hostname = f"{name}-{i}"
        pod.subdomain = sts["spec"].get("serviceName")
        pods.append(pod)
    return pods


def jobset_pods(js, services):
    """JobSet: one Job per replica of each replicatedJob; a headless Service named
    spec.network.subdomain (default: the JobSet's name) publishing not-ready pods."""
    name = js["metadata"]["name"]
    spec = js["spec"]
    net = spec.get("network", {}) or {}
    subdomain = net.get("subdomain") or name
    dns_hostnames = net.get("enableDNSHostnames", True)
    services.append(
        {"name": subdomain, "headless": True, "selector": {"jobset.sigs.k8s.io/jobset-name": name}, "why": f"JobSet {name}"}
    )
    pods = []
    rjobs = spec.get("replicatedJobs", [])
    global_replicas = sum(r.get("replicas", 1) for r in rjobs)
    gidx = 0
    for rj in rjobs:
        for j in range(rj.get("replicas", 1)):
            job = {"metadata": {"name": f"{name}-{rj['name']}-{j}"}, "spec": copy.deepcopy(rj["template"]["spec"])}
            job["spec"].setdefault("completionMode", "Indexed")  # the JobSet webhook's default
            job["spec"]["template"].setdefault("spec", {})
            if dns_hostnames:
                job["spec"]["template"]["spec"]["subdomain"] = subdomain
            marks = {
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/jobset-uid": uid("jobset", name),
                "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
                "jobset.sigs.k8s.io/replicatedjob-replicas": str(rj.get("replicas", 1)),
                "jobset.sigs.k8s.io/job-index": str(j),
                "jobset.sigs.k8s.io/job-global-index": str(gidx),
                "jobset.sigs.k8s.io/global-replicas": str(global_replicas),
                "jobset.sigs.k8s.io/restart-attempt": "0",
                "jobset.sigs.k8s.io/job-key": uid("jobkey", name, rj["name"], str(j)),
            }
            rjmeta = rj["template"].get("metadata", {}) or {}
            labels = dict(rjmeta.get("labels", {}) or {})
            labels.update(marks)
            pods += job_pods(job, labels, dict(marks))
            gidx += 1
    return pods


def pytorchjob_pods(pj, services):
    """Kubeflow training-operator v1 (release-1.9, pkg/controller.v1/pytorch)."""
    name = pj["metadata"]["name"]
    spec = pj["spec"]
    specs = spec["pytorchReplicaSpecs"]
    elastic = spec.get("elasticPolicy")
    nproc = spec.get("nprocPerNode")
    total = sum(r.get("replicas", 1) for r in specs.values())
    try:
        nproc_int = int(nproc) if nproc is not None else 1
    except ValueError:
        nproc_int = 1

    def port_of(rtype):
        for c in specs[rtype]["template"]["spec"]["containers"]:
            if c["name"] == "pytorch":
                for p in c.get("ports", []):
                    if p.get("name") == "pytorchjob-port":
                        return p["containerPort"]
        raise Fail(f"PyTorchJob {name}: {rtype} has no port named pytorchjob-port in a container named pytorch")

    pods = []
    for rtype in ("Master", "Worker"):
        if rtype not in specs:
            continue
        rt = rtype.lower()
        for i in range(specs[rtype].get("replicas", 1)):
            pod = Pod(f"{name}-{rt}-{i}", specs[rtype]["template"], f"PyTorchJob {name}, {rt} {i}")
            pod.labels.update(
                {
                    "training.kubeflow.org/job-name": name,
                    "training.kubeflow.org/operator-name": "pytorchjob-controller",
                    "training.kubeflow.org/replica-type": rt,
                    "training.kubeflow.org/replica-index": str(i),
                }
            )
            if rtype == "Master":
                pod.labels["training.kubeflow.org/job-role"] = "master"
            services.append({"name": pod.name, "headless": True, "pod": pod.name, "why": f"PyTorchJob {name}"})
            for c in pod.containers():
                env = c.setdefault("env", [])
                env.append(env_value("PYTHONUNBUFFERED", "1"))
                if "Master" in specs:
                    port = port_of("Master")
                    master = f"{name}-master-0"
                    env += [
                        env_value("MASTER_PORT", port),
                        env_value("PET_MASTER_PORT", port),
                        env_value("MASTER_ADDR", master),
                        env_value("PET_MASTER_ADDR", master),
                    ]
                    rank = i + 1 if rtype == "Worker" else i
                    env += [
                        env_value("WORLD_SIZE", total * nproc_int),
                        env_value("RANK", rank),
                        env_value("PET_NODE_RANK", rank),
                    ]
                if nproc is not None:
                    env.append(env_value("PET_NPROC_PER_NODE", nproc))
                if elastic:
                    host = elastic.get("rdzvHost") or f"{name}-worker-0"
                    port = elastic.get("rdzvPort") or port_of("Worker")
                    env.append(env_value("PET_RDZV_ENDPOINT", f"{host}:{port}"))
                    env.append(env_value("PET_RDZV_BACKEND", elastic.get("rdzvBackend", "c10d")))
                    if elastic.get("minReplicas") is None and elastic.get("maxReplicas") is None:
                        env.append(env_value("PET_NNODES", specs["Worker"].get("replicas", 1)))
                    else:
                        env.append(env_value("PET_NNODES", f"{elastic.get('minReplicas')}:{elastic.get('maxReplicas')}"))
                    if elastic.get("maxRestarts") is not None:
                        env.append(env_value("PET_MAX_RESTARTS", elastic["maxRestarts"]))
                    if elastic.get("nProcPerNode") is not None:
                        env.append(env_value("PET_NPROC_PER_NODE", elastic["nProcPerNode"]))
                    if elastic.get("rdzvId") is not None:
                        env.append(env_value("PET_RDZV_ID", elastic["rdzvId"]))
                    if elastic.get("rdzvConf"):
                        env.append(env_value("PET_RDZV_CONF", ",".join(f"{k['key']}={k['value']}" for k in elastic["rdzvConf"])))
                    if elastic.get("standalone"):
                        env.append(env_value("PET_STANDALONE", ""))
                else:
                    env.append(env_value("PET_NNODES", total))
            if rtype == "Worker" and "Master" in specs:
                pod.waits.append(("init container init-pytorch (nslookup loop)", f"{name}-master-0"))
            pods.append(pod)
    return pods


def trainjob_jobset(tj, objects):
    """Kubeflow Trainer v2: the JobSet its jobset and torch plugins make of a TrainJob."""
    name = tj["metadata"]["name"]
    ref = tj["spec"]["runtimeRef"]
    kind = ref.get("kind", "ClusterTrainingRuntime")
    runtime = next(
        (o for o in objects if o.get("kind") == kind and o["metadata"]["name"] == ref["name"]), None
    )
    if runtime is None:
        raise Fail(f"TrainJob {name}: runtime {kind} {ref['name']} is not in the manifest")
    trainer = tj["spec"].get("trainer", {}) or {}
    policy = runtime["spec"].get("mlPolicy", {}) or {}
    num_nodes = trainer.get("numNodes", policy.get("numNodes", 1))
    res = trainer.get("resourcesPerNode")
    gpus = 0
    if res:
        gpus = int(str((res.get("limits") or {}).get("nvidia.com/gpu", 0)))
    nproc = str(trainer["numProcPerNode"]) if trainer.get("numProcPerNode") is not None else "auto"
    if nproc == "auto" and gpus == 0 and res:
        cpu = (res.get("requests") or {}).get("cpu") or (res.get("limits") or {}).get("cpu") or 0
        nproc = str(max(1, int(float(str(cpu).rstrip("m")) / (1000 if str(cpu).endswith("m") else 1))))
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    found = False
    for rj in spec.get("replicatedJobs", []):
        meta = rj["template"].get("metadata", {}) or {}
        if (meta.get("labels") or {}).get("trainer.kubeflow.org/trainjob-ancestor-step") != "trainer":
            continue
        rj["replicas"] = 1
        rj["template"]["spec"]["parallelism"] = num_nodes
        rj["template"]["spec"]["completions"] = num_nodes
        for c in rj["template"]["spec"]["template"]["spec"]["containers"]:
            if c["name"] != "node":
                continue
            found = True
            for k in ("image", "command", "args"):
                if trainer.get(k) is not None:
                    c[k] = copy.deepcopy(trainer[k])
            if res:
                c["resources"] = copy.deepcopy(res)
            upsert_env(c, trainer.get("env", []))
            upsert_env(
                c,
                [
                    env_value("PET_NNODES", num_nodes),
                    env_value("PET_NPROC_PER_NODE", nproc),
                    env_field("PET_NODE_RANK", "metadata.annotations['batch.kubernetes.io/job-completion-index']"),
                    env_value("PET_MASTER_ADDR", f"{name}-node-0-0.{name}"),
                    env_value("PET_MASTER_PORT", 29500),
                ],
            )
            ports = c.setdefault("ports", [])
            if not any(p.get("containerPort") == 29500 for p in ports):
                ports.append({"containerPort": 29500})
    if not found:
        raise Fail(f"TrainJob {name}: the runtime has no container 'node' in a Job labelled trainjob-ancestor-step=trainer")
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/trainjob-name": name}},
        "spec": spec,
    }


def volcano_pods(vj, services):
    """Volcano (pkg/controllers/job/plugins): the pytorch, svc and env plugins."""
    name = vj["metadata"]["name"]
    spec = vj["spec"]
    plugins = spec.get("plugins", {}) or {}
    tasks = spec["tasks"]
    pt = None
    if "pytorch" in plugins:
        pt = {"master": "master", "worker": "worker", "port": 23456}
        for a in plugins["pytorch"] or []:
            k, _, v = a.lstrip("-").partition("=")
            if k in pt:
                pt[k] = int(v) if k == "port" else v
    if "svc" in plugins or pt:
        services.append({"name": name, "headless": True, "selector": {"volcano.sh/job-name": name}, "why": f"Volcano Job {name}"})
    hosts = {}
    for t in tasks:
        tspec = t["template"].get("spec", {})
        hs = []
        for i in range(t.get("replicas", 1)):
            host = tspec.get("hostname") or f"{name}-{t['name']}-{i}"
            hs.append(f"{host}.{tspec.get('subdomain') or name}")
        hosts[t["name"]] = hs
    total = sum(t.get("replicas", 1) for t in tasks if pt and t["name"] in (pt["master"], pt["worker"]))
    pods = []
    for t in tasks:
        for i in range(t.get("replicas", 1)):
            pod = Pod(f"{name}-{t['name']}-{i}", t["template"], f"Volcano Job {name}, task {t['name']} {i}")
            pod.labels.update({"volcano.sh/job-name": name, "volcano.sh/job-namespace": NS, "volcano.sh/task-spec": t["name"]})
            pod.annotations.update({"volcano.sh/task-index": str(i), "volcano.sh/task-spec": t["name"], "volcano.sh/job-name": name})
            if "svc" in plugins or pt:
                pod.hostname = pod.spec.get("hostname") or pod.name
                pod.subdomain = pod.spec.get("subdomain") or name
            for c in pod.containers():
                env = c.setdefault("env", [])
                if pt:
                    mt = next(x for x in tasks if x["name"] == pt["master"])
                    mspec = mt["template"].get("spec", {})
                    mhost = mspec.get("hostname") or f"{name}-{pt['master']}-0"
                    maddr = f"{mhost}.{mspec.get('subdomain') or name}"
                    env += [env_value("MASTER_ADDR", maddr), env_value("MASTER_PORT", pt["port"]), env_value("WORLD_SIZE", total)]
                    if t["name"] == pt["worker"]:
                        env.append(env_value("RANK", i + 1))
                    elif t["name"] == pt["master"]:
                        env.append(env_value("RANK", 0))
                    if not any(p.get("containerPort") == pt["port"] for p in c.get("ports", [])):
                        c.setdefault("ports", []).append({"name": "pytorchjob-port", "containerPort": pt["port"]})
                if "env" in plugins:
                    env += [env_value("VK_TASK_INDEX", i), env_value("VC_TASK_INDEX", i)]
                if "svc" in plugins:
                    for tn, hs in hosts.items():
                        key = tn.replace("-", "_").upper()
                        env += [env_value(f"VC_{key}_HOSTS", ",".join(hs)), env_value(f"VC_{key}_NUM", len(hs))]
            pods.append(pod)
    return pods


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def build(objects):
    """All pods of a manifest, and the Services (manifest's and operators') that publish them."""
    services = []
    pods = []
    for o in objects:
        kind, api = o.get("kind"), o.get("apiVersion", "")
        if kind == "Service":
            s = o["spec"]
            services.append(
                {
                    "name": o["metadata"]["name"],
                    "headless": s.get("clusterIP") == "None",
                    "selector": s.get("selector") or {},
                    "ports": s.get("ports", []),
                    "why": "manifest",
                }
            )
        elif kind == "Job" and api == "batch/v1":
            pods += job_pods(o)
        elif kind == "StatefulSet":
            pods += statefulset_pods(o)
        elif kind == "JobSet":
            pods += jobset_pods(o, services)
        elif kind == "PyTorchJob":
            pods += pytorchjob_pods(o, services)
        elif kind == "TrainJob":
            pods += jobset_pods(trainjob_jobset(o, objects), services)
        elif kind == "Job" and api.startswith("batch.volcano.sh/"):
            pods += volcano_pods(o, services)
        elif kind in ("Secret", "ConfigMap", "TrainingRuntime", "ClusterTrainingRuntime", "PersistentVolumeClaim"):
            pass
        else:
            raise Fail(f"podsim does not know {api} {kind}")
    # Training pods first: pod 0 is the one whose DNS record comes late.
    pods.sort(key=lambda p: p.role != "main")
    return pods, services


# ---- environment, as the kubelet makes it -----------------------------------------------------


def expand(s, env):
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ is $, the rest stays."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "$" and i + 1 < len(s):
            if s[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if s[i + 1] == "(":
                j = s.find(")", i + 2)
                if j > 0:
                    name = s[i + 2 : j]
                    out.append(env[name] if name in env else s[i : j + 1])
                    i = j + 1
                    continue
        out.append(s[i])
        i += 1
    return "".join(out)


def field(pod, path):
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        d = pod.labels if m.group(1) == "labels" else pod.annotations
        return d.get(m.group(2), "")
    simple = {
        "metadata.name": pod.name,
        "metadata.namespace": NS,
        "metadata.uid": pod.uid,
        "spec.nodeName": f"node-{pod.ip}",
        "spec.serviceAccountName": pod.spec.get("serviceAccountName", "default"),
        "status.podIP": pod.ip,
        "status.podIPs": pod.ip,
        "status.hostIP": pod.ip,
    }
    if path not in simple:
        raise Fail(f"pod {pod.name}: fieldRef {path} is not simulated")
    return simple[path]


def service_env(services, pods):
    """The docker-link style variables of every Service with a cluster IP (enableServiceLinks)."""
    env = {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBERNETES_SERVICE_PORT_HTTPS": "443",
        "KUBERNETES_PORT": "tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
        "KUBERNETES_PORT_443_TCP_PORT": "443",
        "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1",
    }
    for s in services:
        if s["headless"] or not s.get("ports"):
            continue
        ip = service_ips(s, pods)
        if not ip:
            continue
        key = s["name"].upper().replace("-", "_")
        p = s["ports"][0]
        env[f"{key}_SERVICE_HOST"] = ip[0]
        env[f"{key}_SERVICE_PORT"] = str(p["port"])
        env[f"{key}_PORT"] = f"tcp://{ip[0]}:{p['port']}"
    return env


def container_env(pod, c, secrets, svc_env):
    env = dict(svc_env)
    for e in c.get("env", []):
        name = e["name"]
        if "valueFrom" not in e:
            env[name] = expand(str(e.get("value", "")), env)
            continue
        src = e["valueFrom"]
        if "fieldRef" in src:
            env[name] = field(pod, src["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            key = f"{ref['name']}/{ref['key']}"
            if key not in secrets:
                if ref.get("optional"):
                    continue
                raise Fail(f"pod {pod.name}: secret {key} is not given (--secret {key}=VALUE)")
            env[name] = secrets[key]
        else:
            raise Fail(f"pod {pod.name}: env {name}: {list(src)} is not simulated")
    return env


# ---- DNS --------------------------------------------------------------------------------------


def selects(sel, pod):
    return bool(sel) and all(pod.labels.get(k) == v for k, v in sel.items())


def service_ips(s, pods):
    if s.get("pod"):
        return [p.ip for p in pods if p.name == s["pod"]]
    return [p.ip for p in pods if selects(s["selector"], p)]


def names(n):
    """A name and what the pods' search path (<ns>.svc.cluster.local, ...) makes of it."""
    return [n, f"{n}.{NS}", f"{n}.{NS}.svc", f"{n}.{NS}.{DOMAIN}"]


def dns_records(pods, services):
    """{pod index: [names]} as the cluster DNS publishes them."""
    recs = {i: [] for i in range(len(pods))}
    for s in services:
        for i, p in enumerate(pods):
            member = (s.get("pod") == p.name) if s.get("pod") else selects(s["selector"], p)
            if not member:
                continue
            recs[i] += names(s["name"])
            if s["headless"] and p.subdomain == s["name"]:
                recs[i] += names(f"{p.hostname}.{s['name']}")
    return recs


# ---- commands ---------------------------------------------------------------------------------


def rewrite_argv(argv, subs):
    """--sub on an exec-form command: FROM's words, in a row, become TO's."""
    for old, new in subs:
        o, n = shlex.split(old), shlex.split(new)
        i = 0
        while o and i + len(o) <= len(argv):
            if argv[i : i + len(o)] == o:
                argv = argv[:i] + n + argv[i + len(o) :]
                i += len(n)
            else:
                i += 1
    return argv


def rewrite(s, subs, mounts):
    """--sub inside one string (a shell script's text, an env value), and the volumes' paths."""
    for old, new in subs:
        s = s.replace(old, new)
    for path in sorted(mounts, key=len, reverse=True):
        s = re.sub(r"(?<![\w./-])" + re.escape(path) + r"(?=$|[/\s\"',:;=])", VOLUME_ROOT + path, s)
    return s


def render(args):
    objects = load(args.manifest)
    pods, services = build(objects)
    ips = args.ips.split(",")
    if len(ips) < len(pods):
        raise Fail(f"{len(pods)} pods, {len(ips)} addresses")
    for p, ip in zip(pods, ips):
        p.ip = ip
    secrets = dict(s.split("=", 1) for s in args.secret)
    overrides = dict(e.split("=", 1) for e in args.env)
    added = dict(e.split("=", 1) for e in args.add_env)
    added_fields = dict(e.split("=", 1) for e in args.add_env_field)
    subs = [tuple(s) for s in args.sub]
    out = args.out
    image = os.path.abspath(args.image)
    svc_env = service_env(services, pods)
    recs = dns_records(pods, services)
    changes = []
    with open(os.path.join(out, "pods"), "w") as f:
        for i, p in enumerate(pods):
            f.write(f"{i} {p.name} {p.role} {p.hostname} {p.ip}\n")
    with open(os.path.join(out, "dns-now"), "w") as now, open(os.path.join(out, "dns-late"), "w") as late:
        for i, p in enumerate(pods):
            if recs[i]:
                (late if i == 0 else now).write(f"{p.ip}\t{' '.join(dict.fromkeys(recs[i]))}\n")
    for i, p in enumerate(pods):
        d = os.path.join(out, str(i))
        os.makedirs(os.path.join(d, "tmp"), exist_ok=True)
        os.chmod(os.path.join(d, "tmp"), 0o1777)
        cs = p.containers()
        if len(cs) != 1:
            raise Fail(f"pod {p.name}: {len(cs)} containers; podsim runs one")
        c = cs[0]
        env = container_env(p, c, secrets, svc_env)
        for k, path in added_fields.items():
            v = field(p, path)
            changes.append(f"{p.name}: {k}={v} added (fieldRef {path})")
            env[k] = v
        for k, v in added.items():
            changes.append(f"{p.name}: {k}={v} added")
            env[k] = v
        for k in args.drop_env:
            if k in env:
                changes.append(f"{p.name}: {k} dropped (was {env.pop(k)!r})")
        for k, v in overrides.items():
            if k in env and env[k] != v:
                changes.append(f"{p.name}: {k}={v} (was {env.get(k, 'unset')!r})")
                env[k] = v
        cmd = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
        if not cmd:
            raise Fail(f"pod {p.name}: no command (the image's entrypoint is not simulated)")
        # Volumes: a claim is shared by the pods, an emptyDir is the pod's own.
        vols = {v["name"]: v for v in p.spec.get("volumes", [])}
        mounts, shm = {}, "64m"
        for m in c.get("volumeMounts", []):
            v = vols[m["name"]]
            if m["mountPath"] == "/dev/shm":
                shm = str((v.get("emptyDir") or {}).get("sizeLimit", "64Mi")).replace("Gi", "g").replace("Mi", "m")
                continue
            if "persistentVolumeClaim" in v:
                src = os.path.join(out, "vol", "pvc-" + v["persistentVolumeClaim"]["claimName"])
            elif "emptyDir" in v:
                src = os.path.join(d, "vol", m["name"])
            else:
                raise Fail(f"pod {p.name}: volume {m['name']}: only persistentVolumeClaim and emptyDir are simulated")
            os.makedirs(src, exist_ok=True)
            mounts[m["mountPath"]] = src
        new_cmd = [rewrite(a, subs, mounts) for a in rewrite_argv(cmd, subs)]
        if new_cmd != cmd:
            changes.append(f"{p.name}: command {shlex.join(cmd)}\n    -> {shlex.join(new_cmd)}")
        for k in list(env):
            nv = rewrite(env[k], subs, mounts)
            if nv != env[k]:
                changes.append(f"{p.name}: {k}={nv} (was {env[k]!r})")
                env[k] = nv
        # What the container runtime adds: the image's PATH, HOME, HOSTNAME.
        full = {"PATH": f"{IMAGE_ROOT}/bin:{IMAGE_PATH}", "HOSTNAME": p.hostname, "HOME": "/root"}
        full.update(env)
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
            if p.subdomain:
                f.write(f"{p.ip}\t{p.hostname}.{p.subdomain}.{NS}.{DOMAIN}\t{p.hostname}\n")
            else:
                f.write(f"{p.ip}\t{p.hostname}\n")
            f.write("# records the cluster DNS publishes (tests/lib/podsim.sh appends them)\n")
        with open(os.path.join(d, "resolv.conf"), "w") as f:
            # Names missing from the hosts file fail at once: nothing answers here.
            f.write(f"search {NS}.{DOMAIN} {DOMAIN} cluster.local\nnameserver 127.0.0.1\noptions ndots:5 attempts:1 timeout:1\n")
        q = shlex.quote
        lines = [
            "#!/bin/sh",
            f"# Pod {p.name} ({p.workload}) of {args.manifest}, rendered by tests/lib/podsim.py.",
            "# Run by tests/lib/podsim.sh in its own network, UTS and mount namespaces.",
            "set -e",
            f"hostname {q(p.hostname)}",
            f"mount --bind {q(os.path.join(d, 'hosts'))} /etc/hosts",
            f"mount --bind {q(os.path.join(d, 'resolv.conf'))} /etc/resolv.conf",
            f"mount -t tmpfs -o size={shm},mode=1777 shm /dev/shm",
            f"mount -t tmpfs -o size=1m,mode=755 podsim {VOLUME_ROOT}",
            f"mkdir -p {IMAGE_ROOT}",
            f"mount --bind {q(image)} {IMAGE_ROOT}",
        ]
        for path, src in mounts.items():
            lines += [f"mkdir -p {q(VOLUME_ROOT + path)}", f"mount --bind {q(src)} {q(VOLUME_ROOT + path)}"]
        lines += [f"mount --bind {q(os.path.join(d, 'tmp'))} /tmp", "set +e"]
        for why, name in p.waits:
            lines += [f"# {why}: waits until {name} resolves", f"until getent hosts {q(name)} >/dev/null; do sleep 0.1; done"]
        lines += [f"cd {q(c.get('workingDir', '/'))}", "exec env -i \\"]
        lines += [f"    {q(f'{k}={v}')} \\" for k, v in full.items()]
        lines.append("    " + " ".join(q(a) for a in new_cmd))
        with open(os.path.join(d, "run.sh"), "w") as f:
            f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "changes"), "w") as f:
        f.write("".join(x + "\n" for x in changes))


def shutdown_timeout(env, argv):
    for i, a in enumerate(argv):
        for flag in ("--shutdown_timeout", "--shutdown-timeout"):
            if a == flag and i + 1 < len(argv):
                return float(argv[i + 1])
            if a.startswith(flag + "="):
                return float(a.split("=", 1)[1])
    return float(env.get("PET_SHUTDOWN_TIMEOUT", 30))


def check(args):
    """What docs/kubernetes.md promises of every manifest, for every training pod."""
    objects = load(args.manifest)
    pods, _ = build(objects)
    problems = []
    for p in pods:
        if p.role != "main":
            continue
        c = p.containers()[0]
        env = {e["name"]: e for e in c.get("env", [])}
        words = " ".join((c.get("command") or []) + (c.get("args") or [])).split()
        vals = {k: e.get("value", "") for k, e in env.items()}
        grace = p.spec.get("terminationGracePeriodSeconds", 30)
        st = shutdown_timeout(vals, words)
        if grace <= st:
            problems.append(f"{p.name}: terminationGracePeriodSeconds {grace} is not longer than --shutdown_timeout {st:g}")
        etcd = vals.get("PET_RDZV_BACKEND") == "etcd" or "etcd" in words
        tok = env.get("MG_RDZV_TOKEN")
        if not etcd and not (tok and "secretKeyRef" in tok.get("valueFrom", {})):
            problems.append(f"{p.name}: MG_RDZV_TOKEN does not come from a Secret")
        nproc = vals.get("PET_NPROC_PER_NODE")
        for i, a in enumerate(words):
            if a in ("--nproc_per_node", "--nproc-per-node") and i + 1 < len(words):
                nproc = words[i + 1]
        gpus = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
        if nproc not in ("gpu", "auto"):
            problems.append(f"{p.name}: --nproc_per_node is {nproc!r}, not gpu or auto")
        if not gpus:
            problems.append(f"{p.name}: no nvidia.com/gpu limit")
        if not ((c.get("resources") or {}).get("requests") or {}).get("cpu"):
            problems.append(f"{p.name}: no cpu request")
    for x in problems:
        print(x)
    if not problems:
        print(f"ok: {sum(p.role == 'main' for p in pods)} training pods")
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("pods", "jobset", "check"):
        sub.add_parser(name).add_argument("manifest")
    r = sub.add_parser("render")
    r.add_argument("manifest")
    r.add_argument("--out", required=True)
    r.add_argument("--ips", required=True)
    r.add_argument("--image", required=True, help="the build directory (its bin/ is the image's)")
    r.add_argument("--secret", action="append", default=[], metavar="NAME/KEY=VALUE")
    r.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="a new value where the pod has NAME")
    r.add_argument("--add-env", action="append", default=[], metavar="NAME=VALUE")
    r.add_argument("--add-env-field", action="append", default=[], metavar="NAME=FIELDPATH", help="e.g. PET_LOCAL_ADDR=status.podIP")
    r.add_argument("--drop-env", action="append", default=[], metavar="NAME", help="as if the manifest did not set NAME")
    r.add_argument("--sub", action="append", default=[], nargs=2, metavar=("FROM", "TO"))
    a = ap.parse_args()
    try:
        if a.cmd == "pods":
            for i, p in enumerate(build(load(a.manifest))[0]):
                print(i, p.name, p.role)
        elif a.cmd == "jobset":
            objects = load(a.manifest)
            tj = next((o for o in objects if o.get("kind") == "TrainJob"), None)
            if tj is None:
                raise Fail("no TrainJob in the manifest")
            yaml.safe_dump(trainjob_jobset(tj, objects), sys.stdout, sort_keys=False)
        elif a.cmd == "check":
            return check(a)
        else:
            render(a)
    except (Fail, KeyError) as e:
        print(f"podsim: {a.manifest}: {e}", file=sys.stderr)
        return 1
    return 0


sys.exit(main())

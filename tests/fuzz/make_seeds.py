#!/usr/bin/python3
"""Writes the hand-made seed inputs of the fuzz harnesses into
tests/fuzz/corpus/NAME/ (seed-*). Findings are added beside them by hand, as
finding-*. Run from the top of the tree; the checkpoint and event-log seeds
come from real runs of the binaries in build/ (MG_BUILD)."""
import glob, os, shutil, struct, subprocess, sys, tempfile, zlib

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(TOP, "tests/fuzz/corpus")
BUILD = os.environ.get("MG_BUILD", os.path.join(TOP, "build"))


def put(name, seeds):
    d = os.path.join(CORPUS, name)
    os.makedirs(d, exist_ok=True)
    for old in glob.glob(os.path.join(d, "seed-*")):
        os.remove(old)
    for i, s in enumerate(seeds):
        with open(os.path.join(d, "seed-%02d" % i), "wb") as f:
            f.write(s if isinstance(s, bytes) else s.encode())


# ---- the store protocol (docs/store-protocol.md) ----
PING, SET, GET, ADD, CAS, WAIT, CHECK, DELETE, WATCH, LIST = range(1, 11)


def hello(lease=0, flags=0, version=1):
    return b"MGST" + struct.pack("<HHI", version, flags, lease) + bytes(range(32))


def shello(status=0, flags=0):
    return b"MGST" + struct.pack("<HHI", 1, status, flags) + bytes(32)


def key(k):
    k = k.encode() if isinstance(k, str) else k
    return struct.pack("<H", len(k)) + k


def val(v):
    v = v.encode() if isinstance(v, str) else v
    return struct.pack("<I", len(v)) + v


def frame(op, body=b"", flags=0, status=0, fid=1):
    return struct.pack("<IBBHI", len(body), op, flags, status, fid) + body


def requests():
    return [
        frame(PING, fid=1),
        frame(SET, key("job/1") + val("hi"), fid=2),
        frame(SET, key("eph") + val("x"), flags=1, fid=3),
        frame(GET, struct.pack("<I", 0) + key("job/1"), fid=4),
        frame(GET, struct.pack("<I", 50) + key("missing"), fid=5),
        frame(ADD, struct.pack("<q", 5) + key("n"), fid=6),
        frame(CAS, key("c") + val("") + val("new"), flags=1, fid=7),
        frame(CAS, key("c") + val("new") + val("newer"), fid=8),
        frame(WAIT, struct.pack("<IH", 30, 2) + key("job/1") + key("w"), fid=9),
        frame(CHECK, struct.pack("<H", 1) + key("job/1"), fid=10),
        frame(WATCH, struct.pack("<qI", 0, 40) + key("job/1"), fid=11),
        frame(LIST, struct.pack("<I", 10) + key(""), fid=12),
        frame(DELETE, key("job/1"), fid=13),
        frame(0x33, b"\0" * 8, fid=14),
    ]


def replies():
    return [
        frame(SET | 0x80, struct.pack("<q", 7)),
        frame(GET | 0x80, status=1),
        frame(GET | 0x80, struct.pack("<q", 3) + val("v"), flags=1),
        frame(ADD | 0x80, struct.pack("<qq", 4, 5)),
        frame(CAS | 0x80, struct.pack("<q", 2) + val("new"), flags=3),
        frame(LIST | 0x80, struct.pack("<II", 2, 2) + key("a") + key("b")),
        frame(0xff, status=3),
    ]


def store_proto():
    rq, ry = requests(), replies()
    return ([hello(5000) + b"".join(rq), shello(0) + b"".join(ry)] + rq + ry +
            [b"\x80" + b"".join(rq[:3])])


def chunks(*parts):
    """Chunks of the store_server harness: (client, bytes) or (client, None) to close."""
    out = b""
    for who, data in parts:
        if data is None:
            out += bytes([0x80 | who, 0])
            continue
        while True:
            n = min(len(data), 255)
            out += bytes([who, n]) + data[:n]
            data = data[n:]
            if not data:
                break
    return out


def store_server():
    rq = requests()
    return [
        bytes([0]) + chunks((0, hello() + b"".join(rq))),
        bytes([1]) + chunks((0, hello()), (1, hello(1000)), (0, rq[1]), (1, rq[4]), (0, rq[2]),
                            (0, None), (1, rq[10]), (1, rq[8])),
        bytes([3]) + chunks((0, hello()), (0, rq[10]), (2, hello()), (2, rq[2]), (2, None),
                            (3, hello(version=2)), (1, b"GET / HTTP/1.1\r\n\r\n")),
        bytes([1]) + chunks((0, hello()), (0, frame(SET, key("big") + val("x" * 7000)))),
        bytes([0]) + chunks((0, hello(flags=1))),
    ]


def json_seeds():
    return [
        '{"message": {"message": "allreduce failed", "extraInfo": {"py_callstack": "Traceback",'
        ' "timestamp": "1700000000", "rank": "1", "hostname": "node-a"}}}',
        '{"message": "RuntimeError: boom", "errorCode": 7}',
        '[1, -2.5e3, true, false, null, "a\\u00e9\\n\\"", {"k": [[], {}]}]',
        '{"a": {"b": {"c": {"d": [0.1, 1e308, -0, 123456789012345678901]}}}}',
        '"\\ud83d\\ude00 \\t"',
    ]


def idx(magic, dims, data):
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + data


def idx_seeds():
    # first byte: 1 asks for a 1-dimensional file (labels), 0 for 3 (images)
    return [
        b"\x01" + idx(0x801, [4], bytes([0, 1, 2, 9])),
        b"\x00" + idx(0x803, [2, 2, 3], bytes(range(12))),
        b"\x00" + idx(0x803, [1, 28, 28], bytes(784)),
        b"\x01" + idx(0x803, [1, 1, 1], b"\x00"),
    ]


def rdzv_conf_seeds():
    return [
        "join_timeout=30,last_call_timeout=1,heartbeat_interval=0.5,heartbeat_timeout=2",
        "read_timeout=500ms,close_timeout=2s,is_host=true,token=s3cret",
        "cacert=/nonexistent/ca.pem,prefix=/mg/x",
        "keep_alive_interval=1,keep_alive_max_attempt=3",
        "exit_barrier_timeout=0.25,is_host=0",
    ]


def rdzv_records_seeds():
    return [
        b"\x00id=node0-42-ab12 host=node0 addr=10.0.0.1 port=29500 nproc=4 prev=-1 fixed=0",
        b"\x00id=a host=h addr=::1 port=1 nproc=1 prev=3 fixed=1",
        b"\x01rank=3 local_rank=1 exit=7 signal=0 pid=4242 time=1700000000.125 host=node1\n"
        b"worker exited with code 7",
        b"\x02gpu[07-09,11],rack[1-2]-node[01-02],n[008-010]",
        b"\x03SLURM_JOB_ID=77\nSLURM_STEP_NUM_NODES=3\nSLURM_NODEID=1\n"
        b"SLURM_STEP_NODELIST=gpu[07-09]\nSLURM_NNODES=3",
    ]


def args(*a):
    return "\0".join(a)


def mglaunch_seeds():
    return [
        args("--nproc_per_node", "2", "train", "--epochs", "1"),
        args("--nnodes=1:4", "--rdzv_backend", "c10d", "--rdzv_endpoint", "node0:29400",
             "--rdzv_id", "job", "--max_restarts", "3", "prog"),
        args("--standalone", "--nproc-per-node=gpu", "--gpu_ids", "3,1,0", "-r", "0:3,1:1",
             "--tee", "3", "--log_line_prefix_template", "[${rank}]", "x.py"),
        args("--local_ranks_filter", "0,1", "--master_addr", "10.0.0.1", "--master_port", "0",
             "--monitor_interval", "0.1", "--shutdown_timeout", "2", "-m", "mod"),
        args("PET_NPROC_PER_NODE=auto", "PET_NNODES=2", "PET_RDZV_CONF=join_timeout=5", "prog"),
        args("--help"),
    ]


def train_seeds():
    return [
        args("--model", "cnn", "--data", "fashion-mnist", "--epochs", "2", "--batch-size", "32"),
        args("--model=mlp", "--hidden", "64,32", "--dropout", "0.1", "--optimizer", "adamw",
             "--betas", "0.9,0.99", "--schedule", "cosine", "--warmup", "10"),
        args("--steps", "100", "--accum-steps", "4", "--global-batch-size", "256", "--scale-lr",
             "linear", "--checkpoint-dir", "ck", "--resume", "auto", "--keep-checkpoints", "2"),
        args("--metrics", "m.jsonl", "--check-replicas", "10", "--bucket-cap-mb", "0.5",
             "--no-comm-thread", "--device", "cpu", "--threads", "2"),
        args("--version"),
    ]


def run_seeds():
    """A real checkpoint and a real event log (with a failure and a restart)."""
    ck, ev = [], []
    train = os.path.join(BUILD, "bin/train")
    mglaunch = os.path.join(BUILD, "bin/mglaunch")
    fw = os.path.join(BUILD, "tests/helpers/fakeworker")
    with tempfile.TemporaryDirectory() as t:
        env = dict(os.environ, TMPDIR=t)
        subprocess.run([train, "--model", "mlp", "--hidden", "2", "--data", "synthetic",
                        "--train-samples", "64", "--test-samples", "16", "--steps", "2",
                        "--checkpoint-dir", t + "/ck", "--checkpoint-every", "1"],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for p in sorted(glob.glob(t + "/ck/*.mgc"))[:1]:
            ck.append(open(p, "rb").read())
        subprocess.run([mglaunch, "--nproc_per_node", "2", "--max_restarts", "1",
                        "--monitor_interval", "0.1", "--log_dir", t + "/logs", "--rdzv_id", "r",
                        fw, "if", "restart=0,local_rank=1", "error-json", "boom", "if",
                        "restart=0,local_rank=1", "exit", "3"],
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ev.append(open(t + "/logs/r/events.jsonl", "rb").read())
    return ck, ev


def main():
    put("store_proto", store_proto())
    put("store_server", store_server())
    put("json", json_seeds())
    put("idx", idx_seeds())
    put("rdzv_conf", rdzv_conf_seeds())
    put("rdzv_records", rdzv_records_seeds())
    put("mglaunch_args", mglaunch_seeds())
    put("train_args", train_seeds())
    ck, ev = run_seeds()
    # mode byte 0: the file as it is; 1: header + uncompressed payload (fuzz_checkpoint.c)
    raw = zlib.decompress(ck[0][64:])
    put("checkpoint", [b"\0" + ck[0], b"\0" + ck[0][:64], b"\0" + ck[0][:100],
                       b"\1" + ck[0][:64] + raw[:4096], b"\1" + ck[0][:64] + raw])
    put("events", ev + [ev[0][: len(ev[0]) // 2], b'{"event":"run_start"}\n{"event":"run_end","result":"failed"}\n'])


if __name__ == "__main__":
    main()

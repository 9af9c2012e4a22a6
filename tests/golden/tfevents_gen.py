#!/usr/bin/python3
"""Writes tests/golden/metrics.tfevents, the TensorBoard event file that
tests/unit/test_metrics_tb.c expects mg's writer to produce byte for byte for
the same calls (listed beside each event below, with the test's pinned clock:
1700000000 s, then 0.25 s more at each call).

The writer here shares nothing with mg's: payloads come from `protoc --encode`
(Debian's protobuf-compiler) with tfevents.proto, and the TFRecord framing's
masked CRC32C from crcmod (Debian's python3-crcmod). Run it with Debian's
python (the one on PATH may lack crcmod):

    /usr/bin/python3 tests/golden/tfevents_gen.py     # rewrites metrics.tfevents

It prints the file's plain CRC32C, which the unit test also checks.
"""
import os
import struct
import subprocess

import crcmod.predefined

HERE = os.path.dirname(os.path.abspath(__file__))
crc32c = crcmod.predefined.mkCrcFun("crc-32c")

T0 = 1700000000.0
HPARAMS = ("| setting | value |\n|---|---|\n"
           "| lr | 0.1 |\n| batch\\_size | 64 |\n| model | mlp\\|cnn |\n")


def text(s):
    """A proto text-format string literal."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def scalars(*pairs):
    return " ".join('value { tag: %s simple_value: %s }' % (text(t), v) for t, v in pairs)


EVENTS = [
    # mg_metrics_open: the file's first record
    'wall_time: %r file_version: "brain.Event:2"' % T0,
    # mg_metrics_start(m, 0)
    "wall_time: %r session_log { status: START }" % (T0 + 0.25),
    # mg_metrics_hparams(lr 0.1, batch_size 64, model "mlp|cnn")
    ('wall_time: %r summary { value { tag: "hparams" '
     'metadata { plugin_data { plugin_name: "text" } } '
     'tensor { dtype: DT_STRING tensor_shape { dim { size: 1 } } string_val: %s } } }')
    % (T0 + 0.5, text(HPARAMS)),
    # mg_metrics_record(train, 10: epoch 1, loss 2.302585, accuracy 0.125, lr 0.1)
    "wall_time: %r step: 10 summary { %s }" % (T0 + 0.75, scalars(
        ("epoch", 1), ("train/loss", 2.302585), ("train/accuracy", 0.125), ("train/lr", 0.1))),
    # mg_metrics_record(eval, 10: test_loss 2.25, test_accuracy 0.2)
    "wall_time: %r step: 10 summary { %s }" % (T0 + 1.0, scalars(
        ("eval/test_loss", 2.25), ("eval/test_accuracy", 0.2))),
    # mg_metrics_scalar(20, "straggler/step_time_spread_s", 0): a zero is still written
    "wall_time: %r step: 20 summary { %s }" % (T0 + 1.25, scalars(
        ("straggler/step_time_spread_s", 0))),
    # mg_metrics_record(summary, 20: samples 1280, param_hash "00ff"): the text is left out
    "wall_time: %r step: 20 summary { %s }" % (T0 + 1.5, scalars(("summary/samples", 1280))),
    # mg_metrics_record(note, 30: text only): no event (the clock still moves)
    # mg_metrics_start(m, 20): a restart resumed from step 20
    "wall_time: %r step: 20 session_log { status: START }" % (T0 + 2.0),
    # mg_metrics_record(train, 2^40: loss inf, accuracy nan, lr -0)
    "wall_time: %r step: %d summary { %s }" % (T0 + 2.25, 1 << 40, scalars(
        ("train/loss", "inf"), ("train/accuracy", "nan"), ("train/lr", "-0"))),
]


def encode(event):
    out = subprocess.run(
        ["protoc", "--encode=tensorboard.Event", "-I", HERE, "tfevents.proto"],
        input=event.encode(), capture_output=True, check=True, cwd=HERE)
    return out.stdout


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def main():
    blob = b""
    for ev in EVENTS:
        data = encode(ev)
        head = struct.pack("<Q", len(data))
        blob += head + struct.pack("<I", masked(head)) + data + struct.pack("<I", masked(data))
    with open(os.path.join(HERE, "metrics.tfevents"), "wb") as f:
        f.write(blob)
    print("metrics.tfevents: %d bytes, %d records, CRC32C 0x%08X" % (len(blob), len(EVENTS),
                                                                  crc32c(blob)))


if __name__ == "__main__":
    main()

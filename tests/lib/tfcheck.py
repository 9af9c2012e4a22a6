#!/usr/bin/python3
# tfcheck.py FILE [DUMPDIR]: reads a TensorBoard event file (TFRecord framing)
# with crcmod, sharing no code with libmg's writer: checks every record's two
# masked CRC32Cs and writes payload K to DUMPDIR/K.pb (for protoc --decode_raw).
# Prints "ok: N records"; exits 1 at the first bad record, naming it.
# Run it with Debian's /usr/bin/python3 (python3-crcmod).
import os, struct, sys
import crcmod.predefined
crc = crcmod.predefined.mkCrcFun("crc-32c")
def masked(b):
    c = crc(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
data = open(sys.argv[1], "rb").read()
dump = sys.argv[2] if len(sys.argv) > 2 else None
off = n = 0
while off < len(data):
    if len(data) - off < 12:
        sys.exit("record %d: truncated header" % n)
    head = data[off:off + 8]
    (length,) = struct.unpack("<Q", head)
    (hcrc,) = struct.unpack("<I", data[off + 8:off + 12])
    if hcrc != masked(head):
        sys.exit("record %d: bad length crc" % n)
    if len(data) - off < 16 + length:
        sys.exit("record %d: truncated data" % n)
    body = data[off + 12:off + 12 + length]
    (dcrc,) = struct.unpack("<I", data[off + 12 + length:off + 16 + length])
    if dcrc != masked(body):
        sys.exit("record %d: bad data crc" % n)
    if dump:
        open(os.path.join(dump, "%d.pb" % n), "wb").write(body)
    off += 16 + length
    n += 1
print("ok: %d records" % n)

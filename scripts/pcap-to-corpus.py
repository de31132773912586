#!/usr/bin/env python3
"""Writes each frame of classic pcap files as one file of a fuzz corpus.
usage: pcap-to-corpus.py OUTDIR FILE.pcap..."""
import os
import struct
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
n = 0
for path in sys.argv[2:]:
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack("<I", data[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(endian + "IIII", data[off:off + 16])
        off += 16
        with open(os.path.join(out, "%s-%05d" % (os.path.basename(path), n)), "wb") as o:
            o.write(data[off:off + incl])
        off += incl
        n += 1
print(n)

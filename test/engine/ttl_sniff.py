#!/usr/bin/env python3
import socket, struct, sys, time
# ttl_sniff.py IFACE SECONDS: prints the TTLs of the RoCEv2 (UDP 4791) IPv4 frames seen on IFACE.
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
s.bind((sys.argv[1], 0))
s.settimeout(0.2)
end = time.time() + float(sys.argv[2])
ttls = {}
while time.time() < end:
    try:
        f = s.recv(2048)
    except socket.timeout:
        continue
    if len(f) < 42 or f[23] != 17:
        continue
    ihl = (f[14] & 0x0F) * 4
    if struct.unpack("!H", f[14 + ihl + 2:14 + ihl + 4])[0] != 4791:
        continue
    ttls[f[22]] = ttls.get(f[22], 0) + 1
print(" ".join(f"ttl{t}={n}" for t, n in sorted(ttls.items())))

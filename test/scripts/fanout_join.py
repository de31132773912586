#!/usr/bin/env python3
"""fanout_join.py IFACE: joins an AF_PACKET socket on IFACE to the fanout group
DPDK 22.11's net_af_packet uses (rte_pmd_init_internals: id (getpid() ^ ifindex)
& 0xffff, PACKET_FANOUT_HASH | FLAG_DEFRAG | FLAG_ROLLOVER, after bind), prints
"joined PID ID" or "refused PID ID ERRNO-NAME" (exit 1), and in the joined case
keeps the socket until SIGTERM (60 s at most)."""
import errno
import os
import select
import signal
import socket
import struct
import sys

SOL_PACKET = 263
PACKET_FANOUT = 18
PACKET_FANOUT_HASH = 0
PACKET_FANOUT_FLAG_ROLLOVER = 0x1000
PACKET_FANOUT_FLAG_DEFRAG = 0x8000
ETH_P_ALL = 0x0003

iface = sys.argv[1]
ifindex = socket.if_nametoindex(iface)
pid = os.getpid()
gid = (pid ^ ifindex) & 0xFFFF
arg = gid | ((PACKET_FANOUT_HASH | PACKET_FANOUT_FLAG_DEFRAG | PACKET_FANOUT_FLAG_ROLLOVER) << 16)
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
s.bind((iface, ETH_P_ALL))
try:
    s.setsockopt(SOL_PACKET, PACKET_FANOUT, struct.pack("I", arg))
except OSError as e:
    print(f"refused {pid} {gid} {errno.errorcode.get(e.errno, e.errno)}", flush=True)
    sys.exit(1)
print(f"joined {pid} {gid}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
select.select([], [], [], 60)

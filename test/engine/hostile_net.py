#!/usr/bin/env python3
"""Hostile frames at a live droced node, each class checked in its counters.

Run by hostile_net.sh in the attacker's namespace: IFACE is the kernel end of
the node's veth (frames sent on it reach the node's af_packet port at once,
and every frame to or from the node passes it, so it is also where the live
transfer is sniffed). The attacker's own address (ATTACKER_IP, the kernel's
bridge address, ATTACKER_MAC) is the peer of the target QPs that
hostile_target created on the node (TARGET_FILE: its "mr ..." and "qp ..."
lines), so requests with a wrong key, a wrong length or a wild VA, and
responses nobody asked for, hit QPs of their own; the data-checked transfer
between the node and its real peer (PEER_IP) is attacked only by frames its
QP must refuse (spoofed source, malformed, truncated, bad ICRC).

For each class: read the node's counters (droce-ctl --json counters), send
the frames, wait (bounded) until each counter the class must raise has gone
up by at least the number of frames that must land there. One line per
class, "ok" or "FAIL"; exit 1 if any class failed.

  hostile_net.py --ctl DROCE_CTL --sock CTL_SOCKET --iface IFACE
      --node-ip IP --node-mac MAC --peer-ip IP --attacker-ip IP --attacker-mac MAC
      --target TARGET_FILE

The ICRC follows IBTA A17.3.3 as rdma_rxe computes it (from the team's
rxe-peer roceprobe.py): CRC-32 over 8 bytes of 0xff, the IPv4 header with
TOS, TTL and checksum as ones, the UDP header with checksum as ones, the BTH
with byte 4 as ones, then the rest of the packet; stored little-endian.
"""
import argparse
import json
import socket
import struct
import subprocess
import sys
import time
import zlib

ROCE_PORT = 4791
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4

# BTH opcodes (IBTA 9.2)
RC_SEND_ONLY = 0x04
RC_WRITE_ONLY = 0x0A
RC_READ_REQUEST = 0x0C
RC_READ_RESPONSE_ONLY = 0x10
RC_ACK = 0x11
RC_ATOMIC_ACK = 0x12
UD_SEND_ONLY = 0x64
AETH_NAK_REMOTE_ACCESS = 0x62
AETH_NAK_INVALID_REQUEST = 0x61


def icrc(ip_udp_ib: bytes) -> bytes:
    ihl = (ip_udp_ib[0] & 0x0F) * 4
    b = bytearray(ip_udp_ib)
    b[1] = 0xFF
    b[8] = 0xFF
    b[10:12] = b"\xff\xff"
    b[ihl + 6:ihl + 8] = b"\xff\xff"
    b[ihl + 8 + 4] = 0xFF
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(b)) & 0xFFFFFFFF)


def ip_checksum(hdr: bytes) -> int:
    s = sum(struct.unpack("!%dH" % (len(hdr) // 2), hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def mac_bytes(m: str) -> bytes:
    return bytes.fromhex(m.replace(":", ""))


def bth(opcode, dqpn, psn, pad=0, tver=0, ackreq=False, pkey=0xFFFF):
    return struct.pack("!BBHB3sB3s", opcode, (pad << 4) | tver, pkey, 0, dqpn.to_bytes(3, "big"),
                       0x80 if ackreq else 0, (psn & 0xFFFFFF).to_bytes(3, "big"))


def reth(va, rkey, length):
    return struct.pack("!QII", va, rkey, length)


def aeth(syndrome, msn):
    return struct.pack("!B3s", syndrome, msn.to_bytes(3, "big"))


class Frames:
    """Builds Ethernet/IPv4/UDP/IB frames from src to the node."""

    def __init__(self, a):
        self.node_mac = mac_bytes(a.node_mac)
        self.node_ip = socket.inet_aton(a.node_ip)

    def frame(self, src_mac, src_ip, ib, *, bad_icrc=False, ip_csum_delta=0, udp_len_delta=0, cut=None):
        udp = struct.pack("!HHHH", 0xC123, ROCE_PORT, 8 + len(ib) + 4 + udp_len_delta, 0)
        total = 20 + len(udp) + len(ib) + 4
        iph = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0x4242, 0x4000, 64, 17, 0,
                          socket.inet_aton(src_ip), self.node_ip)
        iph = iph[:10] + struct.pack("!H", (ip_checksum(iph) + ip_csum_delta) & 0xFFFF) + iph[12:]
        pkt = iph + udp + ib
        crc = icrc(pkt)
        if bad_icrc:
            crc = bytes(x ^ 0xFF for x in crc)
        f = self.node_mac + src_mac + b"\x08\x00" + pkt + crc
        return f[:cut] if cut is not None else f


def counters(a):
    r = subprocess.run([a.ctl, "-s", a.sock, "--json", "counters"], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise RuntimeError(f"droce-ctl counters: {r.stderr.strip()}")
    out = {}
    for g in json.loads(r.stdout).get("groups", []):
        d = out.setdefault(g["group"], {})
        for inst in g.get("instances", []):
            for name, v in zip(g["names"], inst["values"]):
                d[name] = d.get(name, 0) + v
    return out


class Sniffer:
    """Every frame on IFACE (both directions), RoCEv2 over IPv4 decoded."""

    def __init__(self, iface, node_ip, me_ip):
        self.s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.s.bind((iface, 0))
        self.s.setblocking(False)
        self.node_ip, self.me_ip = node_ip, me_ip
        self.to_me = []  # every RoCE frame the node sent to the attacker, kept across drains

    def drain(self):
        """The RoCE frames queued since the last call: (src_ip, dst_ip, opcode, dqpn, psn, syndrome)."""
        out = []
        for _ in range(100000):
            try:
                f = self.s.recv(65536)
            except BlockingIOError:
                break
            if len(f) < 14 + 20 + 8 + 12 or f[12:14] != b"\x08\x00" or f[23] != 17:
                continue
            ihl = (f[14] & 0x0F) * 4
            l4 = 14 + ihl
            if len(f) < l4 + 8 + 12 or struct.unpack("!H", f[l4 + 2:l4 + 4])[0] != ROCE_PORT:
                continue
            b = l4 + 8
            op = f[b]
            dqpn = int.from_bytes(f[b + 5:b + 8], "big")
            psn = int.from_bytes(f[b + 9:b + 12], "big")
            syn = f[b + 12] if op in (RC_ACK, RC_ATOMIC_ACK, 0x0D, 0x0F, RC_READ_RESPONSE_ONLY) and len(f) > b + 12 else None
            x = (socket.inet_ntoa(f[26:30]), socket.inet_ntoa(f[30:34]), op, dqpn, psn, syn)
            out.append(x)
            if x[0] == self.node_ip and x[1] == self.me_ip:
                self.to_me.append(x)
        return out


def live_flow(a, sn, seconds=3.0):
    """The node's live RC QP with the real peer: (node's QPN, next request PSN it expects,
    next PSN it sends) from the peer's requests and the node's own, seen within `seconds`."""
    deadline = time.monotonic() + seconds
    qpn = exp = sq = None
    seen = 0
    while time.monotonic() < deadline:
        for src, dst, op, dqpn, psn, _ in sn.drain():
            if src == a.peer_ip and dst == a.node_ip and op < 0x0D:  # RC request to the node
                qpn, exp = dqpn, (psn + 1) & 0xFFFFFF
                seen += 1
            elif src == a.node_ip and dst == a.peer_ip and op < 0x0D:  # the node's own requests
                sq = (psn + 1) & 0xFFFFFF
        if seen >= 3 and sq is not None:
            return qpn, exp, sq
        time.sleep(0.01)
    return (qpn, exp, sq) if seen else (None, None, None)


def main():
    p = argparse.ArgumentParser()
    for opt in ("ctl", "sock", "iface", "node-ip", "node-mac", "peer-ip", "attacker-ip", "attacker-mac", "target"):
        p.add_argument("--" + opt, required=True)
    a = p.parse_args()
    tgt = {"qps": []}
    with open(a.target) as f:
        for line in f:
            w = line.split()
            if w and w[0] == "mr":
                kv = dict(x.split("=") for x in w[1:])
                tgt["rkey"], tgt["va"], tgt["len"] = int(kv["rkey"], 16), int(kv["va"], 16), int(kv["len"])
            elif w and w[0] == "qp":
                tgt["qps"].append(int(w[2].split("=")[1], 16))
    if len(tgt["qps"]) < 7 or "rkey" not in tgt:
        print(f"FAIL target file {a.target}: want an MR and 7 QPs")
        return 1
    V = tgt["qps"]
    TARGET_RQ_PSN, TARGET_SQ_PSN = 0x1000, 0x2000
    fb = Frames(a)
    me_mac, me_ip = mac_bytes(a.attacker_mac), a.attacker_ip
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    tx.bind((a.iface, 0))
    sn = Sniffer(a.iface, a.node_ip, a.attacker_ip)
    failed = []

    def send(frames):
        for f in frames:
            tx.send(f)

    def check(name, frames_fn, want, what, deadline_s=10.0, tries=1):
        """Send frames_fn() (retried up to `tries` times) until every counter of
        `want` {(group, counter): n} went up by n. Prints ok/FAIL with the deltas."""
        for attempt in range(tries):
            before = counters(a)
            missing = [f"{g}.{c}" for (g, c) in want if c not in before.get(g, {})]
            if missing:
                break
            try:
                frames = frames_fn()
                if frames is None:
                    continue
                send(frames)
            except OSError as e:
                print(f"FAIL {name}: cannot send: {e}")
                failed.append(name)
                return False
            end = time.monotonic() + deadline_s
            while True:
                sn.drain()
                now = counters(a)
                d = {(g, c): now[g][c] - before[g][c] for (g, c) in want}
                if all(d[k] >= n for k, n in want.items()):
                    print(f"ok   {name}: {len(frames)} frames ({what}) -> "
                          + ", ".join(f"{g}.{c} +{d[(g, c)]}" for (g, c) in want))
                    return True
                if time.monotonic() > end:
                    break
                time.sleep(0.05)
            print(f"     {name}: attempt {attempt + 1}: " + ", ".join(f"{g}.{c} +{d[(g, c)]} (want {want[(g, c)]})"
                                                                for (g, c) in want))
        else:
            missing = []
        why = f"no counter {', '.join(missing)}" if missing else "counters did not move"
        print(f"FAIL {name} ({what}): {why}")
        failed.append(name)
        return False

    # 1. Spoofed source at the live QP: valid RC packets, valid ICRC, PSNs around the
    # one it expects, from an address this QP never talked to: a SEND and a WRITE
    # into its receive side, an ACK and a READ response into its requester side.
    info = {}

    def spoofed():
        qpn, exp, sq = live_flow(a, sn)
        if qpn is None:
            print("     spoofed source: no live transfer seen")
            return None
        info.update(qpn=qpn, exp=exp, sq=sq)
        fr = []
        for d in range(-2, 4):
            fr.append(fb.frame(me_mac, me_ip, bth(RC_SEND_ONLY, qpn, exp + d, ackreq=True) + b"\x66" * 64))
        fr.append(fb.frame(me_mac, me_ip, bth(RC_WRITE_ONLY, qpn, exp, ackreq=True)
                           + reth(tgt["va"], tgt["rkey"], 64) + b"\x66" * 64))
        if sq is not None:
            fr.append(fb.frame(me_mac, me_ip, bth(RC_ACK, qpn, sq - 1) + aeth(0x1F, 1)))
            fr.append(fb.frame(me_mac, me_ip, bth(RC_READ_RESPONSE_ONLY, qpn, sq - 1) + aeth(0x1F, 1) + b"\x66" * 64))
        return fr

    check("spoofed source", spoofed, {("transport", "rx_bad_src_addr"): 9},
          "RC SEND/WRITE/ACK/READ response to the live QP from an address it never talked to", tries=5)
    if info:
        print(f"     live QP 0x{info['qpn']:06x} expected PSN 0x{info['exp']:06x}")
    qpn = info.get("qpn", V[6])
    exp = info.get("exp", 0)

    # 2. Malformed: each one a valid ICRC over a broken packet (one check each).
    # No IPv4 fragment: DPDK 22.11's af_packet joins its fanout group with
    # PACKET_FANOUT_FLAG_DEFRAG, so the kernel holds a lone fragment for
    # reassembly and never hands it to the port (test/wire checks the parser's
    # Fragmented error).
    body = lambda: bth(RC_SEND_ONLY, qpn, exp) + b"\x00" * 64
    for what, fn in (
            ("reserved opcode 0x1f", lambda: fb.frame(me_mac, me_ip, bth(0x1F, qpn, exp) + b"\x00" * 64)),
            ("BTH TVer 1", lambda: fb.frame(me_mac, me_ip, bth(RC_SEND_ONLY, qpn, exp, tver=1) + b"\x00" * 64)),
            ("bad IPv4 header checksum", lambda: fb.frame(me_mac, me_ip, body(), ip_csum_delta=1)),
            ("UDP length past the IP length", lambda: fb.frame(me_mac, me_ip, body(), udp_len_delta=40)),
            ("pad count beyond the payload", lambda: fb.frame(me_mac, me_ip, bth(RC_SEND_ONLY, qpn, exp, pad=3) + b"\x00" * 2)),
            ("WRITE with its RETH cut short", lambda: fb.frame(me_mac, me_ip, bth(RC_WRITE_ONLY, qpn, exp) + b"\x00" * 8))):
        check("malformed: " + what, lambda fn=fn: [fn() for _ in range(4)], {("transport", "rx_parse_err"): 4},
              "valid ICRC")

    # 3. Truncated: a valid SEND cut short on the wire (its IP/UDP lengths still the full ones).
    def truncated():
        full = fb.frame(me_mac, me_ip, bth(RC_SEND_ONLY, qpn, exp) + b"\x00" * 256)
        return [full[:n] for n in (14 + 20 + 8 + 12, 14 + 20 + 8 + 12 + 4, 100, len(full) - 5)]

    check("truncated", truncated, {("transport", "rx_parse_err"): 4}, "SEND cut after the BTH, in the payload, in the ICRC")

    # 3b. Too short to be RoCE at all: cut inside the IP or UDP header.
    def stubs():
        full = fb.frame(me_mac, me_ip, bth(RC_SEND_ONLY, qpn, exp) + b"\x00" * 64)
        return [full[:n] for n in (14 + 10, 14 + 20 + 4, 14 + 20 + 8 + 6)]

    check("truncated headers", stubs, {("port", "rx_drop_bad_header"): 3}, "cut in the IPv4 header, the UDP header, the BTH")

    # 4. Wrong ICRC on otherwise valid frames (to the live QP and to a target QP).
    def bad_icrc():
        return [fb.frame(me_mac, me_ip, bth(RC_SEND_ONLY, q, exp + i) + b"\x00" * 64, bad_icrc=True)
                for i, q in enumerate([qpn, V[6]] * 4)]

    check("wrong ICRC", bad_icrc, {("transport", "rx_icrc_err"): 8, ("port", "rx_drop_bad_icrc"): 8}, "SEND with its ICRC inverted")

    # 5. QP1 (the GSI QP of droced's CM) with a wrong Q_Key, and QPNs nobody owns.
    def qp1_unknown():
        mad = b"\x00" * 256
        deth = struct.pack("!IB3s", 0x12345678, 0, (1).to_bytes(3, "big"))
        fr = [fb.frame(me_mac, me_ip, bth(UD_SEND_ONLY, 1, 0) + deth + mad) for _ in range(4)]
        fr += [fb.frame(me_mac, me_ip, bth(RC_SEND_ONLY, n, 0) + b"\x00" * 64) for n in (0, 0xFFFFFF, 0xABCDE, 0x7FFF)]
        return fr

    # QPN 0xFFFFFF is the multicast QPN: an RC SEND to it at a unicast address
    # finds no group (rx_mcast_no_group), the three others find no QP.
    check("QP1 / unknown QPN", qp1_unknown, {("transport", "ud_qkey_drop"): 4, ("transport", "rx_no_qp"): 3,
                                             ("transport", "rx_mcast_no_group"): 1},
          "UD MAD to QP1 with a wrong Q_Key, RC SEND to QPN 0, 0xffffff, ...")

    # 6-8. Requests the target QPs must refuse (each refusal is fatal for its QP:
    # NAK, QP to ERR), two QPs per class, PSN = the one they expect.
    def req(q, op, va, rkey, ln, payload=b""):
        return fb.frame(me_mac, me_ip, bth(op, q, TARGET_RQ_PSN, ackreq=True) + reth(va, rkey, ln) + payload)

    k, va, ln = tgt["rkey"], tgt["va"], tgt["len"]
    check("wrong rkey", lambda: [req(V[0], RC_WRITE_ONLY, va, k ^ 0x5A, 64, b"\x66" * 64),  # right slot, wrong tag
                                 req(V[1], RC_READ_REQUEST, va, k + 0x100, 64)],               # another slot
          {("transport", "rx_bad_rkey"): 2}, "WRITE and READ with a guessed key")
    check("wrong length", lambda: [req(V[2], RC_WRITE_ONLY, va, k, 128, b"\x66" * 64),  # RETH says 128, carries 64
                                   req(V[3], RC_WRITE_ONLY, va, k, 1100, b"\x66" * 1100)],  # over the path MTU (1024)
          {("transport", "rx_bad_length"): 2}, "WRITE shorter than its RETH, WRITE beyond the path MTU")
    check("wild VA", lambda: [req(V[4], RC_READ_REQUEST, va + ln, k, 64),              # just past the MR
                              req(V[5], RC_WRITE_ONLY, 0xFFFFFFFFFFFF0000, k, 64, b"\x66" * 64)],
          {("transport", "rx_bad_va"): 2}, "READ past the MR's end, WRITE to a wild address")

    # 9. Responses for nothing outstanding, at a target QP that sent nothing.
    check("unsolicited response", lambda: [fb.frame(me_mac, me_ip, bth(op, V[6], TARGET_SQ_PSN + i) + aeth(0x1F, 1)
                                                    + (b"\x66" * 64 if op == RC_READ_RESPONSE_ONLY else
                                                       b"\x00" * 8 if op == RC_ATOMIC_ACK else b""))
                                           for i in range(4) for op in (RC_ACK, RC_READ_RESPONSE_ONLY, RC_ATOMIC_ACK)],
          {("transport", "ghost_response"): 12}, "ACK, READ response, atomic ACK")

    # What the node sent back: NAKs for the refused requests, never a READ response.
    want_naks = {(0x100, AETH_NAK_REMOTE_ACCESS): "wrong rkey WRITE", (0x101, AETH_NAK_REMOTE_ACCESS): "wrong rkey READ",
                 (0x102, AETH_NAK_INVALID_REQUEST): "short WRITE", (0x103, AETH_NAK_INVALID_REQUEST): "WRITE over the MTU",
                 (0x104, AETH_NAK_REMOTE_ACCESS): "READ past the MR", (0x105, AETH_NAK_REMOTE_ACCESS): "wild WRITE"}
    end = time.monotonic() + 5
    while True:
        sn.drain()
        naks = {(x[3], x[5]) for x in sn.to_me if x[2] == RC_ACK and x[5] is not None and x[5] & 0x60 == 0x60}
        if all(k in naks for k in want_naks) or time.monotonic() > end:
            break
        time.sleep(0.05)
    leaked = [x for x in sn.to_me if x[2] in (0x0D, 0x0E, 0x0F, RC_READ_RESPONSE_ONLY)]
    for (q, syn), what in want_naks.items():
        if (q, syn) in naks:
            print(f"ok   NAK 0x{syn:02x} back for the {what}")
        else:
            print(f"FAIL no NAK 0x{syn:02x} for the {what} (seen: {sorted(naks)})")
            failed.append("nak " + what)
    if leaked:
        print(f"FAIL the node sent READ responses to the attacker: {leaked[:4]}")
        failed.append("read leak")
    else:
        print("ok   no READ response to the attacker")
    print(f"{len(failed)} classes failed" + (": " + ", ".join(failed) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Talks to droce-netd --vlan VID through a raw packet socket on the kernel end
of the veth (this kernel has no 8021q module, so no VLAN interface): sends a
VLAN-tagged ARP request and ICMP echo request, expects tagged answers, and
expects no answer to an untagged ARP request.
  vlan_probe.py IFACE VID OUR_IP PEER_IP      exit 0 when all three hold"""
import socket
import struct
import sys
import time

SOL_PACKET, PACKET_AUXDATA, TP_STATUS_VLAN_VALID, PACKET_OUTGOING = 263, 8, 0x10, 4


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def l2(dst, src, vid, ethertype):
    tag = struct.pack("!HH", 0x8100, vid) if vid is not None else b""
    return dst + src + tag + struct.pack("!H", ethertype)


def receive(sock, want, timeout):
    """First frame for which want(ethertype, vid, payload) is true, else None.
    The kernel moves a received tag into the auxiliary data."""
    end = time.time() + timeout
    while time.time() < end:
        sock.settimeout(max(0.01, end - time.time()))
        try:
            data, anc, _, addr = sock.recvmsg(65535, socket.CMSG_SPACE(32))
        except socket.timeout:
            return None
        if addr[2] == PACKET_OUTGOING:
            continue
        vid = None
        for level, typ, cdata in anc:
            if level == SOL_PACKET and typ == PACKET_AUXDATA and len(cdata) >= 20:
                status, _, _, _, _, tci = struct.unpack("IIIHHH", cdata[:18])
                if status & TP_STATUS_VLAN_VALID:
                    vid = tci & 0xFFF
        et = struct.unpack("!H", data[12:14])[0]
        payload = data[14:]
        if et == 0x8100:  # tag left in the data
            vid = struct.unpack("!H", data[14:16])[0] & 0xFFF
            et = struct.unpack("!H", data[16:18])[0]
            payload = data[18:]
        if want(et, vid, payload):
            return data[6:12], payload
    return None


def main():
    iface, vid, our_ip, peer_ip = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    mac = bytes.fromhex(open(f"/sys/class/net/{iface}/address").read().strip().replace(":", ""))
    ours, peer = socket.inet_aton(our_ip), socket.inet_aton(peer_ip)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.bind((iface, 0))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    bcast = b"\xff" * 6
    arp_req = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + ours + b"\0" * 6 + peer
    ok = True

    def is_arp_reply(et, v, p):
        return et == 0x0806 and v == vid and p[6:8] == b"\x00\x02" and p[14:18] == peer

    s.send(l2(bcast, mac, vid, 0x0806) + arp_req)
    got = receive(s, is_arp_reply, 3)
    print("tagged ARP request:", "answered, tagged" if got else "NO ANSWER")
    if not got:
        return 1
    peer_mac = got[1][8:14]

    icmp = struct.pack("!BBHHH", 8, 0, 0, 0x4242, 1) + b"droce-vlan" * 4
    icmp = icmp[:2] + struct.pack("!H", csum(icmp)) + icmp[4:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(icmp), 1, 0x4000, 64, 1, 0, ours, peer)
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    s.send(l2(peer_mac, mac, vid, 0x0800) + ip + icmp)
    got = receive(s, lambda et, v, p: et == 0x0800 and v == vid and p[9] == 1 and p[20] == 0 and p[24:26] == b"\x42\x42", 3)
    print("tagged ICMP echo:", "answered, tagged" if got else "NO ANSWER")
    ok &= got is not None

    s.send(l2(bcast, mac, None, 0x0806) + arp_req)
    got = receive(s, lambda et, v, p: et == 0x0806 and p[6:8] == b"\x00\x02", 1)
    print("untagged ARP request:", "ANSWERED (wrong)" if got else "ignored")
    ok &= got is None
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

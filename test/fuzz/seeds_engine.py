#!/usr/bin/env python3
"""Seed inputs for fuzz_engine: valid operation sequences in its input format
(see the op_* functions of fuzz_engine.cc), so that the fuzzer starts from
packets the state machines accept and mutates from there.

    test/fuzz/seeds_engine.py OUTDIR
"""
import os
import struct
import sys

# QP selectors (qsel & 7) and region selectors (sel % 8), as in fuzz_engine.cc.
A, B, UC, UD, RTR, INIT = range(6)
ALL, RONLY, WONLY, ATOM, NONE, RECV, LOCAL, ODD = range(8)
RC_OPS = [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B,
          0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17, 0x81]
UC_OPS = [0x20 + i for i in range(12)] + [0x81]
UD_OPS = [0x64, 0x65, 0x81]
MTU = {A: 256, B: 512, UC: 256, RTR: 1024}


def psn(delta=0):
    """PSN mode 0: the PSN the QP expects (requests) / oldest unacknowledged (responses) + delta."""
    return (delta + 32) & 63


def payload(n, fill=0xA5, qp=A):
    if n == MTU.get(qp):
        return bytes([0x00, fill])  # mode 0: one MTU
    if n < 64:
        return bytes([0x40 | n, fill])
    return bytes([0xC0]) + struct.pack('<H', n) + bytes([fill])


def reth(region, off, length):
    # mode 2: 16-bit length; key selector = region; va = region + off.
    return bytes([0x02, region]) + struct.pack('<h', off) + struct.pack('<H', length)


def frame(qp, opcode, delta=0, flags=0x01, ext=b'', pay=b''):
    ops = UD_OPS if qp == UD else UC_OPS if qp == UC else RC_OPS
    return bytes([0x00, qp, ops.index(opcode), flags, psn(delta)]) + ext + pay


def aeth(syn=0x1F, msn=1):
    return bytes([syn, msn])


def atomic(region, off, add=5, cmp=0):
    return bytes([0x20, region]) + struct.pack('<h', off) + bytes([add, cmp])


def post_send(qp, wr_opcode, length16, region=LOCAL, flags=0):
    # lensel 0x80 | n: n*16 bytes; lsel = region (offset 0).
    return bytes([11, qp, wr_opcode, 0x80 | length16, region, flags, 0, 0])


def time(sel):
    return bytes([9, sel])


def mr(sel):
    return bytes([13, sel])


SEEDS = {
    'write_only': frame(A, 0x0A, ext=reth(ALL, 16, 32), pay=payload(32)),
    'write_multi': frame(A, 0x06, ext=reth(ALL, 0, 600), pay=payload(256)) +
                   frame(A, 0x07, pay=payload(256)) + frame(A, 0x08, pay=payload(88)),
    'write_imm': frame(A, 0x0B, ext=reth(WONLY, 8, 40) + bytes([0x42]), pay=payload(40)),
    'send_multi': frame(A, 0x04, pay=payload(60)) + frame(A, 0x00, pay=payload(256)) +
                  frame(A, 0x01, pay=payload(256)) + frame(A, 0x02, pay=payload(50)),
    'send_srq': frame(B, 0x00, pay=payload(512, qp=B)) + frame(B, 0x03, ext=bytes([7]), pay=payload(200)),
    'read': frame(A, 0x0C, ext=reth(RONLY, 0, 600)),
    'atomics': frame(A, 0x14, ext=atomic(ATOM, 8)) + frame(A, 0x13, ext=atomic(ATOM, 8, 9, 5)) +
               frame(A, 0x13, delta=-1, ext=atomic(ATOM, 8, 9, 5)),
    'duplicates': frame(A, 0x0A, ext=reth(ALL, 16, 32), pay=payload(32)) +
                  frame(A, 0x0A, delta=-1, ext=reth(ALL, 16, 32), pay=payload(32)) +
                  frame(A, 0x0C, ext=reth(ALL, 0, 300)) + frame(A, 0x0C, delta=-2, ext=reth(ALL, 0, 300)),
    'out_of_seq': frame(A, 0x04, delta=3, pay=payload(8)) + frame(A, 0x04, pay=payload(8)),
    'uc': frame(UC, 0x2A, ext=reth(ALL, 0, 20), pay=payload(20)) + frame(UC, 0x20, pay=payload(256, qp=UC)) +
          frame(UC, 0x22, pay=payload(10)),
    'ud': frame(UD, 0x64, ext=bytes([0]), pay=payload(100)) + frame(UD, 0x65, ext=bytes([1, 9]), pay=payload(30)),
    'rtr': frame(RTR, 0x04, pay=payload(16)) + frame(INIT, 0x04, pay=payload(16)),
    # The DUT as requester: its WRITE acknowledged, its READ answered, its atomic answered.
    'req_write_ack': post_send(A, 0, 19) + frame(A, 0x11, delta=1, ext=aeth()),
    'req_read': post_send(A, 4, 19) + frame(A, 0x0D, ext=aeth(), pay=payload(256)) +
                frame(A, 0x0F, ext=aeth(), pay=payload(48)),
    'req_atomic': post_send(A, 6, 0) + frame(A, 0x12, ext=aeth() + bytes([77])),
    'req_nak_retry': post_send(A, 2, 4) + frame(A, 0x11, ext=aeth(0x60, 0)) + time(0x80) + time(0x80),
    'req_timeout': post_send(A, 0, 2) + time(0x80) + time(0x80) + time(0x80) + time(0xFF),
    # A local client deregisters the target MR between the packets of a WRITE.
    'dereg_mid_write': frame(A, 0x06, ext=reth(ALL, 0, 600), pay=payload(256)) + mr(ALL) +
                       frame(A, 0x07, pay=payload(256)) + frame(A, 0x08, pay=payload(88)),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, ops in SEEDS.items():
        for setup in (0, 3):  # ordinary PSNs, PSNs just below the 24-bit wrap
            with open(os.path.join(out, f'{name}_{setup}'), 'wb') as f:
                f.write(bytes([setup]) + ops)


if __name__ == '__main__':
    main()

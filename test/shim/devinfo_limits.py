#!/usr/bin/env python3
"""`ibv_devinfo -v` of a droce device against what droced enforces.

  devinfo_limits.py DEVINFO_OUTPUT

Run through the drop-in libibverbs (LD_LIBRARY_PATH, DROCE_SOCKET) with
Debian's pyverbs, after `ibv_devinfo -v > DEVINFO_OUTPUT` the same way. Every
figure checked is read from ibv_devinfo's output, then used: at the limit the
object is created, one past it the call fails with EINVAL (CQEs, completion
vectors, QP work requests and SGEs, SRQ work requests and SGEs, responder and
initiator RDMA READ/atomic depths), a port, GID or P_Key index past its
table fails, atomic_cap ATOMIC_HCA accepts remote atomic access, each
device_cap_flags flag printed is one this script can check, and max_mw
windows allocate (one more: ENOMEM; the count is the client's quota). Prints one line
per check; exits 1 if one fails.
"""
import errno
import re
import sys

from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR, MW
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
import pyverbs.enums as e

failures = 0


def check(what, cond, detail=''):
    global failures
    print(('ok   ' if cond else 'FAIL ') + what + (f' ({detail})' if detail and not cond else ''))
    if not cond:
        failures += 1


def refused(what, fn, want=errno.EINVAL, stage=None):
    try:
        obj = fn()
    except PyverbsRDMAError as ex:
        good = ex.error_code == want and (stage is None or f'to {stage}' in str(ex))
        check(what, good, f'{ex}, expected errno {want}' + (f' at {stage}' if stage else ''))
        return
    except PyverbsError as ex:
        check(what, False, f'{ex}')
        return
    check(what, False, 'accepted')
    obj.close()


def accepted(what, fn):
    try:
        obj = fn()
    except PyverbsError as ex:
        check(what, False, f'{ex}')
        return None
    check(what, True)
    if hasattr(obj, 'close'):
        obj.close()


def makes(fn):
    try:
        fn().close()
        return True
    except PyverbsError:
        return False


def parse(path):
    dev, ports, flags = {}, {}, []
    cur, in_flags = dev, False
    for line in open(path):
        m = re.match(r'^\s*port:\s*(\d+)', line)
        if m:
            cur = ports.setdefault(int(m.group(1)), {})
            in_flags = False
            continue
        m = re.match(r'^\s*([A-Za-z_0-9\[\] ]+):\s*(.*?)\s*$', line)
        if m:
            key, val = m.group(1).strip(), m.group(2)
            in_flags = key == 'device_cap_flags'
            num = re.match(r'^(0x[0-9a-fA-F]+|\d+)(?:\s|$)', val)
            cur[key] = int(num.group(1), 0) if num else val
            continue
        if in_flags and re.match(r'^\s+[A-Z0-9_]+\s*$', line):
            flags.append(line.strip())
    return dev, ports, flags


def main():
    dev, ports, flags = parse(sys.argv[1])
    check('ibv_devinfo -v names a droce device', str(dev.get('hca_id', '')).startswith('droce'))
    ctx = Context(name=dev['hca_id'])
    a = ctx.query_device()
    pd = PD(ctx)
    cq = CQ(ctx, 16, None, None, 0)
    # The figures ibv_devinfo printed are what ibv_query_device returns.
    for k in ('max_qp', 'max_qp_wr', 'max_sge', 'max_cq', 'max_cqe', 'max_mr', 'max_pd', 'max_qp_rd_atom',
              'max_qp_init_rd_atom', 'max_srq', 'max_srq_wr', 'max_srq_sge', 'max_ah', 'max_mw',
              'phys_port_cnt', 'device_cap_flags'):
        check(f'{k} {dev.get(k)} = ibv_query_device', dev.get(k) == getattr(a, k), f'{getattr(a, k)}')

    max_cqe = dev['max_cqe']
    accepted(f'CQ of max_cqe {max_cqe} CQEs', lambda: CQ(ctx, max_cqe, None, None, 0))
    refused(f'CQ of max_cqe + 1 CQEs', lambda: CQ(ctx, max_cqe + 1, None, None, 0))
    nvec = dev['num_comp_vectors']
    accepted(f'CQ on comp_vector num_comp_vectors - 1 = {nvec - 1}',
             lambda: CQ(ctx, 16, None, None, nvec - 1))
    refused(f'CQ on comp_vector num_comp_vectors {nvec}', lambda: CQ(ctx, 16, None, None, nvec))

    def qp(swr=1, rwr=1, ssge=1, rsge=1):
        cap = QPCap(max_send_wr=swr, max_recv_wr=rwr, max_send_sge=ssge, max_recv_sge=rsge)
        return QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    wr, sge = dev['max_qp_wr'], dev['max_sge']
    accepted(f'QP of max_qp_wr {wr} send and receive WRs', lambda: qp(swr=wr, rwr=wr))
    refused('QP of max_qp_wr + 1 send WRs', lambda: qp(swr=wr + 1))
    refused('QP of max_qp_wr + 1 receive WRs', lambda: qp(rwr=wr + 1))
    accepted(f'QP of max_sge {sge} send and receive SGEs', lambda: qp(ssge=sge, rsge=sge))
    refused('QP of max_sge + 1 send SGEs', lambda: qp(ssge=sge + 1))
    refused('QP of max_sge + 1 receive SGEs', lambda: qp(rsge=sge + 1))

    def srq(wr=1, sge=1):
        return SRQ(pd, SrqInitAttr(SrqAttr(max_wr=wr, max_sge=sge)))
    swr, ssge = dev['max_srq_wr'], dev['max_srq_sge']
    accepted(f'SRQ of max_srq_wr {swr} WRs, max_srq_sge {ssge} SGEs', lambda: srq(swr, ssge))
    refused('SRQ of max_srq_wr + 1 WRs', lambda: srq(wr=swr + 1))
    refused('SRQ of max_srq_sge + 1 SGEs', lambda: srq(sge=ssge + 1))

    # RDMA READ / atomic depths: INIT -> RTR (responder) and RTR -> RTS (initiator).
    port = ports[1]
    gid_index = 0
    for k, v in port.items():
        m = re.match(r'GID\[\s*(\d+)\]', k)
        if m and '::ffff:' in str(v):
            gid_index = int(m.group(1))
            break

    def modify_depth(resp, init):
        # A loopback RC QP (to itself, over the port's IPv4 GID) to RTS.
        q = qp()
        try:
            gr = GlobalRoute(dgid=ctx.query_gid(1, gid_index), sgid_index=gid_index)
            attr = QPAttr(port_num=1)
            attr.qp_access_flags = e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC | e.IBV_ACCESS_REMOTE_WRITE
            attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=gr)
            attr.dest_qp_num = q.qp_num
            attr.path_mtu = e.IBV_MTU_1024
            attr.max_dest_rd_atomic = resp
            attr.max_rd_atomic = init
            q.to_rts(attr)
            return q
        except Exception:
            q.close()
            raise
    rd, ird = dev['max_qp_rd_atom'], dev['max_qp_init_rd_atom']
    accepted(f'RC QP with max_dest_rd_atomic max_qp_rd_atom {rd}, max_rd_atomic max_qp_init_rd_atom {ird}',
             lambda: modify_depth(rd, ird))
    # One past them is clamped by the engine, not refused (perftest copies its peer's depth, rxe's 128).

    # Ports, GIDs, P_Keys.
    n = dev['phys_port_cnt']
    check(f'phys_port_cnt {n}: one port block each', sorted(ports) == list(range(1, n + 1)))
    try:
        ctx.query_port(n + 1)
        check('port phys_port_cnt + 1 refused', False, 'accepted')
    except PyverbsError:
        check('port phys_port_cnt + 1 refused', True)
    check('active_mtu <= max_mtu', port['active_mtu'] <= port['max_mtu'])
    glen = port['gid_tbl_len']
    shown = sum(1 for k in port if k.startswith('GID['))
    check(f'gid_tbl_len {glen} >= the {shown} GIDs shown', glen >= shown)
    accepted(f'GID index gid_tbl_len - 1 = {glen - 1} (empty or not)', lambda: ctx.query_gid(1, glen - 1))
    try:
        ctx.query_gid(1, glen)
        check('GID index gid_tbl_len refused', False, 'accepted')
    except PyverbsError:
        check('GID index gid_tbl_len refused', True)
    plen = port['pkey_tbl_len']
    accepted(f'P_Key index pkey_tbl_len - 1 = {plen - 1}', lambda: ctx.query_pkey(1, plen - 1))
    try:
        ctx.query_pkey(1, plen)
        check('P_Key index pkey_tbl_len refused', False, 'accepted')
    except PyverbsError:
        check('P_Key index pkey_tbl_len refused', True)

    # Atomics.
    if str(dev['atomic_cap']).startswith('ATOMIC_HCA'):
        accepted('atomic_cap ATOMIC_HCA: MR with remote atomic access',
                 lambda: MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC))
    else:
        check(f'atomic_cap {dev["atomic_cap"]} is one this check knows', False)

    # device_cap_flags: only flags this script checks (or that other tests show).
    # Memory windows: a window of each type allocates here; binds, use and
    # invalidation run in test_mr.MWTest / test_qpex (pyverbs suite) and test/transport/test_mw.cc.
    known = {
        'MEM_WINDOW': lambda: makes(lambda: MW(pd, e.IBV_MW_TYPE_1)),
        'MEM_WINDOW_TYPE_2B': lambda: makes(lambda: MW(pd, e.IBV_MW_TYPE_2)),
        'SYS_IMAGE_GUID': lambda: int(str(dev['sys_image_guid']).replace(':', ''), 16) != 0,
        # RNR NAKs generated by the responder: test/engine (RNR retry) and interop.
        'RC_RNR_NAK_GEN': lambda: True,
    }
    for f in flags:
        check(f'device_cap_flags {f} is one that is checked', f in known and known[f]())

    # max_mw is what this client can hold (droced's per-client quota): that many
    # windows allocate, one more is refused (ENOMEM, as a device out of them).
    nmw = dev['max_mw']
    mws = []
    try:
        for _ in range(nmw):
            mws.append(MW(pd, e.IBV_MW_TYPE_2))
        check(f'max_mw {nmw} windows allocate', True)
        refused('max_mw + 1 windows', lambda: MW(pd, e.IBV_MW_TYPE_2), errno.ENOMEM)
    except PyverbsError as ex:
        check(f'max_mw {nmw} windows allocate', False, f'{ex} after {len(mws)}')
    for w in mws:
        w.close()

    # Multicast groups (pyverbs has no attach: test/engine/test_dataplane.cc attaches UD QPs
    # to groups, cm_pair.sh through the RDMA CM): the per-group and total counts agree.
    if dev['max_mcast_grp'] > 0:
        check('max_mcast_qp_attach > 0 and max_total_mcast_qp_attach >= it',
              0 < dev['max_mcast_qp_attach'] <= dev['max_total_mcast_qp_attach'])
    cq.close()
    pd.close()
    ctx.close()
    print(f'{failures} failed' if failures else 'all checks passed')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())

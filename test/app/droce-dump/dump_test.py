#!/usr/bin/env python3
"""droce-dump end to end, on the rxe captures in test/data.

usage: dump_test.py DROCE_DUMP DATA_DIR TEST

  captures     every capture: exit 0; the summary's counts equal the capture's
               record count (read here, without libpcap) and the opcode
               histogram of Wireshark's field dump (*.fields.tsv)
  icrc-bad     a copy with one payload byte flipped: exit 1, that frame printed
               with the same fields and `icrc BAD`; a flipped IP header byte:
               the precise parse error
  json         --json: every line parses, every field matches Wireshark's dump,
               and the first RETH packet's text line shows the same va/rkey/len
  pcapng       the same captures rewritten as pcapng (microsecond and
               nanosecond timestamps), as Linux cooked (SLL, SLL2) and as raw
               IP pcap decode exactly as the pcap
  file-errors  missing, garbage, truncated, unsupported link type, bad usage:
               exit 2 and a clear message; non-RoCE frames are only counted
  mutations    random corruptions of a capture and of its file structure: the
               tool exits 0, 1 or 2 and never crashes (the sanitizer build runs
               this too)
"""
import glob
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

DUMP, DATA, TEST = sys.argv[1], sys.argv[2], sys.argv[3]
TMP = tempfile.mkdtemp(prefix="droce-dump-test-")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args):
    p = subprocess.run([DUMP, *args], capture_output=True, text=True, errors="replace", timeout=30)
    if "Sanitizer" in p.stderr or "runtime error" in p.stderr:
        failures.append(f"sanitizer report for {args}")
        print(p.stderr)
    return p


# ---- pcap files, read and written here without libpcap --------------------
def read_pcap(path):
    """(linktype, [(ts_sec, ts_usec, orig_len, bytes)])"""
    b = open(path, "rb").read()
    magic = struct.unpack("<I", b[:4])[0]
    assert magic == 0xA1B2C3D4, f"{path}: expected a little-endian microsecond pcap"
    linktype = struct.unpack("<I", b[20:24])[0]
    recs, off = [], 24
    while off < len(b):
        sec, usec, incl, orig = struct.unpack("<IIII", b[off:off + 16])
        recs.append((sec, usec, orig, b[off + 16:off + 16 + incl]))
        off += 16 + incl
    return linktype, recs


def write_pcap(path, recs, linktype=1):
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, linktype))
        for sec, usec, orig, data in recs:
            f.write(struct.pack("<IIII", sec, usec, len(data), orig) + data)


def write_pcapng(path, recs, nanos=False, linktype=1):
    def block(btype, body):
        body += b"\0" * (-len(body) % 4)
        n = 12 + len(body)
        return struct.pack("<II", btype, n) + body + struct.pack("<I", n)

    def opt(code, val):
        return struct.pack("<HH", code, len(val)) + val + b"\0" * (-len(val) % 4)

    with open(path, "wb") as f:
        f.write(block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1) + opt(3, b"droce-dump test") + opt(0, b"")))
        idb_opts = opt(2, b"eth0") + (opt(9, bytes([9])) if nanos else b"") + opt(0, b"")
        f.write(block(1, struct.pack("<HHI", linktype, 0, 262144) + idb_opts))
        for sec, usec, orig, data in recs:
            t = sec * 1_000_000_000 + usec * 1000 if nanos else sec * 1_000_000 + usec
            body = struct.pack("<IIIII", 0, t >> 32, t & 0xFFFFFFFF, len(data), orig) + data
            body += b"\0" * (-len(data) % 4)
            f.write(block(6, body))


def captures():
    return sorted(glob.glob(os.path.join(DATA, "*.pcap")))


def tsv_rows(pcap):
    """Wireshark's fields of each RoCEv2 packet: {frame number: {field: value}}."""
    rows = {}
    with open(pcap[: -len(".pcap")] + ".fields.tsv") as f:
        header = f.readline().lstrip("#").rstrip("\n").split("\t")
        for line in f:
            vals = line.rstrip("\n").split("\t")
            r = {h: (v.split(",")[0] if v else "") for h, v in zip(header, vals)}
            rows[int(r["frame.number"])] = r
    return rows


def summary_json(stdout):
    objs = [json.loads(l) for l in stdout.splitlines()]
    assert objs and objs[-1]["type"] == "summary"
    return objs[:-1], objs[-1]


# ---- the tests ---------------------------------------------------------------
def t_captures():
    caps = captures()
    check(len(caps) >= 5, f"expected the rxe captures in {DATA}, found {caps}")
    total = 0
    for cap in caps:
        _, recs = read_pcap(cap)
        rows = tsv_rows(cap)
        hist = {}
        for r in rows.values():
            hist[int(r["infiniband.bth.opcode"])] = hist.get(int(r["infiniband.bth.opcode"]), 0) + 1
        p = run(cap)
        name = os.path.basename(cap)
        check(p.returncode == 0, f"{name}: exit {p.returncode}: {p.stderr}")
        lines = p.stdout.splitlines()
        pkt_lines = [l for l in lines if re.match(r"^\s*\d+\s+\d+\.\d{6} ", l)]
        check(len(pkt_lines) == len(recs), f"{name}: {len(pkt_lines)} packet lines for {len(recs)} records")
        check(all(l.endswith("icrc ok") for l in pkt_lines), f"{name}: a packet line without icrc ok")
        want = f"summary: {len(recs)} frames, {len(rows)} RoCEv2 packets, 0 icrc bad, 0 malformed, {len(recs) - len(rows)} non-RoCE"
        check(want in lines, f"{name}: no line '{want}'")
        # The per-opcode lines of the text summary against Wireshark's histogram (names via --json).
        pj = run("--json", cap)
        pkts, summ = summary_json(pj.stdout)
        names = {o["opcode"]: o["op"] for o in pkts}
        for opc, n in hist.items():
            check(re.search(rf"^  {names.get(opc, '?')}\s+{n}$", p.stdout, re.M) is not None,
                  f"{name}: summary line for opcode {opc} ({names.get(opc)}) x{n}")
        check(summ["by_opcode"] == {names[o]: n for o, n in sorted(hist.items())}, f"{name}: JSON by_opcode")
        check((summ["frames"], summ["roce"], summ["icrc_ok"]) == (len(recs), len(rows), len(rows)), f"{name}: JSON counts")
        total += len(recs)
    # Several files at once: one summary over all of them.
    p = run("-q", *caps)
    check(p.returncode == 0 and f"summary: {total} frames, {total} RoCEv2 packets" in p.stdout,
          f"all captures: {p.stdout}")
    print(f"captures: {len(caps)} files, {total} frames, summaries match")


def t_icrc_bad():
    cap = os.path.join(DATA, "rxe-imm-inv.pcap")
    _, recs = read_pcap(cap)
    orig = run(cap).stdout.splitlines()
    # Frame 3 is an RC SEND First with 1024 bytes of payload: flip its 100th payload byte.
    sec, usec, olen, data = recs[2]
    data = bytearray(data)
    data[14 + 20 + 8 + 12 + 100] ^= 0x40
    bad = recs[:2] + [(sec, usec, olen, bytes(data))] + recs[3:]
    path = os.path.join(TMP, "icrc-bad.pcap")
    write_pcap(path, bad)
    p = run(path)
    check(p.returncode == 1, f"icrc-bad: exit {p.returncode}, want 1")
    lines = p.stdout.splitlines()
    l3 = [l for l in lines if re.match(r"^\s+3 ", l)]
    check(len(l3) == 1 and "icrc BAD (wire 0x" in l3[0], f"icrc-bad: frame 3 line: {l3}")
    o3 = [l for l in orig if re.match(r"^\s+3 ", l)][0]
    check(l3 and l3[0].split(" icrc ")[0] == o3.split(" icrc ")[0], f"icrc-bad: frame 3 fields differ:\n{l3}\n{o3}")
    check(f"summary: {len(recs)} frames, {len(recs)} RoCEv2 packets, 1 icrc bad, 0 malformed, 0 non-RoCE" in lines,
          "icrc-bad: summary")
    check(sum("icrc BAD" in l for l in lines) == 1, "icrc-bad: exactly one icrc BAD line")
    pj = run("--json", path)
    pkts, summ = summary_json(pj.stdout)
    check(pj.returncode == 1 and pkts[2]["icrc"] == "bad" and summ["icrc_bad"] == 1, "icrc-bad: JSON")

    # One flipped byte of the IPv4 header (TTL): the header checksum fails, a precise error.
    data = bytearray(recs[2][3])
    data[14 + 8] ^= 0x01
    path2 = os.path.join(TMP, "ip-bad.pcap")
    write_pcap(path2, recs[:2] + [(sec, usec, olen, bytes(data))] + recs[3:])
    p = run(path2)
    check(p.returncode == 1, f"ip-bad: exit {p.returncode}")
    check(re.search(r"^\s+3 .*10\.77\.0\.21\s+-> 10\.77\.0\.22\s+MALFORMED bad_ip_checksum: IPv4 header checksum",
                    p.stdout, re.M) is not None, f"ip-bad: {p.stdout[:2000]}")
    check("  malformed bad_ip_checksum" in p.stdout, "ip-bad: summary error line")
    print("icrc-bad: one flipped payload byte -> icrc BAD with the same fields, exit 1; IP header -> bad_ip_checksum")


def hexint(s):
    return int(s, 16) if s else None


def t_json():
    checked = 0
    for cap in captures():
        name = os.path.basename(cap)
        rows = tsv_rows(cap)
        p = run("--json", cap)
        check(p.returncode == 0, f"{name}: --json exit {p.returncode}")
        pkts, summ = summary_json(p.stdout)
        check(len(pkts) == len(rows), f"{name}: {len(pkts)} JSON packets, {len(rows)} rows")
        for o in pkts:
            r = rows.get(o["frame"])
            if r is None:
                check(False, f"{name}: frame {o['frame']} not in the tsv")
                continue
            f = o["frame"]
            eq = lambda a, b, what: check(a == b, f"{name} frame {f}: {what}: {a} != {b}")
            eq(o["type"], "packet", "type")
            eq(o["icrc"], "ok", "icrc")
            eq(o["opcode"], int(r["infiniband.bth.opcode"]), "opcode")
            eq(o["dqpn"], hexint(r["infiniband.bth.destqp"]), "dqpn")
            eq(o["psn"], int(r["infiniband.bth.psn"]), "psn")
            eq(int(o["ackreq"]), int(r["infiniband.bth.a"]), "ackreq")
            eq(int(o["se"]), int(r["infiniband.bth.se"]), "se")
            eq(o["pad"], int(r["infiniband.bth.padcnt"]), "pad")
            eq(o["pkey"], int(r["infiniband.bth.p_key"]), "pkey")
            eq(o["sport"], int(r["udp.srcport"]), "sport")
            if r["infiniband.reth.va"] and "atomic" in o:  # Wireshark names the AtomicETH va/rkey reth.*
                eq(hexint(o["atomic"]["va"]), hexint(r["infiniband.reth.va"]), "atomic va")
                eq(o["atomic"]["rkey"], hexint(r["infiniband.reth.r_key"]), "atomic rkey")
            elif r["infiniband.reth.va"]:
                eq(hexint(o["reth"]["va"]), hexint(r["infiniband.reth.va"]), "reth va")
                eq(o["reth"]["rkey"], hexint(r["infiniband.reth.r_key"]), "reth rkey")
                eq(o["reth"]["len"], int(r["infiniband.reth.dmalen"]), "reth len")
            else:
                eq("reth" in o, False, "reth present")
            if r["infiniband.aeth.syndrome"]:
                eq(o["aeth"]["syndrome"], int(r["infiniband.aeth.syndrome"]), "aeth syndrome")
                eq(o["aeth"]["msn"], int(r["infiniband.aeth.msn"]), "aeth msn")
            else:
                eq("aeth" in o, False, "aeth present")
            if r["infiniband.atomiceth.swapdt"]:
                eq(int(o["atomic"]["swap_add"], 16), int(r["infiniband.atomiceth.swapdt"]), "atomic swap")
                eq(int(o["atomic"]["compare"], 16), int(r["infiniband.atomiceth.cmpdt"]), "atomic compare")
            if r["infiniband.atomicacketh.origremdt"]:
                eq(int(o["atomic_ack"]["orig"], 16), int(r["infiniband.atomicacketh.origremdt"]), "atomic ack orig")
            if r["infiniband.deth.q_key"]:
                eq(o["deth"]["qkey"], hexint(r["infiniband.deth.q_key"]), "deth qkey")
                eq(o["deth"]["src_qp"], hexint(r["infiniband.deth.srcqp"]), "deth srcqp")
            if r["infiniband.immdt"]:
                eq(hexint(o["imm"]), int(r["infiniband.immdt"], 16), "imm")
            else:
                eq("imm" in o, False, "imm present")
            if r["infiniband.ieth"]:
                eq(o["ieth"]["rkey"], int(r["infiniband.ieth"], 16), "ieth rkey")
            checked += 1
        # The first RETH packet: the text line shows the same va/rkey/len as the JSON and the tsv.
        first = next((o for o in pkts if "reth" in o), None)
        if first:
            r = rows[first["frame"]]
            text = run(cap).stdout
            line = [l for l in text.splitlines() if re.match(rf"^\s*{first['frame']} ", l)]
            want = (f"reth va 0x{hexint(r['infiniband.reth.va']):016x} rkey 0x{hexint(r['infiniband.reth.r_key']):08x} "
                    f"len {int(r['infiniband.reth.dmalen'])}")
            check(len(line) == 1 and want in line[0] and first["op"] in line[0],
                  f"{name}: first RETH packet (frame {first['frame']}): {line} lacks '{want}'")
    print(f"json: {checked} packets' fields equal Wireshark's")


def t_pcapng():
    for cap in captures():
        name = os.path.basename(cap)
        _, recs = read_pcap(cap)
        ref = run(cap)
        ref_json = run("--json", cap)
        variants = {"pcapng-us": write_pcapng, "pcapng-ns": lambda p, r: write_pcapng(p, r, nanos=True)}
        # Linux cooked (SLL): a 16-byte header with the EtherType in place of the Ethernet header.
        sll = [(s, u, o - 14 + 16, struct.pack(">HHH8sH", 0, 1, 6, d[6:12] + b"\0\0", 0x0800) + d[14:])
               for s, u, o, d in recs]
        variants["sll"] = lambda p, r: write_pcap(p, sll, linktype=113)
        # SLL2: 20 bytes, the EtherType first; raw IP: no link header at all.
        sll2 = [(s, u, o - 14 + 20, struct.pack(">HHIHBB8s", 0x0800, 0, 2, 1, 0, 6, d[6:12] + b"\0\0") + d[14:])
                for s, u, o, d in recs]
        variants["sll2"] = lambda p, r: write_pcap(p, sll2, linktype=276)
        raw = [(s, u, o - 14, d[14:]) for s, u, o, d in recs]
        variants["raw"] = lambda p, r: write_pcap(p, raw, linktype=101)
        for v, writer in variants.items():
            path = os.path.join(TMP, f"{name}.{v}")
            writer(path, recs)
            p = run(path)
            check(p.returncode == ref.returncode == 0, f"{name} {v}: exit {p.returncode}: {p.stderr}")
            check(p.stdout == ref.stdout, f"{name} {v}: text output differs from the pcap's")
            pj = run("--json", path)
            strip = lambda out: [{k: x for k, x in json.loads(l).items() if k not in ("file", "files")}
                                 for l in out.splitlines()]
            check(strip(pj.stdout) == strip(ref_json.stdout), f"{name} {v}: JSON differs from the pcap's")
    print("pcapng: pcapng (us, ns), Linux cooked (SLL, SLL2) and raw IP copies decode exactly as the pcaps")


def t_file_errors():
    cap = os.path.join(DATA, "rxe-imm-inv.pcap")
    _, recs = read_pcap(cap)

    p = run(os.path.join(TMP, "no-such-file.pcap"))
    check(p.returncode == 2 and "No such file" in p.stderr and p.stdout == "", f"missing file: {p.returncode} {p.stderr}")

    garbage = os.path.join(TMP, "garbage.pcap")
    open(garbage, "wb").write(bytes(random.Random(1).randrange(256) for _ in range(300)))
    p = run(garbage)
    check(p.returncode == 2 and "droce-dump: " + garbage in p.stderr, f"garbage: {p.returncode} {p.stderr}")

    empty = os.path.join(TMP, "empty.pcap")
    open(empty, "wb").close()
    p = run(empty)
    check(p.returncode == 2 and p.stderr.startswith("droce-dump: "), f"empty: {p.returncode} {p.stderr}")

    # Cut in the middle of the 6th record: 5 frames decoded, then the error, exit 2.
    b = open(cap, "rb").read()
    off = 24
    for _ in range(5):
        off += 16 + struct.unpack("<I", b[off + 8:off + 12])[0]
    trunc = os.path.join(TMP, "trunc.pcap")
    open(trunc, "wb").write(b[:off + 16 + 30])
    p = run(trunc)
    check(p.returncode == 2 and "truncated" in p.stderr, f"truncated: {p.returncode} {p.stderr}")
    check("summary: 5 frames, 5 RoCEv2 packets" in p.stdout, f"truncated: {p.stdout}")

    wifi = os.path.join(TMP, "wifi.pcap")
    write_pcap(wifi, recs[:2], linktype=105)
    p = run(wifi)
    check(p.returncode == 2 and "link type 105" in p.stderr and "not supported" in p.stderr, f"802.11: {p.stderr}")

    for args in ([], ["--no-such-option", cap]):
        p = run(*args)
        check(p.returncode == 2 and p.stderr.strip() != "", f"usage {args}: {p.returncode} {p.stderr}")
    p = run("--help")
    check(p.returncode == 0 and "--json" in p.stdout, "--help")

    # A good file and a missing one: the good one is decoded, the exit status says 2.
    p = run(cap, os.path.join(TMP, "missing.pcap"))
    check(p.returncode == 2 and "summary: 40 frames" in p.stdout, f"good + missing: {p.returncode}")

    # Non-RoCE frames among RoCE ones are counted, not printed: ARP, UDP/53, TCP, a snap-cut frame.
    d = recs[0][3]
    arp = d[:12] + b"\x08\x06" + d[14:60]
    dns = bytearray(d)
    dns[14 + 20 + 2:14 + 20 + 4] = struct.pack(">H", 53)
    tcp = bytearray(d)
    tcp[14 + 9] = 6
    mixed = [recs[0], (1, 0, len(arp), arp), (1, 1, len(dns), bytes(dns)), (1, 2, len(tcp), bytes(tcp)), recs[1]]
    path = os.path.join(TMP, "mixed.pcap")
    write_pcap(path, mixed)
    p = run(path)
    check(p.returncode == 0, f"mixed: exit {p.returncode}")
    check("summary: 5 frames, 2 RoCEv2 packets, 0 icrc bad, 0 malformed, 3 non-RoCE" in p.stdout, f"mixed: {p.stdout}")
    check(len([l for l in p.stdout.splitlines() if " icrc ok" in l]) == 2, "mixed: two packet lines")
    # A RoCE frame cut by the snap length: malformed, with the lengths.
    sec, usec, olen, data = recs[2]
    path = os.path.join(TMP, "snap.pcap")
    write_pcap(path, [recs[0], (sec, usec, olen, data[:96])])
    p = run(path)
    check(p.returncode == 1 and f"MALFORMED truncated: the frame ends before its headers say it does (96 bytes captured of {olen} on the wire: the capture's snap length cut it)" in p.stdout,
          f"snap: {p.stdout}")
    print("file-errors: missing/garbage/empty/truncated/unsupported/usage -> exit 2 with a message; non-RoCE counted")


def t_mutations():
    rnd = random.Random(int(os.environ.get("DUMP_TEST_SEED", "4791")))
    _, recs = read_pcap(os.path.join(DATA, "rxe-rc-reference.pcap"))
    raw = open(os.path.join(DATA, "rxe-imm-inv.pcap"), "rb").read()
    codes = {}
    for i in range(40):
        path = os.path.join(TMP, f"mut{i}.pcap")
        if i % 2 == 0:  # frame contents: flips, truncations, random lengths of random bytes
            out = []
            for s, u, o, d in rnd.sample(recs, 30):
                d = bytearray(d)
                kind = rnd.randrange(4)
                if kind == 0:
                    for _ in range(rnd.randrange(1, 4)):
                        d[rnd.randrange(len(d))] ^= 1 << rnd.randrange(8)
                elif kind == 1:
                    d = d[:rnd.randrange(len(d) + 1)]
                elif kind == 2:
                    d = d[:14 + 20 + 8] + bytes(rnd.randrange(256) for _ in range(rnd.randrange(60)))
                    d[14 + 20 + 2:14 + 20 + 4] = b"\x12\xb7"  # keep it addressed to port 4791
                else:
                    pos = rnd.randrange(14, min(len(d), 80))
                    d[pos] = rnd.randrange(256)
                out.append((s, u, o, bytes(d)))
            write_pcap(path, out)
        else:  # file structure: flipped header/record bytes, cuts
            b = bytearray(raw)
            for _ in range(rnd.randrange(1, 6)):
                b[rnd.randrange(min(len(b), 200))] = rnd.randrange(256)
            if rnd.randrange(2):
                b = b[:rnd.randrange(len(b))]
            open(path, "wb").write(bytes(b))
        for args in ((path,), ("--json", path)):
            p = run(*args)
            codes[p.returncode] = codes.get(p.returncode, 0) + 1
            check(p.returncode in (0, 1, 2), f"mutation {i} {args}: exit {p.returncode}\n{p.stderr[-2000:]}")
            if args[0] == "--json" and p.returncode != 2 and p.stdout:
                try:
                    summary_json(p.stdout)
                except Exception as e:  # noqa: BLE001
                    check(False, f"mutation {i}: --json output does not parse: {e}")
    print(f"mutations: 80 runs, exit codes {dict(sorted(codes.items()))}, no crash")


TESTS = {"captures": t_captures, "icrc-bad": t_icrc_bad, "json": t_json, "pcapng": t_pcapng,
         "file-errors": t_file_errors, "mutations": t_mutations}
try:
    TESTS[TEST]()
finally:
    for f in glob.glob(os.path.join(TMP, "*")):
        os.unlink(f)
    os.rmdir(TMP)
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)

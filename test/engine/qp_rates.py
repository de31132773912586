#!/usr/bin/env python3
"""Per-QP throughput of a droced node, from its control socket (droce-ctl qps).

  qp_rates.py sample SOCKET OUT INTERVAL_MS SECONDS
      Every INTERVAL_MS for at most SECONDS (or until SIGTERM): the `qps` command
      and `counters` (groups port and core) on one connection; one JSON line per
      sample to OUT: {"t": seconds (monotonic, taken when the qps answer came), "qps":
      {qpn: tx_bytes}} for the RC QPs in RTS, "pauses": the ports' fault_tx_bn_pause,
      "drops": their fault_tx_bn_drop, "stalls": the cores' [stalls, stall_us,
      stall_max_us] (gaps of 1 ms or more between two turns of a poll loop),
      "bn": the TX bottleneck's queue as its frames found it, the ports'
      [fault_tx_bn_frames, fault_tx_bn_over_kmax, fault_tx_bn_queue_sum,
      fault_tx_bn_max_queue] (lib/fault/fault_injector.h),
      "rp": {qpn: [DCQCN rate in Mb/s or null when not limited, alpha, paced,
      cnp_received, rp_cnps, rate_decreases]}.
      tx_bytes is the QP's payload bytes sent (lib/transport QpCounters), so
      retransmitted payload counts too.
  qp_rates.py report OUT [--skip S] [--win S] [--late-gap S] [--json]
      Groups the QPs by when they first moved bytes: "early" within --late-gap
      seconds of the first QP, "late" after. Early window: from the first byte
      + --skip for --win seconds (ends before the late group's first byte).
      Late window: from the late group's first byte + --skip for --win seconds,
      QPs of both groups. Per window: each QP's mean rate (bytes over the
      window), Jain's index of those means, and Jain per sample interval
      (min, median), the PFC pauses in it, the QPs' DCQCN alpha (min, median,
      max over its samples) and the bottleneck's queue: the share of the frames
      that found it at Kmax or more, the mean queue they found, and the largest
      of those means per sample interval. Prints a line per window; --json
      prints a dict.
"""
import json
import signal
import socket
import statistics
import sys
import time


BN_SUMS = ("fault_tx_bn_frames", "fault_tx_bn_over_kmax", "fault_tx_bn_queue_sum")


def queue_stats(a, b):
    """The queue the frames found between samples a and b: (frames, share at
    Kmax or more, mean bytes); None without the counters or frames."""
    if "bn" not in a or "bn" not in b:
        return None
    n = b["bn"][0] - a["bn"][0]
    if n <= 0:
        return None
    return n, (b["bn"][1] - a["bn"][1]) / n, (b["bn"][2] - a["bn"][2]) / n


def sample(sock_path, out, interval_ms, seconds):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    s.connect(sock_path)
    buf = [b""]

    def ask(req):
        s.sendall(req)
        while b"\n" not in buf[0]:
            chunk = s.recv(1 << 16)
            if not chunk:
                raise EOFError
            buf[0] += chunk
        line, buf[0] = buf[0].split(b"\n", 1)
        return json.loads(line)

    end = time.monotonic() + seconds
    nxt = time.monotonic()
    with open(out, "w") as f:
        while not stop and time.monotonic() < end:
            try:
                ans = ask(b'{"cmd": "qps"}\n')
                t = time.monotonic()
                ctr = ask(b'{"cmd": "counters", "args": {"group": "port"}}\n')
                core = ask(b'{"cmd": "counters", "args": {"group": "core"}}\n')
            except (EOFError, OSError):
                return
            if ans.get("ok") and ctr.get("ok"):
                rows = [r for r in ans["result"]["qps"] if r["type"] == "RC" and r["state"] == "RTS"]
                q = {str(r["qpn"]): r["tx_bytes"] for r in rows}
                rp = {str(r["qpn"]): [r["rate_mbps"] if r["rp_limited"] else None, r["alpha"], r["paced"],
                           r["cnp_received"], r["rp_cnps"], r["rate_decreases"]] for r in rows}
                pauses = 0
                drops = 0
                bn = [0, 0, 0, 0]
                stalls = [0, 0, 0]
                for g in ctr["result"]["groups"]:
                    for inst in g["instances"]:
                        for k, x in zip(g["names"], inst["values"]):
                            if k == "fault_tx_bn_pause":
                                pauses += x
                            elif k == "fault_tx_bn_drop":
                                drops += x
                            elif k in BN_SUMS:
                                bn[BN_SUMS.index(k)] += x
                            elif k == "fault_tx_bn_max_queue":
                                bn[3] = max(bn[3], x)
                for g in core.get("result", {}).get("groups", []):
                    for inst in g["instances"]:
                        for k, x in zip(g["names"], inst["values"]):
                            if k in ("stalls", "stall_us"):
                                stalls[k == "stall_us"] += x
                            elif k == "stall_max_us":
                                stalls[2] = max(stalls[2], x)
                f.write(json.dumps({"t": t, "qps": q, "pauses": pauses, "drops": drops, "bn": bn, "rp": rp,
                                    "stalls": stalls}) + "\n")
                f.flush()
            nxt += interval_ms / 1000.0
            d = nxt - time.monotonic()
            if d > 0:
                time.sleep(d)
            else:
                nxt = time.monotonic()


def jain(xs):
    xs = list(xs)
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 0.0


def window(samples, qpns, t0, t1):
    """Mean rate (Mb/s) per QP over [t0, t1] (the samples nearest inside),
    and Jain per sample interval inside it."""
    inside = [s for s in samples if t0 <= s["t"] <= t1 and all(q in s["qps"] for q in qpns)]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    dt = b["t"] - a["t"]
    means = {q: (b["qps"][q] - a["qps"][q]) * 8 / dt / 1e6 for q in qpns}
    per = []
    for x, y in zip(inside, inside[1:]):
        per.append(jain((y["qps"][q] - x["qps"][q]) for q in qpns))
    alphas = [v[1] for x in inside for q, v in x.get("rp", {}).items() if q in qpns]
    qs = queue_stats(a, b)
    per_q = [m for m in (queue_stats(x, y) for x, y in zip(inside, inside[1:])) if m]
    queue = None
    if qs:
        queue = {"frames": qs[0], "over_kmax": qs[1], "mean_bytes": qs[2],
                 "mean_bytes_max": max(m[2] for m in per_q), "over_kmax_max": max(m[1] for m in per_q)}
    return {"queue": queue, "from": a["t"], "to": b["t"], "samples": len(inside), "mbps": means,
            "alpha": [min(alphas), statistics.median(alphas), max(alphas)] if alphas else None,
            "pauses": b["pauses"] - a["pauses"], "pauses_per_s": (b["pauses"] - a["pauses"]) / dt,
            "jain": jain(means.values()), "jain_min": min(per), "jain_median": statistics.median(per),
            "total_mbps": sum(means.values())}


def report(path, skip, win, late_gap):
    samples = [json.loads(l) for l in open(path) if l.strip()]
    first = {}  # qpn -> time of the first sample that shows it moved bytes
    base = {}
    for s in samples:
        for q, b in s["qps"].items():
            base.setdefault(q, b)
            if q not in first and b > base[q]:
                first[q] = s["t"]
    out = {"samples": len(samples), "qps": len(first)}
    if not first:
        return out
    t_first = min(first.values())
    early = sorted(q for q, t in first.items() if t - t_first <= late_gap)
    late = sorted(q for q, t in first.items() if t - t_first > late_gap)
    t_late = min((first[q] for q in late), default=None)
    end = t_first + skip + win
    if t_late is not None:
        end = min(end, t_late)
    out["early"] = window(samples, early, t_first + skip, end)
    out["early_n"] = len(early)
    if late:
        lw = window(samples, early + late, t_late + skip, t_late + skip + win)
        out["late_n"] = len(late)
        out["late_start"] = t_late - t_first
        if lw:
            e = [lw["mbps"][q] for q in early]
            l = [lw["mbps"][q] for q in late]
            lw["early_mean_mbps"] = statistics.mean(e)
            lw["late_mean_mbps"] = statistics.mean(l)
            lw["late_ratio"] = lw["late_mean_mbps"] / lw["early_mean_mbps"] if lw["early_mean_mbps"] > 0 else 0.0
        out["late"] = lw
    for k in ("early", "late"):
        if out.get(k):
            out[k]["from"] -= t_first
            out[k]["to"] -= t_first
    return out


def fmt(name, w, n):
    if not w:
        return "%s: no window (%d QPs)" % (name, n)
    r = sorted(w["mbps"].values())
    s = "%s: %d QPs, %.1f-%.1f s (%d samples): %.0f Mb/s total, per QP %.1f-%.1f, Jain %.4f (per interval min %.3f, median %.3f), %d pauses (%.0f/s)" % (
        name, len(w["mbps"]), w["from"], w["to"], w["samples"], w["total_mbps"], r[0], r[-1], w["jain"],
        w["jain_min"], w["jain_median"], w["pauses"], w["pauses_per_s"])
    if w.get("alpha"):
        s += ", alpha %d/%d/%d" % tuple(w["alpha"])
    if w.get("queue"):
        qs = w["queue"]
        s += ", queue %.1f KB mean (per interval max %.1f), %.2f%% of %d frames found >= Kmax (per interval max %.2f%%)" % (
            qs["mean_bytes"] / 1000, qs["mean_bytes_max"] / 1000, 100 * qs["over_kmax"], qs["frames"],
            100 * qs["over_kmax_max"])
    if "late_ratio" in w:
        s += ", late QPs %.1f Mb/s vs early %.1f (ratio %.2f)" % (w["late_mean_mbps"], w["early_mean_mbps"], w["late_ratio"])
    return s


def main(argv):
    if len(argv) >= 6 and argv[1] == "sample":
        sample(argv[2], argv[3], float(argv[4]), float(argv[5]))
        return 0
    if len(argv) >= 3 and argv[1] == "report":
        opts = {"--skip": 3.0, "--win": 4.0, "--late-gap": 2.0}
        args = argv[3:]
        as_json = "--json" in args
        args = [a for a in args if a != "--json"]
        for k, v in zip(args[::2], args[1::2]):
            opts[k] = float(v)
        r = report(argv[2], opts["--skip"], opts["--win"], opts["--late-gap"])
        if as_json:
            print(json.dumps(r))
        else:
            print(fmt("early", r.get("early"), r.get("early_n", 0)))
            if "late_n" in r:
                print(fmt("late ", r.get("late"), r.get("early_n", 0) + r["late_n"]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

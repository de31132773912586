#!/usr/bin/python3
"""Draws DCQCN runs on a real port: every QP's throughput and the bottleneck
queue over time, with Kmin and Kmax, and the PFC pauses when the run had any;
one row per file.
  - CSV: test/engine/perf_bottleneck.sh with SAMPLE_DIR=DIR writes
    DIR/{on,off}-ROUND.csv (droce-perf --sample-csv): bytes each QP sent per
    10 ms, the queue's largest sample per 10 ms, pauses per 10 ms.
  - JSONL: test/engine/bn_fair.sh (two droced nodes) with KEEP=DIR writes
    DIR/{on,off,on4,on2}.jsonl (test/engine/qp_rates.py sample, every 250 ms):
    each QP's payload sent per interval, the mean queue the bottleneck's frames
    found in it (port counters fault_tx_bn_queue_sum / fault_tx_bn_frames) and
    the share of them that found it at Kmax or more, pauses per interval.

  scripts/dcqcn-port-plot.py OUT.png A.csv|A.jsonl [B ...]   (Debian's /usr/bin/python3 with python3-matplotlib)
  SAMPLE_DIR=build/dcqcn-port bash test/engine/perf_bottleneck.sh build/app/droce-perf/droce-perf
  KEEP=build/bn-fair meson test -C build engine_bn_fair   (then on.jsonl, on2.jsonl, ...)
"""
import csv
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KMIN, KMAX = 5_000, 100_000  # perf_bottleneck.sh's and bn_fair.sh's RED thresholds (bytes)
BIN_US = 10_000


def series(path):
    """Per QP: [(ms, Gb/s)] per bin; the queue: [(ms, max bytes)] per bin; PFC pauses: [(ms, n)] per bin."""
    qps, queue, pauses = {}, {}, {}
    last = {}
    for r in csv.DictReader(open(path)):
        t, qp, tx = float(r["t_us"]), int(r["qp"]), int(r["tx_bytes"])
        b = int(t // BIN_US)
        queue[b] = max(queue.get(b, 0), int(r["queue_bytes"]))
        pauses[b] = max(pauses.get(b, 0), int(r.get("pfc_pauses") or 0))  # cumulative
        if qp in last:
            qps.setdefault(qp, {})
            qps[qp][b] = qps[qp].get(b, 0) + tx - last[qp]
        last[qp] = tx
    thr = {qp: [((b + 0.5) * BIN_US / 1000, v * 8 / (BIN_US * 1000)) for b, v in sorted(d.items())]
           for qp, d in qps.items()}
    per_bin, prev = [], 0
    for b, v in sorted(pauses.items()):
        per_bin.append(((b + 0.5) * BIN_US / 1000, v - prev))
        prev = v
    return thr, [((b + 0.5) * BIN_US / 1000, v) for b, v in sorted(queue.items())], per_bin


def series_jsonl(path):
    """The same from qp_rates.py's samples, per sample interval (time in ms from
    the first QP's first byte): per QP [(ms, Gb/s)], the queue [(ms, mean bytes
    its frames found)], pauses [(ms, n)], and [(ms, share of frames >= Kmax)]."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    t0 = None
    for a, b in zip(rows, rows[1:]):
        if any(b["qps"].get(q, 0) > a["qps"].get(q, v) for q, v in b["qps"].items()):
            t0 = a["t"]
            break
    if t0 is None:
        return {}, [], [], []
    thr, queue, pauses, over = {}, [], [], []
    for a, b in zip(rows, rows[1:]):
        if b["t"] < t0:
            continue
        dt = b["t"] - a["t"]
        ms = ((a["t"] + b["t"]) / 2 - t0) * 1000
        for q, v in b["qps"].items():
            if q in a["qps"]:
                thr.setdefault(q, []).append((ms, (v - a["qps"][q]) * 8 / dt / 1e9))
        pauses.append((ms, b["pauses"] - a["pauses"]))
        n = b["bn"][0] - a["bn"][0]
        if n > 0:
            queue.append((ms, (b["bn"][2] - a["bn"][2]) / n))
            over.append((ms, (b["bn"][1] - a["bn"][1]) / n))
    return thr, queue, pauses, over


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out, paths = sys.argv[1], sys.argv[2:]
    fig, axes = plt.subplots(len(paths), 2, figsize=(13, 3.2 * len(paths)), squeeze=False)
    for row, path in zip(axes, paths):
        over = []
        if path.endswith(".jsonl"):  # bn_fair.sh
            thr, queue, pauses, over = series_jsonl(path)
            base = os.path.basename(path)[: -len(".jsonl")]
            name = ("DCQCN off" if base == "off" else "DCQCN on") + f", {len(thr)} QPs ({base})"
            per, qtitle = "per 250 ms", "mean found by its frames per 250 ms"
        else:
            thr, queue, pauses = series(path)
            name = os.path.basename(path)[: -len(".csv")]
            name = ("DCQCN on" if name.startswith("on") else "DCQCN off") + f", round {name.split('-')[-1]}"
            per, qtitle = "per 10 ms", "max per 10 ms"
        if not queue:
            print(f"{path}: no samples", file=sys.stderr)
            return 1
        ax = row[0]
        for qp, pts in sorted(thr.items()):
            ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.8, label=f"QP {qp}" if len(thr) <= 8 else None)
        ax.set_title(f"{name}: throughput per QP (sent, {per})", fontsize=9)
        ax.set_xlabel("time (ms)")
        ax.set_ylim(bottom=0)
        ax.set_ylabel("Gb/s")
        if len(thr) <= 8:
            ax.legend(fontsize=7, loc="upper right")
        ax = row[1]
        ax.plot([p[0] for p in queue], [p[1] / 1000 for p in queue], lw=0.8, color="k")
        if any(p[1] for p in pauses):
            ax2 = ax.twinx()
            ax2.plot([p[0] for p in pauses], [p[1] for p in pauses], lw=0.8, color="tab:purple", alpha=0.7)
            ax2.set_ylabel(f"PFC pauses {per}", color="tab:purple")
            ax2.set_ylim(bottom=0)
        ax.axhline(KMIN / 1000, ls=":", color="g", label="Kmin")
        ax.axhline(KMAX / 1000, ls="--", color="r", label="Kmax")
        if over:  # the share of frames that found the queue at Kmax or more, in the title
            late = [p[1] for p in over if p[0] >= 3000]
            if late:
                ax.plot([], [], " ", label=f">= Kmax from 3 s: {100 * sum(late) / len(late):.1f}% of frames")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{name}: bottleneck queue ({qtitle})", fontsize=9)
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("KB")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

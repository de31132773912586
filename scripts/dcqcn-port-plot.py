#!/usr/bin/python3
"""Draws DCQCN runs on a real port (test/engine/perf_bottleneck.sh with
SAMPLE_DIR=DIR writes DIR/{on,off}-ROUND.csv, droce-perf --sample-csv): for
each CSV, every QP's throughput (bytes it sent per 10 ms) and the bottleneck
queue (its largest sample per 10 ms) over time, with Kmin and Kmax, and the PFC
pauses per 10 ms when the run had any (PFC_XOFF); one row per CSV.

  scripts/dcqcn-port-plot.py OUT.png A.csv [B.csv ...]   (Debian's /usr/bin/python3 with python3-matplotlib)
  SAMPLE_DIR=build/dcqcn-port bash test/engine/perf_bottleneck.sh build/app/droce-perf/droce-perf
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KMIN, KMAX = 5_000, 100_000  # perf_bottleneck.sh's RED thresholds (bytes)
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


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out, paths = sys.argv[1], sys.argv[2:]
    fig, axes = plt.subplots(len(paths), 2, figsize=(13, 3.2 * len(paths)), squeeze=False)
    for row, path in zip(axes, paths):
        thr, queue, pauses = series(path)
        if not queue:
            print(f"{path}: no samples", file=sys.stderr)
            return 1
        name = os.path.basename(path)[: -len(".csv")]
        name = ("DCQCN on" if name.startswith("on") else "DCQCN off") + f", round {name.split('-')[-1]}"
        ax = row[0]
        for qp, pts in sorted(thr.items()):
            ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.8, label=f"QP {qp}" if len(thr) <= 8 else None)
        ax.set_title(f"{name}: throughput per QP (sent, per 10 ms)")
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("Gb/s")
        if len(thr) <= 8:
            ax.legend(fontsize=7, loc="upper right")
        ax = row[1]
        ax.plot([p[0] for p in queue], [p[1] / 1000 for p in queue], lw=0.8, color="k")
        if any(p[1] for p in pauses):
            ax2 = ax.twinx()
            ax2.plot([p[0] for p in pauses], [p[1] for p in pauses], lw=0.8, color="tab:purple", alpha=0.7)
            ax2.set_ylabel("PFC pauses per 10 ms", color="tab:purple")
            ax2.set_ylim(bottom=0)
        ax.axhline(KMIN / 1000, ls=":", color="g", label="Kmin")
        ax.axhline(KMAX / 1000, ls="--", color="r", label="Kmax")
        ax.set_title(f"{name}: bottleneck queue (max per 10 ms)")
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("KB")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Draws DCQCN bottleneck runs (test/transport/test_dcqcn_bottleneck.cc with
DROCE_DCQCN_CSV=DIR writes DIR/dcqcn-CASE.csv): for each CSV, the throughput
of every flow (received bytes per 100 us sample) and the bottleneck queue (its
maximum in each sample) over time, with Kmin and Kmax, and the PFC pauses per
sample when the run had any; one row per CSV.

  scripts/dcqcn-plot.py OUT.png A.csv [B.csv ...]   (Debian's /usr/bin/python3 with python3-matplotlib)
  scripts/dcqcn-plot.sh [OUTDIR]                     (runs the test cases and draws one PNG per case)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KMIN, KMAX = 5_000, 200_000  # the test's RED thresholds (bytes)
XOFF = 600_000  # the test's PFC Xoff (bytes), drawn when a run paused


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out, paths = sys.argv[1], sys.argv[2:]
    fig, axes = plt.subplots(len(paths), 2, figsize=(13, 3.2 * len(paths)), squeeze=False)
    for row, path in zip(axes, paths):
        rows = list(csv.DictReader(open(path)))
        if not rows:
            print(f"{path}: no samples", file=sys.stderr)
            return 1
        t = [float(r["time_us"]) / 1000 for r in rows]
        flows = sorted((k for k in rows[0] if k.startswith("flow")), key=lambda k: int(k[4:-5]))
        name = os.path.basename(path)[len("dcqcn-"):-len(".csv")] if os.path.basename(path).startswith("dcqcn-") else path
        ax = row[0]
        for k in flows:
            ax.plot(t, [float(r[k]) for r in rows], lw=0.8, label=k[:-5] if len(flows) <= 5 else None)
        ax.set_title(f"{name}: throughput per flow")
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("Gb/s per 100 us")
        ax.set_ylim(bottom=0)
        if len(flows) <= 5:
            ax.legend(loc="upper right", fontsize=7)
        ax = row[1]
        ax.plot(t, [int(r["queue_max_bytes"]) / 1000 for r in rows], lw=0.8, color="tab:red", label="max queue")
        if "pfc_pauses" in rows[0] and any(int(r["pfc_pauses"]) for r in rows):
            ax.axhline(XOFF / 1000, color="tab:purple", ls="-.", lw=0.8, label="PFC Xoff")
            ax2 = ax.twinx()
            ax2.plot(t, [int(r["pfc_pauses"]) for r in rows], lw=0.8, color="tab:purple", alpha=0.6, label="PFC pauses")
            ax2.set_ylabel("PFC pauses per 100 us", color="tab:purple")
            ax2.set_ylim(bottom=0)
        ax.axhline(KMIN / 1000, color="gray", ls=":", lw=0.8, label="Kmin")
        ax.axhline(KMAX / 1000, color="gray", ls="--", lw=0.8, label="Kmax")
        ax.set_title(f"{name}: bottleneck queue")
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("KB (max per 100 us)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

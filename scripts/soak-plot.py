#!/usr/bin/python3
"""Plots a soak run's samples (scripts/soak.sh's CSV): RSS, hugepage use and
open file descriptors of each droced over time, load samples as lines and the
idle checkpoints as markers.

  scripts/soak-plot.py SOAK.csv OUT.png     (Debian's /usr/bin/python3 with python3-matplotlib)
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    rows = list(csv.DictReader(open(sys.argv[1])))
    series = (("rss_kb", "RSS (MiB)", 1024), ("hugetlb_kb", "hugepages (MiB)", 1024), ("fds", "open fds", 1))
    fig, axes = plt.subplots(len(series), 1, figsize=(9, 7.5), sharex=True)
    for ax, (key, label, div) in zip(axes, series):
        for node, color in (("a", "tab:blue"), ("b", "tab:orange")):
            run = [r for r in rows if r["node"] == node and r["phase"] == "run"]
            idle = [r for r in rows if r["node"] == node and r["phase"] == "idle"]
            ax.plot([float(r["t_s"]) / 60 for r in run], [int(r[key]) / div for r in run], color=color, lw=1,
                    label=f"node {node} under load")
            ax.plot([float(r["t_s"]) / 60 for r in idle], [int(r[key]) / div for r in idle], "o", color=color,
                    mfc="white", label=f"node {node} idle checkpoint")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, ncol=2)
    axes[-1].set_xlabel("minutes")
    fig.suptitle("scripts/soak.sh: each droced's memory and fds")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=80)
    return 0


if __name__ == "__main__":
    sys.exit(main())

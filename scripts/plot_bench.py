#!/usr/bin/python3
"""Draws the benchmark curves of scripts/bench.sh into one PNG per port.

Reads what test/bench/bench_dataplane.sh and bench_transport leave in the
build directory:
  bench-size-PORT.csv      RC WRITE messages/s and Gb/s against message size
  bench-lat-PORT.csv       WRITE ping-pong half RTT (typical, p99, p99.9) against
                           size, and the raw frame ping-pong of the same run
  bench-qps-PORT.csv       64 B WRITE messages/s against the QP count (droce-perf)
  bench-dataplane-PORT.csv the baselines (testpmd rate, memcpy) of the same run
  bench-transport-qps.csv  in-process QP scaling (bench_transport, 1 .. 65536 QPs)
and writes BUILD/bench-PORT.png (four panels). Missing files leave their panel
empty with a note, never an error.

  scripts/plot_bench.py [BUILD_DIR]    (default: build)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def baseline(build, port, prefix):
    for r in rows(os.path.join(build, f"bench-dataplane-{port}.csv")):
        if r.get("case", "").startswith(prefix):
            return num(r.get("baseline"))
    return None


def empty(ax, what):
    ax.text(0.5, 0.5, f"no data ({what})", ha="center", va="center", transform=ax.transAxes)


def plot_port(build, port):
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    fig.suptitle(f"droce on net_{port} (one lcore per side; baselines from the same run)")

    # 1. message rate against size
    ax = axes[0][0]
    size = [r for r in rows(os.path.join(build, f"bench-size-{port}.csv")) if num(r["mpps"])]
    if size:
        ax.plot([num(r["size"]) for r in size], [num(r["mpps"]) for r in size], "o-", label="droce RC WRITE")
        raw = baseline(build, port, "64 B RC WRITE rate vs testpmd")
        if raw:
            ax.axhline(raw, color="gray", ls="--", label=f"testpmd 64 B frames ({raw:.2f} Mpps)")
        rawbw = baseline(build, port, "64 B RC WRITE rate vs raw_ethernet_bw")
        if rawbw:
            ax.axhline(rawbw, color="gray", ls=":", label=f"droce-perf raw_ethernet_bw 64 B ({rawbw:.2f} Mpps)")
        ax.set_xscale("log", base=2)
        ax.legend()
    else:
        empty(ax, f"bench-size-{port}.csv")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("messages/s (M)")
    ax.set_title("message rate vs size")

    # 2. bandwidth against size
    ax = axes[0][1]
    if size:
        ax.plot([num(r["size"]) for r in size], [num(r["gbps"]) for r in size], "o-", label="droce RC WRITE")
        mc = baseline(build, port, "64 KiB RC WRITE (MTU")
        if mc:
            ax.axhline(mc, color="gray", ls="--", label=f"memcpy 64 KiB ({mc:.0f} Gb/s)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend()
    else:
        empty(ax, f"bench-size-{port}.csv")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("Gb/s")
    ax.set_title("bandwidth vs size")

    # 3. latency percentiles against size
    ax = axes[1][0]
    lat = rows(os.path.join(build, f"bench-lat-{port}.csv"))
    drl = [r for r in lat if r["kind"] == "droce" and num(r["typical"])]
    raw = [r for r in lat if r["kind"] == "raw" and num(r["typical"])]
    if drl:
        xs = [num(r["size"]) for r in drl]
        for col, style in (("typical", "o-"), ("p99", "s--"), ("p999", "^:")):
            ax.plot(xs, [num(r[col]) for r in drl], style, label=f"droce WRITE {col.replace('p999', 'p99.9')}")
        if raw:
            ax.plot([num(r["size"]) for r in raw], [num(r["typical"]) for r in raw], "kx-",
                    label="raw frame ping-pong, typical")
            ax.plot([num(r["size"]) for r in raw], [num(r["p99"]) for r in raw], "kx--",
                    label="raw frame ping-pong, p99")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend()
    else:
        empty(ax, f"bench-lat-{port}.csv")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("half round trip (us)")
    ax.set_title("latency percentiles vs size")

    # 4. QP-count scaling, as a ratio to one QP
    ax = axes[1][1]
    qps = [r for r in rows(os.path.join(build, f"bench-qps-{port}.csv")) if num(r["mpps"])]
    tq = [r for r in rows(os.path.join(build, "bench-transport-qps.csv")) if num(r["mpps"])]
    drew = False
    for data, label in ((qps, f"droce-perf over net_{port}"), (tq, "bench_transport (memlink, one core)")):
        one = next((num(r["mpps"]) for r in data if num(r["qps"]) == 1), None)
        if data and one:
            ax.plot([num(r["qps"]) for r in data], [num(r["mpps"]) / one for r in data], "o-", label=label)
            drew = True
    if drew:
        ax.axhline(0.7, color="gray", ls="--", label="goal at 64K QPs: 0.7")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.legend()
    else:
        empty(ax, f"bench-qps-{port}.csv / bench-transport-qps.csv")
    ax.set_xlabel("active QPs")
    ax.set_ylabel("64 B WRITE rate / one-QP rate")
    ax.set_title("QP-count scaling")

    fig.tight_layout()
    out = os.path.join(build, f"bench-{port}.png")
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    made = []
    for port in ("memif", "af_packet"):
        if any(os.path.exists(os.path.join(build, f"bench-{k}-{port}.csv")) for k in ("size", "lat", "qps", "dataplane")):
            made.append(plot_port(build, port))
    if not made:
        print(f"plot_bench: no bench CSVs in {build} (run scripts/bench.sh first)", file=sys.stderr)
        return 1
    for m in made:
        print(f"plot_bench: wrote {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

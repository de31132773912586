#!/usr/bin/env bash
# Runs droce's benchmarks on a release build and prints their tables, each
# with the baseline it is compared against measured in the same run; the
# sweeps' CSVs are drawn into build/bench-memif.png and bench-af_packet.png
# (scripts/plot_bench.py).
#   scripts/bench.sh [seconds-per-case, a whole number]
#   scripts/bench.sh nvmf [seconds]   only the NVMe-oF mode (test/bench/bench_nvmf.sh:
#                                     droce-nvmf-perf against droce-nvmf over memif next to
#                                     droce-perf's raw READ/WRITE, same run, CSV in build/)
set -euo pipefail
usage() { sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; }
mode=all
if [ "${1:-}" = nvmf ]; then mode=nvmf; shift; fi
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
esac
if [ $# -gt 1 ] || { [ $# -eq 1 ] && ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; }; then
  usage >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
source "$here/setup.sh"
droce_install_packages
droce_build build --buildtype=release >/dev/null
if [ "$mode" = nvmf ]; then
  exec bash "$DROCE_ROOT/test/bench/bench_nvmf.sh" "$DROCE_ROOT/build" "${1:-5}"
fi
"$DROCE_ROOT/build/test/bench/bench_wire" "${1:-0.5}"
"$DROCE_ROOT/build/test/bench/bench_transport" "${1:-0.5}" | tee "$DROCE_ROOT/build/bench-transport.txt"
# Its QP-count scaling as CSV for the plot.
{ echo "qps,mpps"
  sed -n 's/^RC WRITE 64 B over \([0-9]*\) QPs (M\/s) *\([0-9.]*\).*/\1,\2/p' "$DROCE_ROOT/build/bench-transport.txt"
} >"$DROCE_ROOT/build/bench-transport-qps.csv"
"$DROCE_ROOT/build/test/bench/bench_ops" "${1:-0.5}"
"$DROCE_ROOT/build/test/bench/bench_multicore" "${1:-3}"
for mtu in 1024 4096; do "$DROCE_ROOT/build/test/bench/bench_zero_copy" "${1:-3}" "$mtu"; done
bash "$DROCE_ROOT/test/bench/bench_port.sh" "$DROCE_ROOT/build" "${DROCE_PORT_BENCH_SECONDS:-3}"
for ptype in memif af_packet; do bash "$DROCE_ROOT/test/bench/bench_dataplane.sh" "$DROCE_ROOT/build" "${1:-3}" "$ptype"; done
for ptype in memif af_packet; do bash "$DROCE_ROOT/test/bench/bench_shim_engine.sh" "$DROCE_ROOT/build" "${1:-3}" "$ptype"; done
bash "$DROCE_ROOT/test/bench/bench_nvmf.sh" "$DROCE_ROOT/build" "${1:-3}"
# The curves (message rate and latency vs size, QP scaling) as PNGs in build/.
/usr/bin/python3 "$DROCE_ROOT/scripts/plot_bench.py" "$DROCE_ROOT/build"

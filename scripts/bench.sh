#!/usr/bin/env bash
# Runs droce's benchmarks on a release build and prints their tables, each
# with the baseline it is compared against measured in the same run.
#   scripts/bench.sh [seconds-per-case]
#   scripts/bench.sh nvmf [seconds]   only the NVMe-oF mode (test/bench/bench_nvmf.sh:
#                                     droce-nvmf-perf against droce-nvmf over memif next to
#                                     droce-perf's raw READ/WRITE, same run, CSV in build/)
set -euo pipefail
mode=all
if [ "${1:-}" = nvmf ]; then mode=nvmf; shift; fi
here=$(cd "$(dirname "$0")" && pwd)
source "$here/setup.sh"
droce_install_packages
droce_build build --buildtype=release >/dev/null
if [ "$mode" = nvmf ]; then
  exec bash "$DROCE_ROOT/test/bench/bench_nvmf.sh" "$DROCE_ROOT/build" "${1:-5}"
fi
"$DROCE_ROOT/build/test/bench/bench_wire" "${1:-0.5}"
"$DROCE_ROOT/build/test/bench/bench_transport" "${1:-0.5}"
"$DROCE_ROOT/build/test/bench/bench_ops" "${1:-0.5}"
"$DROCE_ROOT/build/test/bench/bench_multicore" "${1:-3}"
for mtu in 1024 4096; do "$DROCE_ROOT/build/test/bench/bench_zero_copy" "${1:-3}" "$mtu"; done
bash "$DROCE_ROOT/test/bench/bench_port.sh" "$DROCE_ROOT/build" "${DROCE_PORT_BENCH_SECONDS:-3}"
for ptype in memif af_packet; do bash "$DROCE_ROOT/test/bench/bench_dataplane.sh" "$DROCE_ROOT/build" "${1:-3}" "$ptype"; done
bash "$DROCE_ROOT/test/bench/bench_shim_engine.sh" "$DROCE_ROOT/build" "${1:-3}"
bash "$DROCE_ROOT/test/bench/bench_nvmf.sh" "$DROCE_ROOT/build" "${1:-3}"

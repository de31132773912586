#!/usr/bin/env bash
# Runs droce's benchmarks on a release build and prints their tables, each
# with the baseline it is compared against measured in the same run.
#   scripts/bench.sh [seconds-per-case]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/setup.sh"
droce_install_packages
droce_build build --buildtype=release >/dev/null
"$DROCE_ROOT/build/test/bench/bench_wire" "${1:-0.5}"
"$DROCE_ROOT/build/test/bench/bench_transport" "${1:-0.5}"
"$DROCE_ROOT/build/test/bench/bench_ops" "${1:-0.5}"
"$DROCE_ROOT/build/test/bench/bench_multicore" "${1:-3}"
for mtu in 1024 4096; do "$DROCE_ROOT/build/test/bench/bench_zero_copy" "${1:-3}" "$mtu"; done
bash "$DROCE_ROOT/test/bench/bench_port.sh" "$DROCE_ROOT/build" "${DROCE_PORT_BENCH_SECONDS:-3}"
bash "$DROCE_ROOT/test/bench/bench_dataplane.sh" "$DROCE_ROOT/build" "${1:-3}"
bash "$DROCE_ROOT/test/bench/bench_shim_engine.sh" "$DROCE_ROOT/build" "${1:-3}"

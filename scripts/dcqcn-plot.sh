#!/usr/bin/env bash
# Runs the DCQCN bottleneck tests (test/transport/test_dcqcn_bottleneck.cc, the
# transport_dcqcn_bottleneck_* cases) on a release build with DROCE_DCQCN_CSV
# set, then draws their time series, throughput per flow and the bottleneck
# queue, one PNG per case with the same run without DCQCN below it:
#   dcqcn-2flows.png   2 flows (NVIDIA's parameters, RED on arrival)
#   dcqcn-4flows.png   4 flows, marking on departure: NVIDIA's parameters, the paper's timescales
#   dcqcn-16flows.png  16 flows joining one every 500 us (the paper's timescales)
#   dcqcn-late.png     3 flows, a 4th from 10 ms (the paper's timescales)
#   dcqcn-pfc.png      16 flows starting together with PFC (the paper's timescales; PFC alone below)
#   dcqcn-16flows-iw.png 16 flows starting together without PFC, a first window of 16 packets
#   scripts/dcqcn-plot.sh [OUTDIR]     default build/dcqcn (CSVs there too);
#                                      scripts/dcqcn-results/ holds the committed figures
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/setup.sh"
droce_install_packages
[ -f "$DROCE_ROOT/build/build.ninja" ] || meson setup "$DROCE_ROOT/build" "$DROCE_ROOT" --buildtype=release >/dev/null
dir=${1:-$DROCE_ROOT/build/dcqcn}
mkdir -p "$dir"
ninja -C "$DROCE_ROOT/build" test/transport/test_transport_dcqcn_bottleneck >/dev/null
# Each case prints its figures (Jain, queue, drops); a failed check still leaves its CSV.
t=$DROCE_ROOT/build/test/transport/test_transport_dcqcn_bottleneck
DROCE_DCQCN_CSV=$dir "$t" "[bottleneck]" | grep -E '^[0-9a-z-]+: ' || true
draw() {
  local png=$1 csvs=()
  shift
  for c in "$@"; do
    [ -s "$dir/dcqcn-$c.csv" ] && csvs+=("$dir/dcqcn-$c.csv")
  done
  ((${#csvs[@]})) || { echo "dcqcn-plot: no CSV for $png in $dir" >&2; return 1; }
  /usr/bin/python3 "$here/dcqcn-plot.py" "$dir/$png" "${csvs[@]}"
}
draw dcqcn-2flows.png 2flows 2flows-off
draw dcqcn-4flows.png 4flows 4flows-paper 4flows-off
draw dcqcn-16flows.png 16flows 16flows-off
draw dcqcn-late.png late late-off
draw dcqcn-pfc.png 16flows-pfc 16flows-pfc-off
draw dcqcn-16flows-iw.png 16flows-iw16 16flows-iw16-off

#!/usr/bin/env bash
# Runs the DCQCN bottleneck cases (test/transport/test_dcqcn_bottleneck.cc) on
# a release build with DROCE_DCQCN_CSV set, then draws their time series:
# throughput per flow and the bottleneck queue, for 2, 4 and 16 flows and a
# flow that starts late, with DCQCN (and the 2-flow run without it).
#   scripts/dcqcn-plot.sh [OUT.png]        default build/dcqcn/dcqcn.png (CSVs beside it)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/setup.sh"
droce_install_packages
[ -f "$DROCE_ROOT/build/build.ninja" ] || meson setup "$DROCE_ROOT/build" "$DROCE_ROOT" --buildtype=release >/dev/null
out=${1:-$DROCE_ROOT/build/dcqcn/dcqcn.png}
dir=$(dirname "$out")
mkdir -p "$dir"
ninja -C "$DROCE_ROOT/build" test/transport/test_transport_dcqcn_bottleneck >/dev/null
# Each case prints its figures (Jain, queue, drops); a failed check still leaves its CSV.
t=$DROCE_ROOT/build/test/transport/test_transport_dcqcn_bottleneck
DROCE_DCQCN_CSV=$dir "$t" "[bottleneck]" || true
DROCE_DCQCN_CSV=$dir DROCE_ON=1 DROCE_NAME=4flows DROCE_FLOWS=4 DROCE_MS=20 "$t" "[.explore]" | tail -1
DROCE_DCQCN_CSV=$dir DROCE_ON=1 DROCE_NAME=late DROCE_FLOWS=4 DROCE_LATE_MS=10 DROCE_MS=30 "$t" "[.explore]" | tail -1
DROCE_DCQCN_CSV=$dir DROCE_ON=1 DROCE_NAME=16flows DROCE_FLOWS=16 DROCE_GAP_US=500 DROCE_MS=30 "$t" "[.explore]" | tail -1
csvs=()
for c in 2flows 2flows-off 4flows late 16flows; do
  [ -s "$dir/dcqcn-$c.csv" ] && csvs+=("$dir/dcqcn-$c.csv")
done
((${#csvs[@]})) || { echo "dcqcn-plot: no CSV written in $dir" >&2; exit 1; }
/usr/bin/python3 "$here/dcqcn-plot.py" "$out" "${csvs[@]}"

#!/usr/bin/env bash
# The verbs shim's cost on the real dataplane, in one run, same port type,
# same lcores.
#   bench_shim_engine.sh BUILD_DIR [SECONDS] [af_packet|memif] [ROUNDS]
#
# af_packet (the default): two droced nodes on a veth pair in a namespace of
# their own (node A / server on CPU 1, node B / client on CPU 0):
#   shim:     Debian's perftest (ib_write_bw -s 64, ib_send_lat -s 64), a
#             separate process per side, through the drop-in libibverbs.so.1
#             and the shim rings into two droced nodes;
#   embedded: the same workload through the embedding API in-process
#             (droce-perf write_bw -s 64, send_lat -s 64: the application
#             posts to the engine it polls itself).
#   The kernel moves every frame there and is the bottleneck (it hides the
#   shim's cost); each program also shares its CPU with a droced loop.
#
# memif: the fast path, where the shim's own cost shows: bench_shim_memif.sh
# (one droced on CPU 1, the programs on CPU 0; see there).
set -uo pipefail
build=$1
secs=${2:-3}
ptype=${3:-af_packet}
rounds=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
perf=$build/app/droce-perf/droce-perf
case "$ptype" in
  af_packet) ;;
  memif) exec bash "$here/bench_shim_memif.sh" "$build" "$secs" "$rounds" ;;
  *) echo "port must be af_packet or memif" >&2; exit 2 ;;
esac
shim=$(DROCE_BENCH_SECS=$secs bash "$here/../engine/shim_pair.sh" "$build/app/droced/droced" \
  "$build/app/droce-ctl/droce-ctl" "$build/lib/shim/front" "$build/test/engine/shim_engine_check" bench 2>&1)
line=$(grep '^SHIM_BENCH' <<<"$shim")
s_mpps=$(sed -n 's/.*write64_mpps=\([0-9.]*\).*/\1/p' <<<"$line")
s_lat=$(sed -n 's/.*send64_lat_typical_us=\([0-9.]*\).*/\1/p' <<<"$line")
s_late=$(sed -n 's/.*send64_lat_events_us=\([0-9.]*\).*/\1/p' <<<"$line")
[ -z "$line" ] && echo "$shim" | tail -n 30

ns=droce-bs-$$
tmp=$(mktemp -d)
cleanup() { ip netns del "$ns" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
source "$(dirname "$0")/../lib/netns.sh"
droce_veth_ns "$ns" || { echo "cannot create network namespace $ns"; exit 1; }
EAL=(--in-memory --no-pci --log-level=lib.eal:error --log-level=pmd.net.af_packet:error)
port=18700
droce_perf_run "$tmp/w64.log" 1 write_bw -s 64 -D "$secs" -t 128
droce_perf_run "$tmp/l64.log" 1 send_lat -s 64 -n 300
e_mpps=$(awk '$1 == 64 && NF >= 5 {print $4}' "$tmp/w64.log" | tail -n 1)
e_lat=$(awk '$1 == 64 && NF >= 5 {print $5}' "$tmp/l64.log" | tail -n 1)

echo "== verbs shim (perftest, separate process, two droced) vs embedding API in-process (droce-perf), same run"
awk -v sm="${s_mpps:-0}" -v em="${e_mpps:-0}" -v sl="${s_lat:-0}" -v el="${e_lat:-0}" -v se="${s_late:-0}" 'BEGIN {
  printf "%-34s %14s %14s %8s\n", "case", "shim", "embedded", "ratio"
  printf "%-34s %9.4f Mpps %9.4f Mpps %8s\n", "64 B RC WRITE message rate", sm, em, (em > 0 ? sprintf("%.3f", sm / em) : "n/a")
  printf "%-34s %12.2f us %12.2f us %8s\n", "64 B RC SEND latency (typical)", sl, el, (el > 0 ? sprintf("%.3f", sl / el) : "n/a")
  printf "%-34s %12.2f us %12.2f us %8s\n", "  same, shim app on events (-e)", se, el, (el > 0 ? sprintf("%.3f", se / el) : "n/a")
}'

#!/usr/bin/env bash
# droce's dataplane against its baselines, in one run, same port type
# (net_af_packet on a veth pair in a namespace of its own) and core count
# (one lcore per side: sender/client on CPU 0, receiver/server on CPU 1):
#   1. 64-byte RC WRITE message rate (droce-perf write_bw -s 64) vs the raw
#      64-byte packet rate of dpdk-testpmd (txonly -> rxonly) through the same port;
#   2. 64 KiB RC WRITE throughput vs memcpy bandwidth of 64 KiB blocks;
#   2b. the same 64 KiB WRITE with the copy path (--zero-copy-min 0) against
#      zero-copy TX (payload attached from hugepage MRs, --zero-copy-min 1024
#      so MTU-1024 packets go by reference; test/bench/bench_zero_copy measures
#      the CPU cost of both paths without the kernel in the way);
#   3. the same 64-byte WRITE rate with 2 queues per port (RSS/fanout spreads
#      frames, the cross-core rings bring them to the owning loop; both loops
#      on one thread in embedded mode).
#   bench_dataplane.sh BUILD_DIR [SECONDS]
set -euo pipefail
build=$1
secs=${2:-3}
perf=$build/app/droce-perf/droce-perf
testpmd=$(command -v dpdk-testpmd || true)
ns=droce-bd-$$
tmp=$(mktemp -d)
cleanup() { ip netns del "$ns" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
source "$(dirname "$0")/../lib/netns.sh"
droce_veth_ns "$ns" || { echo "cannot create network namespace $ns"; exit 1; }
EAL=(--in-memory --no-pci --log-level=lib.eal:error --log-level=pmd.net.af_packet:error)

raw_pps=0
if [ -n "$testpmd" ]; then
  ip netns exec "$ns" timeout -s INT -k 5 $((secs + 3)) "$testpmd" --lcores=0@0,1@0 "${EAL[@]}" \
    --vdev net_af_packet0,iface=va -- --forward-mode=txonly --txpkts=64 --stats-period=1 \
    --total-num-mbufs=8192 >"$tmp/tx.log" 2>&1 &
  txp=$!
  sleep 0.5
  ip netns exec "$ns" timeout -s INT -k 5 $((secs + 1)) "$testpmd" --lcores=0@1,1@1 "${EAL[@]}" \
    --vdev net_af_packet1,iface=vb -- --forward-mode=rxonly --stats-period=1 --total-num-mbufs=8192 \
    >"$tmp/rx.log" 2>&1 || true
  wait "$txp" || true
  raw_pps=$(grep -ao 'Rx-pps: *[0-9]*' "$tmp/rx.log" | awk '{print $2}' | tail -n +2 | sort -n |
    awk '{a[NR]=$1} END {if (NR == 0) print 0; else print a[int((NR + 1) / 2)]}')
fi

port=18600
droce_perf_run "$tmp/w64.log" 1 write_bw -s 64 -D "$secs" -t 128 --window 128
droce_perf_run "$tmp/w64k.log" 1 write_bw -s 65536 -D "$secs" -t 32 --zero-copy-min 1024
droce_perf_run "$tmp/w64kc.log" 1 write_bw -s 65536 -D "$secs" -t 32 --zero-copy-min 0
droce_perf_run "$tmp/w64q2.log" 2 write_bw -s 64 -D "$secs" -q 4 -t 128 --window 128
col() { awk -v c="$2" '$1 ~ /^[0-9]+$/ && NF >= 5 {print $c}' "$1" | tail -1; }
w64_mpps=$(col "$tmp/w64.log" 4); w64_ok=$(col "$tmp/w64.log" 5)
w64k_gbs=$(col "$tmp/w64k.log" 3); w64k_ok=$(col "$tmp/w64k.log" 5)
w64kc_gbs=$(col "$tmp/w64kc.log" 3); w64kc_ok=$(col "$tmp/w64kc.log" 5)
q2_mpps=$(col "$tmp/w64q2.log" 4); q2_ok=$(col "$tmp/w64q2.log" 5)
memcpy=$("$build/test/bench/bench_memcpy" 65536 1)
memcpy_gbs=$(awk '{print $(NF-1)}' <<<"$memcpy")

echo "== droce dataplane vs baselines (net_af_packet on veth, 1 lcore per side, ${secs} s runs, same run)"
awk -v raw="$raw_pps" -v m="${w64_mpps:-0}" -v ok="${w64_ok:-FAILED}" -v q2="${q2_mpps:-0}" -v q2ok="${q2_ok:-FAILED}" \
    -v g="${w64k_gbs:-0}" -v gok="${w64k_ok:-FAILED}" -v mc="$memcpy_gbs" \
    -v gc="${w64kc_gbs:-0}" -v gcok="${w64kc_ok:-FAILED}" 'BEGIN {
  printf "%-44s %14s %14s %8s\n", "case", "droce", "baseline", "ratio"
  printf "%-44s %10.4f Mpps %9.4f Mpps %8s  (data %s)\n", "64 B RC WRITE rate vs testpmd 64 B rx rate", m, raw / 1e6,
         (raw > 0 ? sprintf("%.3f", m * 1e6 / raw) : "n/a"), ok
  printf "%-44s %10.3f Gb/s %9.2f Gb/s %8.4f  (data %s)\n", "64 KiB RC WRITE vs memcpy 64 KiB", g, mc, (mc > 0 ? g / mc : 0), gok
  printf "%-44s %10.3f Gb/s %9.2f Gb/s %8.4f  (data %s)\n", "64 KiB RC WRITE, copy path vs memcpy 64 KiB", gc, mc, (mc > 0 ? gc / mc : 0), gcok
  printf "%-44s %10.3f Gb/s %9.3f Gb/s %8.3f\n", "64 KiB WRITE zero-copy vs copy path", g, gc, (gc > 0 ? g / gc : 0)
  printf "%-44s %10.4f Mpps %9.4f Mpps %8s  (data %s)\n", "64 B WRITE, 2 queues (4 QPs) vs 1 queue", q2, m,
         (m > 0 ? sprintf("%.3f", q2 / m) : "n/a"), q2ok
}'
grep -E 'transport:' "$tmp/w64.log" | sed 's/^/  64 B run:   /' || true
grep -E 'transport:' "$tmp/w64k.log" | sed 's/^/  64 KiB run: /' || true
grep -E 'transport:' "$tmp/w64kc.log" | sed 's/^/  64 KiB copy: /' || true

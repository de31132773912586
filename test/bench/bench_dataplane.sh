#!/usr/bin/env bash
# droce's dataplane against its baselines, in one run, same port type and core
# count (one lcore per side: sender/client on CPU 0, receiver/server on CPU 1):
#   1. 64-byte RC WRITE message rate (droce-perf write_bw -s 64) vs the raw
#      64-byte frame rate of droce-perf raw_ethernet_bw (the same tool, no
#      transport: a burst of 32 frames at a time, the server's count) and of
#      dpdk-testpmd (txonly -> rxonly) through the same port,
#      every WR signaled and one in 32 (--cq-mod 32: perftest's ib_write_bw
#      signals one in 100 by default); 64-byte SEND (one in 32) and READ the same;
#   2. 64 KiB RC WRITE throughput vs memcpy bandwidth of 64 KiB blocks, with
#      zero-copy TX (payload attached from hugepage MRs, --zero-copy-min 1024)
#      and with the copy path (--zero-copy-min 0);
#   3. the same 64-byte WRITE rate with 2 queues per port (RSS/fanout spreads
#      frames, the cross-core rings bring them to the owning loop; both loops
#      on one thread in embedded mode);
#   4. 8-byte WRITE and SEND ping-pong latency (write_lat, send_lat, typical
#      half round trip; WRITE's p99 too) vs droce-perf raw_ethernet_lat: 64-byte
#      frames echoed through the same port with no transport; both after the
#      same 2048 uncounted ping-pongs (droce-perf --warmup: the first round
#      through memif's rings faults in their pages).
# The port is net_af_packet on a veth pair (the kernel moves every frame and is
# the bottleneck) or net_memif (shared memory between the two processes: the
# fast path, where the stack's own cost shows; MTU 4096 with 8 KiB buffers).
# Each case runs ROUNDS times, droce and its baseline alternating; the medians
# are printed with their ratio and, beside it, the lowest and highest of the
# rounds' own ratios (each round's figure over that round's baseline: the
# machine's phases show there), and written as CSV to
# BUILD_DIR/bench-dataplane-PORT.csv.
# Then (BENCH_SWEEP=0 skips it) one sweep per curve, for the plots of
# scripts/plot_bench.py, each a CSV in BUILD_DIR:
#   bench-size-PORT.csv  RC WRITE messages/s and Gb/s at sizes 2 B .. 64 KiB (1 s each)
#   bench-lat-PORT.csv   WRITE ping-pong half RTT percentiles at 2 B .. 4 KiB, and
#                        raw_ethernet_lat at 64 B .. 1 KiB frames, same run
#   bench-qps-PORT.csv   64 B WRITE messages/s with 1, 16, 256, 4096 and 65536 QPs (median of ROUNDS;
#                        af_packet: up to 256),
#                        each as a ratio to one QP's
#   bench_dataplane.sh BUILD_DIR [SECONDS] [af_packet|memif] [ROUNDS]
set -euo pipefail
build=$1
secs=${2:-3}
[[ "$secs" =~ ^[1-9][0-9]*$ ]] || { echo "bench_dataplane.sh: seconds: a whole number from 1, not '$secs'" >&2; exit 2; }
ptype=${3:-af_packet}
rounds=${4:-3}
case "$ptype" in af_packet|memif) ;; *) echo "port must be af_packet or memif" >&2; exit 2 ;; esac
perf=$build/app/droce-perf/droce-perf
testpmd=$(command -v dpdk-testpmd || true)
ns=droce-bd-$$
tmp=$(mktemp -d)
cleanup() { ip netns del "$ns" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
source "$(dirname "$0")/../lib/netns.sh"
droce_veth_ns "$ns" || { echo "cannot create network namespace $ns"; exit 1; }
EAL=(--in-memory --no-pci --log-level=lib.eal:error --log-level=pmd.net.af_packet:error --log-level=pmd.net.memif:error)
mtu=1024
if [ "$ptype" = memif ]; then
  # Abstract socket, one per namespace: both processes of each pair run in $ns.
  export MEMIF_SOCK=/droce-bench-$$.sock MEMIF_ARGS=",bsize=8192"
  mtu=4096
  tx_dev=(--vdev "net_memif0,role=server,socket=$MEMIF_SOCK-pmd,id=9")
  rx_dev=(--vdev "net_memif1,role=client,socket=$MEMIF_SOCK-pmd,id=9")
else
  tx_dev=(--vdev net_af_packet0,iface=va)
  rx_dev=(--vdev net_af_packet1,iface=vb)
fi

# testpmd txonly -> rxonly, 64-byte frames: the median of the receiver's
# per-second rates after the first, in packets/s.
raw_pps() {
  [ -n "$testpmd" ] || { echo 0; return; }
  local tp=$((secs < 2 ? 2 : secs))  # at least 2 per-second rates after the first
  ip netns exec "$ns" timeout -s INT -k 5 $((tp + 3)) "$testpmd" --lcores=0@0,1@0 "${EAL[@]}" --file-prefix bdtx$$ \
    "${tx_dev[@]}" -- --forward-mode=txonly --txpkts=64 --stats-period=1 --total-num-mbufs=16384 >"$tmp/tx.log" 2>&1 &
  local txp=$!
  sleep 0.5
  ip netns exec "$ns" timeout -s INT -k 5 $((tp + 1)) "$testpmd" --lcores=0@1,1@1 "${EAL[@]}" --file-prefix bdrx$$ \
    "${rx_dev[@]}" -- --forward-mode=rxonly --stats-period=1 --total-num-mbufs=16384 >"$tmp/rx.log" 2>&1 || true
  wait "$txp" || true
  grep -ao 'Rx-pps: *[0-9]*' "$tmp/rx.log" | awk '{print $2}' | tail -n +2 | sort -n |
    awk '{a[NR]=$1} END {if (NR == 0) print 0; else print a[int((NR + 1) / 2)]}'
}
col() { awk -v c="$2" '$1 ~ /^[0-9]+$/ && NF >= 5 {print $c}' "$1" | tail -1; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR == 0) print 0; else print a[int((NR + 1) / 2)]}'; }
ok_all() { local f; for f in "$@"; do [ "$f" = ok ] || { echo FAILED; return; }; done; echo ok; }

port=18600
declare -A v ok
for r in $(seq 1 "$rounds"); do
  v[raw]+=" $(raw_pps)"
  droce_perf_run "$tmp/rawbw.log" 1 raw_ethernet_bw -s 64 -D "$secs"
  v[rawbw]+=" $(col "$tmp/rawbw.log" 4)"; ok[rawbw]+=" $(col "$tmp/rawbw.log" 5)"
  droce_perf_run "$tmp/w64.log" 1 write_bw -s 64 -D "$secs" -t 128 --window 128
  v[w64]+=" $(col "$tmp/w64.log" 4)"; ok[w64]+=" $(col "$tmp/w64.log" 5)"
  droce_perf_run "$tmp/w64m.log" 1 write_bw -s 64 -D "$secs" -t 128 --window 128 --cq-mod 32
  v[w64m]+=" $(col "$tmp/w64m.log" 4)"; ok[w64m]+=" $(col "$tmp/w64m.log" 5)"
  droce_perf_run "$tmp/s64.log" 1 send_bw -s 64 -D "$secs" -t 128 --window 128 --cq-mod 32
  v[s64]+=" $(col "$tmp/s64.log" 4)"; ok[s64]+=" $(col "$tmp/s64.log" 5)"
  droce_perf_run "$tmp/r64.log" 1 read_bw -s 64 -D "$secs" -t 128 --window 128
  v[r64]+=" $(col "$tmp/r64.log" 4)"; ok[r64]+=" $(col "$tmp/r64.log" 5)"
  droce_perf_run "$tmp/w64k.log" 1 write_bw -s 65536 -D "$secs" -t 32 -m "$mtu" --window 256 --zero-copy-min 1024
  v[w64k]+=" $(col "$tmp/w64k.log" 3)"; ok[w64k]+=" $(col "$tmp/w64k.log" 5)"
  droce_perf_run "$tmp/w64kc.log" 1 write_bw -s 65536 -D "$secs" -t 32 -m "$mtu" --window 256 --zero-copy-min 0
  v[w64kc]+=" $(col "$tmp/w64kc.log" 3)"; ok[w64kc]+=" $(col "$tmp/w64kc.log" 5)"
  droce_perf_run "$tmp/w64q2.log" 2 write_bw -s 64 -D "$secs" -q 4 -t 128 --window 128
  v[q2]+=" $(col "$tmp/w64q2.log" 4)"; ok[q2]+=" $(col "$tmp/w64q2.log" 5)"
  v[memcpy]+=" $("$build/test/bench/bench_memcpy" 65536 1 | awk '{print $(NF-1)}')"
  # Latency: one run of each per round (a pair of processes falls into a mode of
  # its own: lib/transport/README.md, fifteenth session). Columns: size iters
  # t_min t_max t_typical t_avg p99 p99.9 result.
  droce_perf_run "$tmp/lat.log" 1 write_lat -s 8 -n 20000
  v[lat]+=" $(awk '$1 == 8 && NF >= 8 {print $5}' "$tmp/lat.log" | tail -1)"
  v[lat99]+=" $(awk '$1 == 8 && NF >= 8 {print $7}' "$tmp/lat.log" | tail -1)"
  droce_perf_run "$tmp/slat.log" 1 send_lat -s 8 -n 20000
  v[slat]+=" $(awk '$1 == 8 && NF >= 8 {print $5}' "$tmp/slat.log" | tail -1)"
  droce_perf_run "$tmp/rawlat.log" 1 raw_ethernet_lat -s 64 -n 20000
  v[rawlat]+=" $(awk '$1 == 64 && NF >= 8 {print $5}' "$tmp/rawlat.log" | tail -1)"
  v[rawlat99]+=" $(awk '$1 == 64 && NF >= 8 {print $7}' "$tmp/rawlat.log" | tail -1)"
done
raw=$(median <<<"${v[raw]}"); rawbw=$(median <<<"${v[rawbw]}")
w64=$(median <<<"${v[w64]}"); w64m=$(median <<<"${v[w64m]}"); s64=$(median <<<"${v[s64]}"); r64=$(median <<<"${v[r64]}")
w64k=$(median <<<"${v[w64k]}"); w64kc=$(median <<<"${v[w64kc]}")
q2=$(median <<<"${v[q2]}"); mc=$(median <<<"${v[memcpy]}")
lat=$(median <<<"${v[lat]}"); slat=$(median <<<"${v[slat]}"); rawlat=$(median <<<"${v[rawlat]}")
lat99=$(median <<<"${v[lat99]}"); rawlat99=$(median <<<"${v[rawlat99]}")
# The spread: each round's droce figure over the same round's baseline, lowest
# and highest ("a-b"), next to the ratio of the medians.
spread() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    n = split(a, x, " "); split(b, y, " "); k = 0
    for (i = 1; i <= n; ++i) if (x[i] > 0 && y[i] > 0) { r = x[i] / y[i]; if (k == 0 || r < lo) lo = r; if (k == 0 || r > hi) hi = r; ++k }
    if (k == 0) print "n/a"; else if (k == 1) printf "%.2f", lo; else printf "%.2f-%.2f", lo, hi }'
}
v[rawm]=$(for x in ${v[raw]}; do awk -v x="$x" 'BEGIN {print x / 1e6}'; done | tr '\n' ' ')  # Mpps, as droce's
declare -A sp
for pair in rawbw:rawm w64:rawbw w64:rawm w64m:rawm s64:rawm r64:rawm w64k:memcpy w64kc:memcpy w64k:w64kc q2:w64 lat:rawlat slat:rawlat lat99:rawlat99; do
  sp[$pair]=$(spread "${v[${pair%:*}]}" "${v[${pair#*:}]}")
done
csv=$build/bench-dataplane-$ptype.csv
echo "port,case,droce,baseline,unit,ratio,data,round_ratios" >"$csv"
awk -v raw="$raw" -v m="$w64" -v ok="$(ok_all ${ok[w64]})" -v mm="$w64m" -v mmok="$(ok_all ${ok[w64m]})" \
    -v s64="$s64" -v s64ok="$(ok_all ${ok[s64]})" -v r64="$r64" -v r64ok="$(ok_all ${ok[r64]})" -v slat="${slat:-0}" \
    -v q2="$q2" -v q2ok="$(ok_all ${ok[q2]})" \
    -v g="$w64k" -v gok="$(ok_all ${ok[w64k]})" -v mc="$mc" -v gc="$w64kc" -v gcok="$(ok_all ${ok[w64kc]})" \
    -v lat="${lat:-0}" -v rawlat="${rawlat:-0}" -v lat99="${lat99:-0}" -v rawlat99="${rawlat99:-0}" -v pt="$ptype" -v mtu="$mtu" -v secs="$secs" -v rounds="$rounds" -v csv="$csv" \
    -v rawbw="$rawbw" -v rawbwok="$(ok_all ${ok[rawbw]})" \
    -v sp="${sp[rawbw:rawm]} ${sp[w64:rawbw]} ${sp[w64:rawm]} ${sp[w64m:rawm]} ${sp[s64:rawm]} ${sp[r64:rawm]} ${sp[w64k:memcpy]} ${sp[w64kc:memcpy]} ${sp[w64k:w64kc]} ${sp[q2:w64]} ${sp[lat:rawlat]} ${sp[slat:rawlat]} ${sp[lat99:rawlat99]}" '
function row(name, d, b, unit, fmt, okk,   ratio) {
  ratio = (b > 0 ? sprintf("%.3f", d / b) : "n/a")
  ++nrow
  printf "%-46s " fmt " %-5s " fmt " %-5s %7s %11s  (data %s)\n", name, d, unit, b, unit, ratio, spr[nrow], okk
  printf "%s,\"%s\",%s,%s,%s,%s,%s,%s\n", pt, name, d, b, unit, ratio, okk, spr[nrow] >> csv
}
BEGIN {
  split(sp, spr, " ")
  printf "== droce dataplane vs baselines (net_%s, 1 lcore per side, %s s runs, median of %s alternating rounds;\n", pt, secs, rounds
  printf "   \"rounds\": the lowest and highest of each round'"'"'s droce figure over the same round'"'"'s baseline)\n"
  printf "%-46s %17s %17s %7s %11s\n", "case", "droce", "baseline", "ratio", "rounds"
  row("64 B frames: droce-perf raw_ethernet_bw vs testpmd", rawbw, raw / 1e6, "Mpps", "%11.4f", rawbwok)
  row("64 B RC WRITE rate vs raw_ethernet_bw", m, rawbw, "Mpps", "%11.4f", ok)
  row("64 B RC WRITE rate vs testpmd 64 B rx rate", m, raw / 1e6, "Mpps", "%11.4f", ok)
  row("64 B RC WRITE, 1 WR in 32 signaled, vs testpmd", mm, raw / 1e6, "Mpps", "%11.4f", mmok)
  row("64 B RC SEND, 1 WR in 32 signaled, vs testpmd", s64, raw / 1e6, "Mpps", "%11.4f", s64ok)
  row("64 B RC READ rate vs testpmd 64 B rx rate", r64, raw / 1e6, "Mpps", "%11.4f", r64ok)
  row("64 KiB RC WRITE (MTU " mtu ", zero-copy) vs memcpy", g, mc, "Gb/s", "%11.3f", gok)
  row("64 KiB RC WRITE (MTU " mtu ", copy) vs memcpy", gc, mc, "Gb/s", "%11.3f", gcok)
  row("64 KiB WRITE zero-copy vs copy path", g, gc, "Gb/s", "%11.3f", (gok == "ok" && gcok == "ok") ? "ok" : "FAILED")
  row("64 B WRITE, 2 queues (4 QPs) vs 1 queue", q2, m, "Mpps", "%11.4f", q2ok)
  row("8 B WRITE half RTT vs raw 64 B frame ping-pong", lat, rawlat, "us", "%11.2f", (lat > 0 && rawlat > 0) ? "ok" : "FAILED")
  row("8 B SEND half RTT vs raw 64 B frame ping-pong", slat, rawlat, "us", "%11.2f", (slat > 0 && rawlat > 0) ? "ok" : "FAILED")
  row("8 B WRITE p99 half RTT vs raw 64 B frame p99", lat99, rawlat99, "us", "%11.2f", (lat99 > 0 && rawlat99 > 0) ? "ok" : "FAILED")
}'
echo "  (csv: $csv)"
if [ "$ptype" = af_packet ]; then
  echo "  (net_af_packet: every frame crosses the kernel (a sendto/recv per burst on a veth), which caps both droce and testpmd; the memif mode shows the stack's own cost)"
fi
grep -E 'transport:' "$tmp/w64.log" | sed 's/^/  64 B run:   /' || true
grep -E 'transport:' "$tmp/r64.log" | sed 's/^/  64 B READ:  /' || true
grep -E 'transport:' "$tmp/w64k.log" | sed 's/^/  64 KiB run: /' || true
grep -E 'transport:' "$tmp/w64kc.log" | sed 's/^/  64 KiB copy: /' || true

[ "${BENCH_SWEEP:-1}" = 0 ] && exit 0
# ---- sweeps for the plots (one run each; scripts/plot_bench.py draws them)
secs_saved=$secs
secs=20  # droce_perf_run's timeout is secs + 30: the -a sweeps run 16 sizes of 1 s
droce_perf_run "$tmp/size.log" 1 write_bw -a --max-size 65536 -D 1 -t 128 --window 128 -m "$mtu"
echo "port,size,mpps,gbps,data" >"$build/bench-size-$ptype.csv"
awk -v pt="$ptype" '$1 ~ /^[0-9]+$/ && NF >= 5 {printf "%s,%s,%s,%s,%s\n", pt, $1, $4, $3, $5}' "$tmp/size.log" \
  >>"$build/bench-size-$ptype.csv"
droce_perf_run "$tmp/lat-a.log" 1 write_lat -a --max-size 4096 -n 5000 -m "$mtu"
echo "port,kind,size,min,typical,p99,p999,data" >"$build/bench-lat-$ptype.csv"
# latency columns: size iters t_min t_max t_typical t_avg p99 p99.9 result
awk -v pt="$ptype" '$1 ~ /^[0-9]+$/ && NF >= 9 {printf "%s,droce,%s,%s,%s,%s,%s,%s\n", pt, $1, $3, $5, $7, $8, $9}' \
  "$tmp/lat-a.log" >>"$build/bench-lat-$ptype.csv"
for sz in 64 256 1024; do
  droce_perf_run "$tmp/rawlat-$sz.log" 1 raw_ethernet_lat -s "$sz" -n 5000
  awk -v pt="$ptype" '$1 ~ /^[0-9]+$/ && NF >= 9 {printf "%s,raw,%s,%s,%s,%s,%s,%s\n", pt, $1, $3, $5, $7, $8, $9}' \
    "$tmp/rawlat-$sz.log" >>"$build/bench-lat-$ptype.csv"
done
secs=$secs_saved
# QP-count scaling (issue 12: the 64 B rate at 16, 256 and 4096 QPs, and 64K
# active QPs against one): one QP with 128 WRs in flight, N QPs with 32 each
# (perftest's -t with -q: --tx-depth-per-qp), 64K QPs with 2 each (the least
# droce-perf takes; their send queues and slots fit its 256 MiB). With that
# many messages in flight a message waits for all the others ahead of it
# (Little's law: 131072 in flight at 1 M/s is 131 ms), longer than the
# default ACK timeout (14: 67 ms), so every run takes --qp-timeout 18 (1.07 s).
# On af_packet the sweep stops at 256 QPs: with 4096 QPs x 32 WRs the kernel
# drops a third of the ACKs on their way to the sender (689211 sent, 459003
# received in a 3 s run, 2026-12-06) and some requests; the QPs time out
# (30883 ACK timeouts in that run) and some end in RETRY_EXC_ERR.
counts=(1 16 256 4096 65536)
[ "$ptype" = af_packet ] && counts=(1 16 256)
echo "port,qps,wrs_per_qp,mpps,ratio_to_1qp,data" >"$build/bench-qps-$ptype.csv"
declare -A qv qok
for r in $(seq 1 "$rounds"); do  # rounds alternate the QP counts; each row is the median
  for nq in "${counts[@]}"; do
    case $nq in 1) t=(-t 128) ;; 65536) t=(-t 2 --tx-depth-per-qp) ;; *) t=(-t 32 --tx-depth-per-qp) ;; esac
    droce_perf_run "$tmp/qps-$nq.log" 1 write_bw -s 64 -D "$secs" -q "$nq" "${t[@]}" --window 128 --qp-timeout 18
    m=$(col "$tmp/qps-$nq.log" 4)
    case "$m" in '' | *nan*) m=0 ;; esac
    qv[$nq]+=" $m"
    qok[$nq]+=" $(col "$tmp/qps-$nq.log" 5)"
  done
done
one=$(echo "${qv[1]}" | median)
for nq in "${counts[@]}"; do
  depth=$([ "$nq" = 1 ] && echo 128 || { [ "$nq" = 65536 ] && echo 2 || echo 32; })
  mpps=$(echo "${qv[$nq]}" | median)
  # shellcheck disable=SC2086
  qp_ok=$(ok_all ${qok[$nq]})
  ratio=$(awk -v a="$mpps" -v b="$one" 'BEGIN {printf "%.2f", (b > 0) ? a / b : 0}')
  echo "$ptype,$nq,$depth,$mpps,$ratio,$qp_ok" >>"$build/bench-qps-$ptype.csv"
  printf '  64 B WRITE over %5d QPs (%3d WRs each): %8.3f Mpps  x%s of one QP (median of %s)  %s\n' "$nq" "$depth" "$mpps" "$ratio" "$rounds" "$qp_ok"
done
echo "  (sweeps: $build/bench-size-$ptype.csv, bench-lat-$ptype.csv, bench-qps-$ptype.csv; scripts/plot_bench.py draws them)"

#!/usr/bin/env bash
# Raw packet rate through DpdkQueueIo against DPDK's own dpdk-testpmd on the
# same port type, in one run:
#   1. net_ring pair in one process (bench_port ring): DpdkQueueIo vs the
#      plain ethdev API, same loop, same ports.
#   2. net_af_packet on a veth pair inside a network namespace of its own:
#      sender process on CPU 0, receiver process on CPU 1; every combination of
#      testpmd (txonly / rxonly) and bench_port (tx / rx), rate at the receiver.
#      testpmd -> testpmd is the baseline; the ratios say what DpdkQueueIo costs.
#   bench_port.sh BUILD_DIR [SECONDS-PER-RUN]
set -euo pipefail
build=$1
secs=${2:-4}
case "$secs" in ''|*[!0-9]*) echo "SECONDS must be a whole number >= 2" >&2; exit 2 ;; esac
[ "$secs" -ge 2 ] || { echo "SECONDS must be >= 2 (the receiver skips its first second)" >&2; exit 2; }
bench=$build/test/bench/bench_port
testpmd=$(command -v dpdk-testpmd || true)
ns=droce-b-$$
tmp=$(mktemp -d)
cleanup() {
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

echo "== net_ring pair, one process, one core (best of 10 alternating rounds)"
for size in 64 1024; do
  timeout -k 5 60 "$bench" ring "$size" "$secs" 2>/dev/null | grep -v '^TELEMETRY'
done

if [ -z "$testpmd" ]; then echo "dpdk-testpmd not found (package dpdk): skipping the veth comparison"; exit 0; fi
ip netns add "$ns"
ip -n "$ns" link add va type veth peer name vb
for d in va vb; do
  ip netns exec "$ns" sysctl -qw "net.ipv6.conf.$d.disable_ipv6=1"
  ip -n "$ns" link set "$d" up
done

EAL_COMMON=(--in-memory --no-pci --log-level=lib.eal:error)
# receiver: prints the receive rate in packets/s
rx_testpmd() {
  ip netns exec "$ns" timeout -s INT -k 5 $((secs + 2)) "$testpmd" --lcores=0@1,1@1 "${EAL_COMMON[@]}" \
    --vdev "$RX_DEV" -- --forward-mode=rxonly --stats-period=1 --total-num-mbufs=8192 \
    >"$tmp/rx.log" 2>&1 || true
  # Per-second samples; keep seconds 2..secs (warm-up before, sender gone
  # after), take the median.
  grep -ao 'Rx-pps: *[0-9]*' "$tmp/rx.log" | awk '{print $2}' | sed -n "2,${secs}p" | sort -n |
    awk '{a[NR]=$1} END {if (NR == 0) print 0; else print a[int((NR + 1) / 2)]}'
}
rx_droce() {
  ip netns exec "$ns" timeout -k 5 $((secs + 10)) "$bench" rx "$RX_DEV" "$secs" 2 -- --lcores=0@1 \
    "${EAL_COMMON[@]}" 2>/dev/null >"$tmp/rx.log" || true
  awk '/^rx / {printf "%d\n", $(NF-3) * 1e6}' "$tmp/rx.log"
}
tx_testpmd() {
  ip netns exec "$ns" timeout -s INT -k 5 $((secs + 1)) "$testpmd" --lcores=0@0,1@0 "${EAL_COMMON[@]}" \
    --vdev "$TX_DEV" -- --forward-mode=txonly --txpkts="$1" --stats-period=1 \
    --total-num-mbufs=8192 >"$tmp/tx.log" 2>&1 || true
}
tx_droce() {
  ip netns exec "$ns" timeout -k 5 $((secs + 10)) "$bench" tx "$TX_DEV" "$1" $((secs + 1)) -- \
    --lcores=0@0 "${EAL_COMMON[@]}" >"$tmp/tx.log" 2>/dev/null || true
}
# run TX RX SIZE: the sender starts 0.5 s before the receiver and stops
# (secs + 0.5 s into the receiver's run) before it: a memif server crashes
# when its client leaves during traffic (DPDK-NOTES.md).
run() {
  local out
  "tx_$1" "$3" &
  local txpid=$!
  sleep 0.5
  out=$("rx_$2")
  wait "$txpid" || true
  echo "${out:-0}"
}

reps=${DROCE_BENCH_REPS:-3}
max() { if [ "$1" -gt "$2" ]; then echo "$1"; else echo "$2"; fi; }
# table TITLE: every pairing for 64 and 1024 B on TX_DEV -> RX_DEV
table() {
  echo "== $1, 2 processes (sender CPU 0, receiver CPU 1), Mpps at the receiver,"
  echo "   best of $reps interleaved runs of ${secs} s (the machine is shared: single runs swing widely)"
  printf '%-7s %-16s %-24s %-24s %-24s\n' size "testpmd->testpmd" "testpmd->DpdkQueueIo" "DpdkQueueIo->testpmd" \
    "DpdkQueueIo->DpdkQueueIo"
  for size in 64 1024; do
    a=0 b=0 c=0 d=0
    for _ in $(seq 1 "$reps"); do
      a=$(max "$a" "$(run testpmd testpmd "$size")")
      b=$(max "$b" "$(run testpmd droce "$size")")
      c=$(max "$c" "$(run droce testpmd "$size")")
      d=$(max "$d" "$(run droce droce "$size")")
    done
    awk -v s="$size" -v a="$a" -v b="$b" -v c="$c" -v d="$d" 'function cell(x) {
        if (a > 0) return sprintf("%.3f (ratio %.2f)", x / 1e6, x / a); return sprintf("%.3f", x / 1e6) }
      BEGIN { printf "%-7s %-16s %-24s %-24s %-24s\n", s " B", sprintf("%.3f", a / 1e6), cell(b), cell(c), cell(d) }'
  done
}

TX_DEV=net_af_packet0,iface=va RX_DEV=net_af_packet0,iface=vb table "net_af_packet on a veth pair"
# memif: the sender is the server (it starts first), the receiver connects.
TX_DEV=net_memif0,role=server,socket=$tmp/memif.sock RX_DEV=net_memif0,role=client,socket=$tmp/memif.sock \
  table "net_memif (copy mode)"

#!/usr/bin/env bash
# NVMe-oF over droce against raw droce, one run, same port type (net_memif
# between two processes in a namespace of their own, one lcore each: target
# or server on CPU 1, host or client on CPU 0), lib/nvmf/README.md "Figures":
#   raw:  droce-perf read_bw / write_bw -s 4096 (message rate, -t 32) and
#         read_lat / write_lat -s 4096 (typical and 99%; write_lat is half a
#         round trip as in perftest, so its round trip is twice it);
#   nvmf: droce-nvmf-perf against droce-nvmf (RAM namespace, cores = CORES,
#         default 1; with 2, loop 1 on a thread of its own and the host with
#         2 I/O queues over 2 memif queue pairs),
#         4 KiB randread and randwrite at QD 1 and QD 32: IOPS, p50, p99, p99.9.
# Prints the table with the ratios (nvmf IOPS at QD 32 / raw message rate;
# nvmf p50 at QD 1 / raw round trip) and writes CSV (metric,value) to
# $DROCE_BENCH_CSV or BUILD_DIR/bench_nvmf.csv.
#   bench_nvmf.sh BUILD_DIR [SECONDS] [CORES]
set -uo pipefail
build=$1
secs=${2:-3}
cores=${3:-1}
hostq=()
[ "$cores" -gt 1 ] && hostq=(--queues "$cores" --io-queues "$cores")
perf=$build/app/droce-perf/droce-perf
tgt=$build/app/droce-nvmf/droce-nvmf
nperf=$build/app/droce-nvmf-perf/droce-nvmf-perf
csv=${DROCE_BENCH_CSV:-$build/bench_nvmf.csv}
ns=droce-bn-$$
sock=/tmp/droce-bench-nvmf-$$.sock
tmp=$(mktemp -d)
bg=
cleanup() {
  if [ -n "$bg" ]; then kill -TERM "$bg" 2>/dev/null; wait "$bg" 2>/dev/null; fi
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$tmp" "$sock"
}
trap cleanup EXIT INT TERM
for b in "$perf" "$tgt" "$nperf"; do [ -x "$b" ] || { echo "bench_nvmf: $b not built"; exit 1; }; done
ip netns add "$ns" || { echo "bench_nvmf: cannot create network namespace $ns"; exit 1; }
ip -n "$ns" link set lo up
EAL=(--in-memory --no-pci --log-level=lib.eal:error --log-level=pmd.net.memif:error)
SRV="role=server,socket=$sock,id=7,mac=02:00:0a:17:00:02"
CLI="role=client,socket=$sock,id=7,mac=02:00:0a:17:00:01"

# client_retry LOG CMD...: the memif client fails its start when its first connect() is refused.
client_retry() {
  local log=$1 a
  shift
  for a in 1 2 3; do
    ip netns exec "$ns" timeout -k 5 $((secs + 60)) "$@" >"$log" 2>&1 && return 0
    grep -q "Failed to connect socket" "$log" || return 1
    sleep 0.5
  done
  return 1
}

port=18800
raw() {  # raw NAME droce-perf-args...: server in the background, client, both must pass
  local name=$1
  shift
  port=$((port + 1))
  : >"$tmp/$name.srv"
  ip netns exec "$ns" timeout -k 5 $((secs + 60)) "$perf" "$@" -p "$port" --device "net_memif0,$SRV" --ip 10.23.0.2 \
    -- --lcores=0@1 "${EAL[@]}" >"$tmp/$name.srv" 2>&1 &
  bg=$!
  for _ in $(seq 1 100); do grep -q 'waiting for the client' "$tmp/$name.srv" && break; sleep 0.1; done
  client_retry "$tmp/$name.log" "$perf" "$@" 127.0.0.1 -p "$port" --device "net_memif1,$CLI" --ip 10.23.0.1 \
    -- --lcores=0@0 "${EAL[@]}" || echo "bench_nvmf: droce-perf $name failed" >&2
  wait "$bg" || true
  bg=
}
raw read_bw read_bw -s 4096 -D "$secs" -t 32
raw write_bw write_bw -s 4096 -D "$secs" -t 32
raw read_lat read_lat -s 4096 -n 20000
raw write_lat write_lat -s 4096 -n 20000

# droce-nvmf with a RAM namespace (cores = 1: the figures' configuration).
cat >"$tmp/nvmf.toml" <<TOML
[nvmf]
port = 4420
cores = $cores
max_queue_depth = 128
max_io_queues = 4
in_capsule_data = 8192
mdts = 4
[[nvmf.subsystem]]
nqn = "nqn.2026-12.org.droce:bench"
serial = "DROCEBENCH"
allow_any_host = true
[[nvmf.subsystem.namespace]]
nsid = 1
backend = "ram"
size = "256MiB"
block_size = 512
TOML
ip netns exec "$ns" timeout -k 5 600 "$tgt" -c "$tmp/nvmf.toml" --device "net_memif0,$SRV" --ip 10.23.0.2 \
  -- --lcores=0@1 "${EAL[@]}" >"$tmp/target.log" 2>&1 &
bg=$!
for _ in $(seq 1 200); do grep -q 'listening on' "$tmp/target.log" && break; sleep 0.1; done
grep -q 'listening on' "$tmp/target.log" || { echo "bench_nvmf: droce-nvmf did not start"; cat "$tmp/target.log"; exit 1; }
for w in randread randwrite; do
  for qd in 1 32; do
    client_retry "$tmp/$w-$qd.log" "$nperf" -a 10.23.0.2 -n nqn.2026-12.org.droce:bench -w "$w" -q "$qd" -o 4096 \
      -t "$secs" "${hostq[@]}" --device "net_memif1,$CLI" --ip 10.23.0.1 -- --lcores=0@0 "${EAL[@]}" ||
      echo "bench_nvmf: droce-nvmf-perf $w qd $qd failed" >&2
  done
done
kill -TERM "$bg"; wait "$bg" || echo "bench_nvmf: droce-nvmf did not exit 0" >&2
bg=

bwcol() { awk -v c="$2" '$1 ~ /^[0-9]+$/ && NF >= 5 {print $c}' "$1" 2>/dev/null | tail -1; }
latcol() { awk -v c="$2" '$1 ~ /^[0-9]+$/ && NF >= 9 {print $c}' "$1" 2>/dev/null | tail -1; }
nv() {  # nv LOG FIELD: IOPS, p50, p99, p99.9 from "IOPS N ... latency us: ... p50 N p99 N p99.9 N"
  awk -v f="$2" '/IOPS/ { for (i = 1; i < NF; i++) if ($i == f) print $(i + 1) }' "$1" 2>/dev/null | tail -1
}
rb=$(bwcol "$tmp/read_bw.log" 4); wb=$(bwcol "$tmp/write_bw.log" 4)
rl=$(latcol "$tmp/read_lat.log" 5); rl99=$(latcol "$tmp/read_lat.log" 7)
wl=$(latcol "$tmp/write_lat.log" 5); wl99=$(latcol "$tmp/write_lat.log" 7)
{
  echo "metric,value"
  echo "raw_read_4k_mpps,${rb:-}"
  echo "raw_write_4k_mpps,${wb:-}"
  echo "raw_read_lat_typical_us,${rl:-}"
  echo "raw_read_lat_p99_us,${rl99:-}"
  echo "raw_write_lat_half_rtt_typical_us,${wl:-}"
  echo "raw_write_lat_half_rtt_p99_us,${wl99:-}"
  for w in randread randwrite; do
    for qd in 1 32; do
      for f in IOPS p50 p99 p99.9; do echo "nvmf_${w}_qd${qd}_${f},$(nv "$tmp/$w-$qd.log" "$f")"; done
    done
  done
} >"$csv"
echo "== NVMe-oF (droce-nvmf, RAM namespace, cores = $cores) vs raw droce, 4 KiB, net_memif, 1 lcore per side, ${secs} s runs, same run"
awk -F, '
  NR > 1 { v[$1] = $2 }
  function r(a, b) { return (a + 0 > 0 && b + 0 > 0) ? sprintf("%.2f", a / b) : "n/a" }
  END {
    printf "  raw droce  READ  4 KiB: %8.0f msg/s   round trip typical %7s us  p99 %7s us\n", v["raw_read_4k_mpps"] * 1e6, v["raw_read_lat_typical_us"], v["raw_read_lat_p99_us"]
    printf "  raw droce  WRITE 4 KiB: %8.0f msg/s   round trip typical %7.2f us  (2 x write_lat)\n", v["raw_write_4k_mpps"] * 1e6, v["raw_write_lat_half_rtt_typical_us"] * 2
    for (k = 0; k < 2; k++) {
      w = k == 0 ? "randread" : "randwrite"
      raw_rate = (k == 0 ? v["raw_read_4k_mpps"] : v["raw_write_4k_mpps"]) * 1e6
      raw_rtt = k == 0 ? v["raw_read_lat_typical_us"] : v["raw_write_lat_half_rtt_typical_us"] * 2
      printf "  nvmf %-9s QD1 : %8s IOPS  p50 %7s us  p99 %7s us  p99.9 %7s us   p50 / raw round trip = %s\n", w, v["nvmf_" w "_qd1_IOPS"], v["nvmf_" w "_qd1_p50"], v["nvmf_" w "_qd1_p99"], v["nvmf_" w "_qd1_p99.9"], r(v["nvmf_" w "_qd1_p50"], raw_rtt)
      printf "  nvmf %-9s QD32: %8s IOPS  p50 %7s us  p99 %7s us  p99.9 %7s us   IOPS / raw msg rate = %s\n", w, v["nvmf_" w "_qd32_IOPS"], v["nvmf_" w "_qd32_p50"], v["nvmf_" w "_qd32_p99"], v["nvmf_" w "_qd32_p99.9"], r(v["nvmf_" w "_qd32_IOPS"], raw_rate)
    }
  }' "$csv"
echo "  CSV: $csv"

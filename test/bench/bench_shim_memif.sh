#!/usr/bin/env bash
# The verbs shim against the embedding API on the fast path (net_memif), same
# run, alternating rounds (bench_shim_engine.sh BUILD memif runs this).
#   bench_shim_memif.sh BUILD_DIR [SECONDS] [ROUNDS]
#
# The configuration, and why. This machine has two CPUs, and the goal is the
# shim "when the program and the daemon each have a CPU":
#   shim:     ONE droced, one dataplane core on CPU 1, owning two net_memif
#             ports joined to each other (devices droce0 and droce1; every
#             frame crosses the memif rings: the same-port loopback is not
#             used); Debian's perftest through the drop-in libibverbs.so.1,
#             server on droce0, client on droce1, both programs on CPU 0.
#             ib_write_bw's server only waits on its TCP socket; the latency
#             tests' two programs share CPU 0 and poll their CQs (the front
#             yields the CPU after 64 empty polls).
#   embedded: droce-perf's two processes on the same memif setting (bsize
#             8192, MTU 1024, window 64 as droced's), client on CPU 0, server
#             on CPU 1; the program posts to the engine it polls itself.
# Both use the same two CPUs for the whole transfer, but split it
# differently: the droced core runs both transport ends (requester and
# responder, plus the shim's ring poller) where the embedded client's core
# runs the program and the requester and the server's core the responder.
# So the shim's figure here is a floor of what it reaches with a third CPU
# for the peer (a real deployment: the peer is another host).
# Cases (ROUNDS rounds, embedded and shim alternating, droced started afresh
# for each shim case; medians and [min-max] printed, CSV in
# BUILD_DIR/bench-shim-memif.csv):
#   64 B RC WRITE rate   ib_write_bw -s 64 -t 128 -D S   vs droce-perf write_bw -s 64 -t 128 -D S
#   8 B SEND latency     ib_send_lat -s 8                vs droce-perf send_lat -s 8
#   8 B WRITE latency    ib_write_lat -s 8               vs droce-perf write_lat -s 8
#     (ib_write_lat spins on memory and never calls ibv_poll_cq: its two
#     programs on one CPU run in the scheduler's time slices; printed, not a
#     measure of the shim)
# Latency is the typical half round trip (t_typical), as perftest prints it.
# A/B runs: BENCH_DROCED / BENCH_FRONT name another droced binary / drop-in
# directory; BENCH_CASES picks cases (default "bw sl wl"); BENCH_NO_EMBEDDED=1
# skips the embedded runs (their columns then read 0).
# BENCH_SHIM_PERF=DIR: also `perf record` droced and the ib_write_bw client
# during the first shim round (DIR/droced.data, DIR/client.data).
# BENCH_IDLE_QPS=N: during each shim case a third program (idle_qps, through
# the same drop-in) holds N idle RC QPs open on droce0, served by the same
# droced core: the ring poller's cost per idle QP (lib/shim/README.md, "The
# doorbell").
set -uo pipefail
build=$1
secs=${2:-3}
rounds=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
perf=$build/app/droce-perf/droce-perf
droced=${BENCH_DROCED:-$build/app/droced/droced}
idle_qps=${BENCH_IDLE_QPS:-0}
idle_bin=$build/test/shim/idle_qps
ctlbin=$build/app/droce-ctl/droce-ctl
front=${BENCH_FRONT:-$build/lib/shim/front}
cases=${BENCH_CASES:-bw sl wl}
ns=droce-bsm-$$
tmp=$(mktemp -d)
dpid=
ipid=
cleanup() {
  [ -n "$ipid" ] && { kill -TERM "$ipid" 2>/dev/null; wait "$ipid" 2>/dev/null; }
  [ -n "$dpid" ] && { kill -TERM "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; }
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: cannot create network namespace $ns"; exit 0; fi
ip -n "$ns" link set lo up
source "$here/../lib/netns.sh"
EAL=(--in-memory --no-pci --log-level=lib.eal:error --log-level=pmd.net.memif:error)
export MEMIF_SOCK=/droce-bsm-$$.sock MEMIF_ARGS=",bsize=8192"
port=18800

# droced: two memif ports joined to each other, one core (lcore 1 on CPU 1).
cat >"$tmp/d.toml" <<TOML
[eal]
args = ["--in-memory", "--no-pci", "--log-level=lib.eal:error", "--log-level=pmd.net.memif:error"]
lcores = "0@0,1@1"
main_lcore = 0

[[port]]
name = "ma"
device = "net_memif0,role=server,socket=/droce-bsm-$$-d.sock,id=7,mac=02:00:0a:33:00:01,bsize=8192"
ipv4 = ["10.51.0.1/24"]

[[port]]
name = "mb"
device = "net_memif1,role=client,socket=/droce-bsm-$$-d.sock,id=7,mac=02:00:0a:33:00:02,bsize=8192"
ipv4 = ["10.51.0.2/24"]

[[core]]
lcore = 1
queues = [{ port = "ma", rx = 0 }, { port = "mb", rx = 0 }]

[roce]
mr_memory_mb = 64

[control]
socket = "$tmp/ctl.sock"
mode = "0600"

[shim]
socket = "$tmp/verbs.sock"
mode = "0600"
max_qps_per_client = 1024

[log]
level = "info"
TOML
droced_up() {
  rm -f "$tmp/verbs.sock"
  : >"$tmp/d.log"
  ip netns exec "$ns" timeout -k 5 $((secs + 120)) "$droced" --config "$tmp/d.toml" >"$tmp/d.log" 2>&1 &
  dpid=$!
  local _
  for _ in $(seq 150); do
    [ -S "$tmp/verbs.sock" ] && grep -q running "$tmp/d.log" && return 0
    kill -0 "$dpid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$tmp/d.log"
  return 1
}
droced_down() {
  [ -n "$dpid" ] || return 0
  kill -TERM "$dpid" 2>/dev/null
  wait "$dpid" 2>/dev/null
  dpid=
}
# shim_pair OUT TOOL ARGS...: perftest server on droce0, client on droce1,
# both on CPU 0, through a droced started for this case; the client's output in OUT.
shim_pair() {
  local out=$1; shift
  port=$((port + 1))
  : >"$out"
  droced_up || return 0
  local env=(env LD_LIBRARY_PATH="$front" DROCE_SOCKET="$tmp/verbs.sock")
  if [ "$idle_qps" -gt 0 ]; then
    ip netns exec "$ns" "${env[@]}" taskset -c 0 timeout $((secs + 120)) "$idle_bin" droce0 "$idle_qps" \
      >"$tmp/idle.log" 2>&1 &
    ipid=$!
    local _i
    for _i in $(seq 200); do
      grep -q ready "$tmp/idle.log" && break
      kill -0 "$ipid" 2>/dev/null || break
      sleep 0.05
    done
    grep -q ready "$tmp/idle.log" || { echo "idle_qps: $(cat "$tmp/idle.log")" >&2; }
  fi
  ip netns exec "$ns" "${env[@]}" taskset -c 0 timeout $((secs + 60)) "$@" -d droce0 -x 1 -p "$port" \
    >"$tmp/ps.log" 2>&1 &
  local sp=$! _
  for _ in $(seq 100); do
    [ -n "$(ip netns exec "$ns" ss -Htln "sport = :$port" 2>/dev/null)" ] && break
    sleep 0.05
  done
  if [ -n "${BENCH_SHIM_PERF:-}" ] && [ "$1" = ib_write_bw ] && [ ! -e "$BENCH_SHIM_PERF/droced.data" ]; then
    perf record -q -g -o "$BENCH_SHIM_PERF/droced.data" -p "$(pgrep -P "$dpid" droced | head -1)" -- sleep "$secs" \
      >/dev/null 2>&1 &
    local pp=$!
    ip netns exec "$ns" "${env[@]}" taskset -c 0 timeout $((secs + 60)) perf record -q -g \
      -o "$BENCH_SHIM_PERF/client.data" -- "$@" -d droce1 -x 1 -p "$port" localhost >"$out" 2>&1
    wait "$pp" 2>/dev/null
  else
    ip netns exec "$ns" "${env[@]}" taskset -c 0 timeout $((secs + 60)) "$@" -d droce1 -x 1 -p "$port" localhost \
      >"$out" 2>&1
  fi
  wait "$sp"
  # Frames that crossed the memif pair (droce0's port), for the report.
  "$ctlbin" -s "$tmp/ctl.sock" counters --get port.ma.rx_packets >"$tmp/frames" 2>/dev/null || true
  if [ -n "$ipid" ]; then
    kill -TERM "$ipid" 2>/dev/null
    wait "$ipid" 2>/dev/null
    ipid=
  fi
  droced_down
}
col() { [ -f "$1" ] && awk -v c="$2" '$1 ~ /^[0-9]+$/ && NF >= 5 {print $c}' "$1" | tail -1; }
stats() {  # median and range of the space-separated values on stdin
  tr ' ' '\n' | grep -v '^$' | sort -g |
    awk '{a[NR]=$1} END {if (NR == 0) print "0 0 0"; else print a[int((NR + 1) / 2)], a[1], a[NR]}'
}

declare -A v
emb() { [ "${BENCH_NO_EMBEDDED:-0}" = 1 ] || droce_perf_run "$@"; }
has() { [[ " $cases " == *" $1 "* ]]; }
for r in $(seq 1 "$rounds"); do
  if has bw; then
    emb "$tmp/e-bw.log" 1 write_bw -s 64 -D "$secs" -t 128
    v[ebw]+=" $(col "$tmp/e-bw.log" 4)"
    shim_pair "$tmp/s-bw.log" ib_write_bw -s 64 -D "$secs" -t 128
    v[sbw]+=" $(col "$tmp/s-bw.log" 5)"
    [ "$r" = 1 ] && frames=$(cat "$tmp/frames" 2>/dev/null)
  fi
  if has sl; then
    emb "$tmp/e-sl.log" 1 send_lat -s 8 -n 20000
    v[esl]+=" $(col "$tmp/e-sl.log" 5)"
    shim_pair "$tmp/s-sl.log" ib_send_lat -s 8 -n 20000
    v[ssl]+=" $(col "$tmp/s-sl.log" 5)"
  fi
  if has wl; then
    emb "$tmp/e-wl.log" 1 write_lat -s 8 -n 20000
    v[ewl]+=" $(col "$tmp/e-wl.log" 5)"
    shim_pair "$tmp/s-wl.log" ib_write_lat -s 8 -n 2000
    v[swl]+=" $(col "$tmp/s-wl.log" 5)"
  fi
done
csv=$build/bench-shim-memif.csv
echo "case,shim,shim_min,shim_max,embedded,embedded_min,embedded_max,unit,ratio" >"$csv"
{
  for k in $cases; do echo "$k $(stats <<<"${v[s$k]}") $(stats <<<"${v[e$k]}")"; done
} | awk -v secs="$secs" -v rounds="$rounds" -v idle="$idle_qps" -v csv="$csv" -v frames="${frames:-?}" '
BEGIN {
  name["bw"] = "64 B RC WRITE message rate"; unit["bw"] = "Mpps"
  name["sl"] = "8 B SEND latency (typical half RTT)"; unit["sl"] = "us"
  name["wl"] = "8 B WRITE latency (typical half RTT)"; unit["wl"] = "us"
  printf "== verbs shim (perftest, separate process, one droced on CPU 1) vs embedding API (droce-perf), net_memif, %s s runs, median [min-max] of %s alternating rounds\n", secs, rounds
  if (idle > 0) printf "   (shim runs with %s idle QPs of a third program on the same droced core)\n", idle
  printf "%-38s %26s %26s %8s\n", "case", "shim", "embedded", "ratio"
}
{
  k = $1; u = unit[k]
  ratio = ($5 > 0 ? sprintf("%.3f", $2 / $5) : "n/a")
  rlabel = (k == "bw" ? "shim/emb" : "shim-emb")
  if (k != "bw") ratio = sprintf("%+.2f us", $2 - $5)
  printf "%-38s %8.3f [%.3f-%.3f] %-4s %8.3f [%.3f-%.3f] %-4s %s\n", name[k], $2, $3, $4, u, $5, $6, $7, u, (k == "bw" ? "x" ratio : ratio)
  printf "\"%s\",%s,%s,%s,%s,%s,%s,%s,%s\n", name[k], $2, $3, $4, $5, $6, $7, u, (k == "bw" ? ratio : $2 - $5) >> csv
}
END {
  printf "  (rate: shim / embedded; latency: shim - embedded. Frames received on droce0'"'"'s memif port in the first shim WRITE run: %s)\n", frames
  printf "  (the droced core runs both transport ends and the shim poller; the embedded pair splits them over the two CPUs: see test/bench/bench_shim_memif.sh)\n"
  printf "  (csv: %s)\n", csv
}'

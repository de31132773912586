#!/usr/bin/env bash
# Two droce-perf nodes, each an embedded droce node on net_af_packet bound to
# one end of a veth pair inside a network namespace of its own; the TCP
# exchange runs over the namespace's loopback. Runs each workload given as
# "TEST [droce-perf args...]" (separated by ';' in $DROCE_PERF_RUNS or the
# default set below), checks each one PASSes with its data verified.
#   perf_pair.sh PATH/TO/droce-perf [--faults "--fault-drop 0.01 ..."] [--queues N] [--qp-timeout T]
# The local ACK timeout is 4.096 us * 2^T: 14 (67 ms, perftest's default) unless
# faults are injected, where 12 (17 ms) keeps the many recoveries short.
set -euo pipefail
perf=$1; shift
faults=""
queues=1
qpto=""
while [ $# -gt 0 ]; do
  case $1 in
    --faults) faults=$2; shift 2 ;;
    --queues) queues=$2; shift 2 ;;
    --qp-timeout) qpto=$2; shift 2 ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
ns=droce-p-$$
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
ip -n "$ns" link set lo up
ip -n "$ns" link add va type veth peer name vb
for d in va vb; do
  ip netns exec "$ns" sysctl -qw "net.ipv6.conf.$d.disable_ipv6=1"
  ip -n "$ns" link set "$d" up
done
[ -z "$qpto" ] && { [ -n "$faults" ] && qpto=12 || qpto=14; }
EAL=(--in-memory --no-pci --log-level=lib.eal:error --log-level=pmd.net.af_packet:error)
qp=""
[ "$queues" -gt 1 ] && qp=",qpairs=$queues"
runs=${DROCE_PERF_RUNS:-"write_bw -s 4096 -n 2000 -q 2;read_bw -s 4096 -n 2000;send_bw -s 1024 -n 2000;atomic_bw -n 2000;write_lat -s 64 -n 300;send_lat -s 64 -n 300;read_lat -s 64 -n 300;atomic_lat -n 300"}
fails=0
port=18515
IFS=';' read -ra list <<<"$runs"
for run in "${list[@]}"; do
  read -ra args <<<"$run"
  port=$((port + 1))
  # net_af_packet derives its PACKET_FANOUT group id from pid ^ ifindex; two
  # processes whose ids clash cannot both probe ("Operation not permitted").
  # A restart gets a new pid: try up to 3 times on that error.
  # Every attempt logs to a file of its own: a log left by an earlier run or
  # attempt must never be mistaken for this server's "waiting" line.
  for attempt in 1 2 3; do
    slog=$tmp/server.$port.$attempt.log
    # shellcheck disable=SC2086
    ip netns exec "$ns" timeout -k 5 60 "$perf" "${args[@]}" -p "$port" --device "net_af_packet0,iface=vb$qp" \
      --ip 10.20.0.2 --mac 02:00:0a:14:00:02 --queues "$queues" --qp-timeout "$qpto" $faults -- --lcores=0@1 "${EAL[@]}" \
      >"$slog" 2>&1 &
    spid=$!
    pids=("$spid")
    for _ in $(seq 1 300); do
      grep -q 'waiting for the client' "$slog" 2>/dev/null && break
      kill -0 "$spid" 2>/dev/null || break
      sleep 0.1
    done
    grep -q 'waiting for the client' "$slog" 2>/dev/null && break
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    grep -q "probing device" "$slog" || break
  done
  crc=1
  for attempt in 1 2 3; do
    clog=$tmp/client.$port.$attempt.log
    # shellcheck disable=SC2086
    ip netns exec "$ns" timeout -k 5 60 "$perf" "${args[@]}" 127.0.0.1 -p "$port" --device "net_af_packet1,iface=va$qp" \
      --ip 10.20.0.1 --mac 02:00:0a:14:00:01 --queues "$queues" --qp-timeout "$qpto" --report_gbits $faults \
      -- --lcores=0@0 "${EAL[@]}" >"$clog" 2>&1 && crc=0 && break
    grep -q "probing device" "$clog" || break
    sleep 0.2
  done
  if [ "$crc" -eq 0 ] && wait "$spid"; then
    echo "ok: ${args[*]} $faults"
    grep -E '^ +[0-9]+ ' "$clog" | sed 's/^/    /'
    grep -E 'transport:|port:|device:' "$clog" | sed 's/^/    /'
  else
    echo "FAIL: ${args[*]} $faults"
    sed 's/^/  client| /' "$clog"
    # The server may be blocked on a client that is gone: give it 5 s to finish its log.
    for _ in $(seq 1 50); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    sed 's/^/  server| /' "$slog"
    fails=$((fails + 1))
  fi
  pids=()
done
echo "$(( ${#list[@]} - fails )) passed, $fails failed"
[ "$fails" -eq 0 ]

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
source "$(dirname "$0")/../lib/netns.sh"
if ! droce_veth_ns "$ns"; then echo "SKIP: cannot create network namespaces"; exit 77; fi
[ -z "$qpto" ] && { [ -n "$faults" ] && qpto=12 || qpto=14; }
# The af_packet RX rings hold 16384 frames (512 by default): a loop descheduled
# for a few ms on a loaded host must not lose a QP's whole window (see shim_pair.sh).
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
  # processes whose ids clash cannot both probe ("probing device ...:
  # Operation not permitted", the PMD saying PACKET_FANOUT: Invalid argument):
  # both nodes start through scripts/afpacket-run ($AFP_RUN), which gives each a
  # process id whose group id is free; a node that fails to probe fails the
  # run (it used to be restarted up to 5 times on that error). On this shared
  # 2-CPU machine a node can take well over 10 s to start (EAL, hugepages):
  # wait up to 45 s for the server to listen, as long as it is alive.
  # The log is emptied here, not by the background job's redirection: that one
  # may run after the first grep below, which then finds the previous run's
  # "waiting for the client" and starts the client before this server is up
  # (its 10 s of connection attempts run out while a slow server starts: the
  # old flaky failure "tcp: cannot connect", mostly in the sanitizer build).
  t_server=$SECONDS
  for attempt in 1; do
    : >"$tmp/server.log"
    # shellcheck disable=SC2086
    ip netns exec "$ns" timeout -k 5 90 "$AFP_RUN" vb "$perf" "${args[@]}" -p "$port" --device "net_af_packet0,iface=vb,framecnt=16384$qp" \
      --ip 10.20.0.2 --mac 02:00:0a:14:00:02 --queues "$queues" --qp-timeout "$qpto" $faults -- --lcores=0@1 "${EAL[@]}" \
      >"$tmp/server.log" 2>&1 &
    spid=$!
    t_server=$SECONDS
    pids=("$spid")
    for _ in $(seq 1 450); do
      grep -q 'waiting for the client' "$tmp/server.log" 2>/dev/null && break
      kill -0 "$spid" 2>/dev/null || break
      sleep 0.1
    done
    grep -q 'waiting for the client' "$tmp/server.log" && break
    if kill -0 "$spid" 2>/dev/null; then  # alive but not listening after 45 s: give up on this run
      kill "$spid" 2>/dev/null
      break
    fi
    wait "$spid" 2>/dev/null || true
    grep -q "probing device" "$tmp/server.log" || break
    sleep 0.3
  done
  t_listen=$SECONDS
  crc=1
  for attempt in 1; do
    # shellcheck disable=SC2086
    ip netns exec "$ns" timeout -k 5 90 "$AFP_RUN" va "$perf" "${args[@]}" 127.0.0.1 -p "$port" --device "net_af_packet1,iface=va,framecnt=16384$qp" \
      --ip 10.20.0.1 --mac 02:00:0a:14:00:01 --queues "$queues" --qp-timeout "$qpto" --report_gbits $faults \
      -- --lcores=0@0 "${EAL[@]}" >"$tmp/client.log" 2>&1 && crc=0 && break
    grep -q "probing device" "$tmp/client.log" || break
    sleep 0.3
  done
  t_client=$SECONDS
  # A server whose client is gone may block in accept: 5 s to finish its log.
  if [ "$crc" -ne 0 ]; then
    for _ in $(seq 1 50); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
    kill "$spid" 2>/dev/null || true
  fi
  src=0
  wait "$spid" || src=$?
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ]; then
    echo "ok: ${args[*]} $faults"
    grep -E '^ +[0-9]+ ' "$tmp/client.log" | sed 's/^/    /'
    grep -E 'transport:|port:|device:' "$tmp/client.log" | sed 's/^/    /'
  else
    echo "FAIL: ${args[*]} $faults (server started at ${t_server}s, listening at ${t_listen}s, client done at ${t_client}s, server exit $src)"
    sed 's/^/  client| /' "$tmp/client.log"
    sed 's/^/  server| /' "$tmp/server.log"
    fails=$((fails + 1))
  fi
  pids=()
done
echo "$(( ${#list[@]} - fails )) passed, $fails failed"
[ "$fails" -eq 0 ]

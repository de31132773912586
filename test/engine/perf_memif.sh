#!/usr/bin/env bash
# Two droce-perf nodes in two processes joined by net_memif (shared memory),
# inside a network namespace of their own (its loopback carries the TCP
# exchange): write, read, send (also every size from 2 B, -a) and atomic with
# the data verified, the raw frame ping-pong (raw_ethernet_lat) every frame
# of which must come back, and the raw frame stream (raw_ethernet_bw) every
# frame of which the server must count. A bandwidth run with -q N (N > 1) must also have
# set up N QPs on both sides and every one of them must have completed
# messages (the client's "per-QP messages: ... over N QPs, 0 without a
# completion"). DROCE_PERF_RUNS: the runs, separated by ';'.
# QP_LIMITS=1: first, droce-perf must refuse (exit status 1, a message, no
# crash) QP counts whose buffers or queues cannot fit.
#   perf_memif.sh PATH/TO/droce-perf
set -uo pipefail
perf=$1
# shellcheck source=../lib/netns.sh
source "$(dirname "$0")/../lib/netns.sh"
droce_memif_ns droce-m
fails=0
passes=0
port=18700
if [ "${QP_LIMITS:-0}" = 1 ]; then
  # Refused before DPDK starts: no namespace needed.
  while IFS='|' read -r want args; do
    read -ra a <<<"$args"
    "$perf" write_bw "${a[@]}" 127.0.0.1 --device net_null0 --ip 10.21.0.1 >"$tmp/limit.log" 2>&1
    rc=$?
    if [ "$rc" -eq 1 ] && grep -q "$want" "$tmp/limit.log"; then
      echo "ok: write_bw ${a[*]} refused: $(tail -1 "$tmp/limit.log")"
      passes=$((passes + 1))
    else
      echo "FAIL: write_bw ${a[*]}: exit status $rc (expected 1 and \"$want\")"
      sed 's/^/  | /' "$tmp/limit.log"
      fails=$((fails + 1))
    fi
  done <<'LIMITS'
more than the 256 MiB droce-perf takes per side|-q 65536 -s 65536
send-queue entries in all|-q 65536 -s 64 -t 128 --tx-depth-per-qp
LIMITS
fi
IFS=';' read -ra list <<<"${DROCE_PERF_RUNS:-write_bw -s 65536 -n 500;write_bw -s 64 -n 20000;read_bw -s 4096 -n 2000;send_bw -s 1024 -n 5000;send_bw -a --max-size 64 -n 1000;atomic_bw -n 5000;write_lat -s 64 -n 1000;raw_ethernet_lat -s 64 -n 2000;raw_ethernet_bw -s 64 -n 200000}"
for run in "${list[@]}"; do
  read -ra args <<<"$run"
  port=$((port + 1))
  rm -f "$sock"
  : >"$tmp/server.log"  # emptied before the background start: the wait below must not see the last run's log
  ip netns exec "$ns" timeout -k 5 60 "$perf" "${args[@]}" -p "$port" \
    --device "net_memif0,role=server,socket=$sock,id=3,mac=02:00:0a:15:00:02" --ip 10.21.0.2 \
    -- --lcores=0@1 "${EAL[@]}" >"$tmp/server.log" 2>&1 &
  spid=$!
  # (the memif socket is abstract by default in DPDK 22.11: no file to wait for)
  for _ in $(seq 1 100); do grep -q 'waiting for the client' "$tmp/server.log" 2>/dev/null && break; sleep 0.1; done
  # The memif client PMD fails its start when its first connect() is refused
  # (the server's listener is set up by EAL's interrupt thread): try again.
  crc=1
  for attempt in 1 2 3; do
    ip netns exec "$ns" timeout -k 5 60 "$perf" "${args[@]}" 127.0.0.1 -p "$port" \
      --device "net_memif1,role=client,socket=$sock,id=3,mac=02:00:0a:15:00:01" --ip 10.21.0.1 --report_gbits \
      -- --lcores=0@0 "${EAL[@]}" >"$tmp/client.log" 2>&1 && crc=0 && break
    grep -q "Failed to connect socket" "$tmp/client.log" || break
    sleep 0.5
  done
  qps=$(awk '{for (i = 1; i < NF; ++i) if ($i == "-q") print $(i + 1)}' <<<"$run")
  qbad=""
  if [ "$crc" -eq 0 ] && [ "${qps:-1}" -gt 1 ] && [[ "${args[0]}" == *_bw ]]; then
    grep -q " ${qps} QP(s)," "$tmp/client.log" || qbad="the client did not set up $qps QPs"
    grep -q "client connected: ${qps} QP(s)" "$tmp/server.log" || qbad="the server did not set up $qps QPs"
    grep -Eq "^ per-QP messages: min [1-9][0-9]* .* over ${qps} QPs, 0 without a completion" "$tmp/client.log" ||
      qbad="not every one of the $qps QPs completed messages"
  fi
  # memif loses nothing: every frame raw_ethernet_bw sent is counted by the server.
  if [ "$crc" -eq 0 ] && [ "${args[0]}" = raw_ethernet_bw ]; then
    grep -Eq '^ raw_ethernet_bw: sent ([0-9]+) frames .* the server received \1 \(0 lost\)' "$tmp/client.log" ||
      qbad="raw_ethernet_bw: frames lost on memif"
  fi
  if [ -n "$qbad" ]; then
    echo "FAIL: memif ${args[*]}: $qbad"
    sed 's/^/  client| /' "$tmp/client.log"
    wait "$spid" 2>/dev/null
    sed 's/^/  server| /' "$tmp/server.log"
    fails=$((fails + 1))
  elif [ "$crc" -eq 0 ] && wait "$spid"; then
    echo "ok: memif ${args[*]}"
    grep -E '^ +[0-9]+ |^ per-QP messages' "$tmp/client.log" | sed 's/^/    /'
    passes=$((passes + 1))
  else
    echo "FAIL: memif ${args[*]}"
    sed 's/^/  client| /' "$tmp/client.log"
    wait "$spid" 2>/dev/null
    sed 's/^/  server| /' "$tmp/server.log"
    fails=$((fails + 1))
  fi
  spid=
done
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]

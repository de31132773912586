#!/usr/bin/env bash
# Two droce-perf nodes in two processes joined by net_memif (shared memory),
# inside a network namespace of their own (its loopback carries the TCP
# exchange): write, read, send (also every size from 2 B, -a) and atomic with
# the data verified, and the raw frame ping-pong (raw_ethernet_lat) every frame
# of which must come back.
#   perf_memif.sh PATH/TO/droce-perf
set -uo pipefail
perf=$1
# shellcheck source=../lib/netns.sh
source "$(dirname "$0")/../lib/netns.sh"
droce_memif_ns droce-m
fails=0
passes=0
port=18700
IFS=';' read -ra list <<<"${DROCE_PERF_RUNS:-write_bw -s 65536 -n 500;write_bw -s 64 -n 20000;read_bw -s 4096 -n 2000;send_bw -s 1024 -n 5000;send_bw -a --max-size 64 -n 1000;atomic_bw -n 5000;write_lat -s 64 -n 1000;raw_ethernet_lat -s 64 -n 2000}"
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
  if [ "$crc" -eq 0 ] && wait "$spid"; then
    echo "ok: memif ${args[*]}"
    grep -E '^ +[0-9]+ ' "$tmp/client.log" | sed 's/^/    /'
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

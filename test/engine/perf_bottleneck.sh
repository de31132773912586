#!/usr/bin/env bash
# DCQCN through a bottleneck on a real port (issue 13): two droce-perf
# processes over net_memif, the sender's TX through the fault injector's
# bottleneck mode (drained at BN_GBPS, RED/ECN between Kmin and Kmax, tail drop
# at the limit). Several QPs write for a few seconds, once with DCQCN and once
# without. What is asserted is what holds on a busy 2-CPU machine: data
# verified, the queue ECN-marked, Jain's index >= JAIN_MIN, and without DCQCN
# the queue overflows (drops) and go-back-N retransmits. The DCQCN run's drops
# are printed, not asserted: on this memif pair (sender at ~0.46 Gb/s against a
# 0.5 Gb/s drain) DCQCN does not yet keep the queue under its limit (issue 13;
# marking on departure, the third run, does not change that here: 892-1496
# drops against 1003-1767 on arrival and 1177-1673 without DCQCN); the rest
# (per-QP throughput, marks, CNPs, rate decreases, the largest queue) is printed.
#   perf_bottleneck.sh PATH/TO/droce-perf
set -uo pipefail
perf=$1
# shellcheck source=../lib/netns.sh
source "$(dirname "$0")/../lib/netns.sh"
droce_memif_ns droce-bn
QPS=${QPS:-4}
SECS=${SECS:-2}
BN_GBPS=${BN_GBPS:-0.5}
KMIN=${KMIN:-5000}
KMAX=${KMAX:-100000}
LIMIT=${LIMIT:-400000}
JAIN_MIN=${JAIN_MIN:-0.8}
# Windows of 256 packets per QP: far more in flight than the queue's limit, so
# only a sender that slows down keeps the queue short.
RUN=(write_bw -s 65536 -q "$QPS" -D "$SECS" --window 256)
BN=(--bn-gbps "$BN_GBPS" --bn-kmin "$KMIN" --bn-kmax "$KMAX" --bn-pmax 0.2 --bn-limit "$LIMIT")
fails=0
port=18800

run() {  # run NAME [client options...]: sets $tmp/client.log
  local name=$1
  shift
  port=$((port + 1))
  rm -f "$sock"
  : >"$tmp/server.log"
  ip netns exec "$ns" timeout -k 5 60 "$perf" "${RUN[@]}" -p "$port" \
    --device "net_memif0,role=server,socket=$sock,id=4,mac=02:00:0a:16:00:02" --ip 10.22.0.2 \
    -- --lcores=0@1 "${EAL[@]}" >"$tmp/server.log" 2>&1 &
  spid=$!
  for _ in $(seq 1 100); do grep -q 'waiting for the client' "$tmp/server.log" 2>/dev/null && break; sleep 0.1; done
  local crc=1
  for _ in 1 2 3; do  # the memif client fails its start when the server's listener is not up yet
    ip netns exec "$ns" timeout -k 5 60 "$perf" "${RUN[@]}" 127.0.0.1 -p "$port" "$@" "${BN[@]}" \
      --device "net_memif1,role=client,socket=$sock,id=4,mac=02:00:0a:16:00:01" --ip 10.22.0.1 --report_gbits \
      -- --lcores=0@0 "${EAL[@]}" >"$tmp/client.log" 2>&1 && crc=0 && break
    grep -q "Failed to connect socket" "$tmp/client.log" || break
    sleep 0.5
  done
  wait "$spid"
  local src=$?
  spid=
  echo "--- $name"
  grep -E "^ +[0-9]+ |per-QP|Jain|bottleneck|transport:|congestion:" "$tmp/client.log" | sed 's/^/    /'
  if [ "$crc" -ne 0 ] || [ "$src" -ne 0 ]; then
    echo "FAIL: $name: droce-perf failed (client $crc, server $src)"
    sed 's/^/  client| /' "$tmp/client.log"
    sed 's/^/  server| /' "$tmp/server.log"
    fails=$((fails + 1))
    return 1
  fi
}
field() {  # field REGEX: the number after it in the client's output
  grep -oE "$1 [0-9.]+" "$tmp/client.log" | head -1 | awk '{print $NF}'
}
check() {  # check NAME CONDITION
  if python3 -c "import sys; sys.exit(0 if ($2) else 1)"; then echo "ok: $1"; else echo "FAIL: $1 ($2)"; fails=$((fails + 1)); fi
}

if run "DCQCN on, ECN marking" --dcqcn --dcqcn-line-rate 10000; then
  drops=$(field "drops"); marks=$(field "ECN marks"); maxq=$(field "max queue"); jain=$(field "fairness index:")
  retx=$(field "retransmits")
  echo "    DCQCN: drops $drops, marks $marks, max queue $maxq of limit $LIMIT (not asserted yet)"
  check "DCQCN: the queue was marked (the reaction point had something to react to)" "$marks > 0"
  check "DCQCN: Jain's index $jain >= $JAIN_MIN over $QPS QPs" "$jain >= $JAIN_MIN"
  echo "    (retransmits $retx; max queue $maxq bytes against Kmax $KMAX)"
fi
if run "DCQCN on, marking on departure" --dcqcn --dcqcn-line-rate 10000 --bn-mark-dequeue; then
  drops=$(field "drops"); marks=$(field "ECN marks"); maxq=$(field "max queue"); jain=$(field "fairness index:")
  retx=$(field "retransmits")
  echo "    DCQCN, marking on departure: drops $drops, marks $marks, max queue $maxq of limit $LIMIT, retransmits $retx"
fi
if run "DCQCN off"; then
  drops=$(field "drops"); retx=$(field "retransmits"); jain=$(field "fairness index:")
  check "no DCQCN: the bottleneck drops ($drops) and the sender retransmits ($retx)" "$drops > 0 and $retx > 0"
  check "no DCQCN: Jain's index $jain >= $JAIN_MIN over $QPS QPs" "$jain >= $JAIN_MIN"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]

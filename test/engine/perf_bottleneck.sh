#!/usr/bin/env bash
# DCQCN through a bottleneck on a real port (issue 13): two droce-perf
# processes over net_memif, the sender's TX through the fault injector's
# bottleneck mode (drained at BN_GBPS, RED/ECN between Kmin and Kmax on the
# queue a frame leaves behind, tail drop at the limit). QPS QPs WRITE for SECS
# seconds with DCQCN and without, alternating, ROUNDS times. Printed per run:
# per-QP throughput, Jain's index, drops, ECN marks, retransmits, the largest
# queue; then a summary. Asserted, what holds on a busy 2-CPU machine: data
# verified in every run, the queue ECN-marked, Jain >= JAIN_MIN with DCQCN,
# without DCQCN drops and retransmits, and with DCQCN at most a DROP_RATIO-th
# of the drops without (summed over the rounds).
#
# Why these settings (lib/transport/README.md, "On a real port"): a 2 Gb/s
# drain (the sender alone reaches ~12 Gb/s over memif, so the queue, not the
# CPU, is the bottleneck, and the link passes ~240k frames/s: enough marked
# frames per QP for its reaction point to hear of the queue), a line rate of
# 4 Gb/s (each QP starts at twice the link), and the paper's timescales with
# the target rate clamped on every decrease. With NVIDIA's defaults at 0.5 Gb/s
# (the setting of before) alpha stayed at 0-4/1024 and DCQCN dropped as much as
# no DCQCN.
#   perf_bottleneck.sh PATH/TO/droce-perf
# PFC_XOFF=BYTES (PFC_XON, default XOFF/2): PFC on the bottleneck, the sender
# paused past Xoff until the queue has drained to Xon (lossless: then asserted
# instead, no drop and no retransmission in either mode, and with DCQCN at most
# a PAUSE_RATIO-th of the pauses without).
# SAMPLE_DIR=DIR: each run's per-QP samples (droce-perf --sample-us) as
# DIR/{on,off}-ROUND.csv, for scripts/dcqcn-port-plot.py.
# KMAX_SHARE=S: the queue is sampled every 200 us and, with DCQCN, at most this
# share of the samples after the first 50 ms may be above Kmax (printed: the
# share, the median, p99 and the largest queue, and the 10 ms windows that
# passed Kmax); checked when the run carried at least 0.8 of the drain rate
# (otherwise the sender's CPU was the bottleneck: printed, not checked).
# PMAX: RED's marking probability at Kmax (default 0.2).
# INITIAL_WINDOW=N: each QP starts with N packets in flight (default 8) and
# grows by slow start (ended by the first CNP) to WINDOW
# (EngineConfig::initial_inflight_pkts); 0: the whole window at once.
set -uo pipefail
perf=$1
# shellcheck source=../lib/netns.sh
source "$(dirname "$0")/../lib/netns.sh"
droce_memif_ns droce-bn
QPS=${QPS:-4}
SECS=${SECS:-2}
ROUNDS=${ROUNDS:-2}
BN_GBPS=${BN_GBPS:-2}
KMIN=${KMIN:-5000}
KMAX=${KMAX:-100000}
LIMIT=${LIMIT:-400000}
WINDOW=${WINDOW:-256}
JAIN_MIN=${JAIN_MIN:-0.9}
DROP_RATIO=${DROP_RATIO:-4}
# Windows of 256 packets per QP: far more in flight than the queue's limit, so
# only a sender that slows down keeps the queue short.
RUN=(write_bw -s 65536 -q "$QPS" -D "$SECS" --window "$WINDOW")
# Each QP starts with 8 packets in flight (slow start, ended by the first CNP,
# up to WINDOW): with the whole window at once the start overflowed the queue
# (4 QPs: 0-154 drops with DCQCN; 16 QPs: ~2000). INITIAL_WINDOW=0: the whole window.
INITIAL_WINDOW=${INITIAL_WINDOW:-8}
[ "$INITIAL_WINDOW" -gt 0 ] && RUN+=(--initial-window "$INITIAL_WINDOW")
BN=(--bn-gbps "$BN_GBPS" --bn-kmin "$KMIN" --bn-kmax "$KMAX" --bn-pmax "${PMAX:-0.2}" --bn-limit "$LIMIT" --bn-mark-dequeue)
PFC_XOFF=${PFC_XOFF:-0}
PAUSE_RATIO=${PAUSE_RATIO:-4}
[ "$PFC_XOFF" -gt 0 ] && BN+=(--bn-pfc-xoff "$PFC_XOFF" --bn-pfc-xon "${PFC_XON:-$((PFC_XOFF / 2))}")
# The paper's timescales (dcqcn::paper_params: alpha over 55 us with g = 1/256,
# a 55 us timer, F = 5, the byte counter 10 MB) with AI 5 / HAI 50 Mb/s and the
# target clamped on every decrease.
ON=(--dcqcn --dcqcn-line-rate "${LINE_MBPS:-4000}")
for kv in alpha_g=1020 alpha_update_period_us=55 time_reset_us=55 byte_reset=156250 threshold=5 \
  ai_rate_mbps=5 hai_rate_mbps=50 clamp_tgt_rate=1 ${DCQCN_PARAMS:-}; do
  ON+=(--dcqcn-param "$kv")
done
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
  grep -E "^ +[0-9]+ |per-QP|Jain|bottleneck|transport:|congestion:|device:" "$tmp/client.log" | sed 's/^/    /'
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
queue_after() {  # queue_after CSV: prints the queue after the first 50 ms; echoes the share above Kmax
  python3 - "$1" "$KMAX" <<'PY'
import csv, sys
q = {}
for row in csv.DictReader(open(sys.argv[1])):
    q[float(row["t_us"])] = float(row["queue_bytes"])
kmax = float(sys.argv[2])
ts = sorted(t for t in q if t >= 50_000)
v = sorted(q[t] for t in ts)
if not v:
    print(1.0)
    sys.exit()
win = {}
for t in ts:
    win[int(t // 10_000)] = max(win.get(int(t // 10_000), 0), q[t])
over = sum(x > kmax for x in v)
print(f"    queue after 50 ms: {len(v)} samples, {over} above Kmax; median {v[len(v) // 2] / 1e3:.0f} KB, "
      f"p99 {v[int(len(v) * 0.99)] / 1e3:.0f} KB, max {v[-1] / 1e3:.0f} KB; "
      f"{sum(x > kmax for x in win.values())} of {len(win)} 10 ms windows passed Kmax", file=sys.stderr)
print(f"{over / len(v):.4f}")
PY
}
check() {  # check NAME CONDITION
  if python3 -c "import sys; sys.exit(0 if ($2) else 1)"; then echo "ok: $1"; else echo "FAIL: $1 ($2)"; fails=$((fails + 1)); fi
}

echo "$QPS QPs, ${SECS} s, bottleneck $BN_GBPS Gb/s, Kmin $KMIN Kmax $KMAX limit $LIMIT (marking on departure)," \
  "PFC Xoff ${PFC_XOFF} (0: none), $ROUNDS rounds"
declare -A sum=([on_drops]=0 [off_drops]=0 [on_retx]=0 [off_retx]=0 [on_marks]=0 [on_pauses]=0 [off_pauses]=0)
summary=()
for r in $(seq 1 "$ROUNDS"); do
  for mode in on off; do
    opts=()
    [ "$mode" = on ] && opts=("${ON[@]}")
    csv=
    [ -n "${KMAX_SHARE:-}" ] && csv=$tmp/samples-$mode-$r.csv
    [ -n "${SAMPLE_DIR:-}" ] && csv=$SAMPLE_DIR/$mode-$r.csv
    [ -n "$csv" ] && opts+=(--sample-us 200 --sample-csv "$csv")
    run "round $r, DCQCN $mode" "${opts[@]}" || continue
    drops=$(field "drops"); marks=$(field "ECN marks"); maxq=$(field "max queue"); jain=$(field "fairness index:")
    retx=$(field "retransmits"); gbps=$(grep -E "^ +65536 " "$tmp/client.log" | awk '{print $3}')
    pauses=$(field "PFC pauses")
    sum[${mode}_pauses]=$((sum[${mode}_pauses] + pauses))
    sum[${mode}_drops]=$((sum[${mode}_drops] + drops))
    sum[${mode}_retx]=$((sum[${mode}_retx] + retx))
    [ "$mode" = on ] && sum[on_marks]=$((sum[on_marks] + marks))
    summary+=("$(printf '%-5s %-4s %8s %8s %8s %10s %8s %8s %8s' "$r" "$mode" "$gbps" "$jain" "$drops" "$retx" "$maxq" "$marks" "$pauses")")
    [ "$mode" = on ] && check "round $r, DCQCN: Jain's index $jain >= $JAIN_MIN over $QPS QPs" "$jain >= $JAIN_MIN"
    if [ "$mode" = on ] && [ -n "${KMAX_SHARE:-}" ]; then
      share=$(queue_after "$csv")
      # Only when the queue was the bottleneck: a sender short of CPU (beside a
      # CPU hog: ~0.95 Gb/s of payload at 2 Gb/s, the queue above Kmax in 15-18%
      # of the samples) stalls all the time, and each stall is a burst after it.
      if python3 -c "import sys; sys.exit(0 if $gbps >= 0.8 * $BN_GBPS else 1)"; then
        check "round $r, DCQCN: the queue after 50 ms above Kmax in a share $share <= $KMAX_SHARE of the samples" \
          "$share <= $KMAX_SHARE"
      else
        echo "not checked: round $r, the queue against Kmax (share above it $share): $gbps Gb/s of payload," \
          "below 0.8 of the $BN_GBPS Gb/s drain, so the sender's CPU, not the queue, was the bottleneck"
      fi
    fi
  done
done
echo "--- summary (Gb/s of payload, drops and retransmits of the sender, max queue in bytes)"
printf '%-5s %-4s %8s %8s %8s %10s %8s %8s %8s\n' round dcqcn Gb/s Jain drops retransmit maxqueue marks pauses
printf '%s\n' "${summary[@]}"
check "DCQCN: the queue was marked (${sum[on_marks]} marks)" "${sum[on_marks]} > 0"
if [ "$PFC_XOFF" -gt 0 ]; then
  # Retransmissions without a drop are ACK timeouts: the receiver's process
  # descheduled for longer than the timeout (seen once in 5 runs, 624, while
  # builds shared the CPUs); they are printed, not asserted. (Until
  # 2026-12-07 the bottleneck also dropped the frames a full memif ring
  # refused, counted as the device's "tx full": seq NAKs and go-back-N in 4
  # of 12 runs; now they wait at the queue's head, and 12 runs had none.)
  check "PFC: no drop (${sum[on_drops]} with DCQCN, ${sum[off_drops]} without; retransmissions ${sum[on_retx]}, ${sum[off_retx]})" \
    "${sum[on_drops]} + ${sum[off_drops]} == 0"
  check "no DCQCN: PFC paused the sender (${sum[off_pauses]} pauses)" "${sum[off_pauses]} > 0"
  check "DCQCN pauses ${sum[on_pauses]} <= 1/$PAUSE_RATIO of the pauses without (${sum[off_pauses]})" \
    "${sum[on_pauses]} * $PAUSE_RATIO <= ${sum[off_pauses]}"
else
  check "no DCQCN: the bottleneck drops (${sum[off_drops]}) and the sender retransmits (${sum[off_retx]})" \
    "${sum[off_drops]} > 0 and ${sum[off_retx]} > 0"
  check "DCQCN drops ${sum[on_drops]} <= 1/$DROP_RATIO of the drops without (${sum[off_drops]})" \
    "${sum[on_drops]} * $DROP_RATIO <= ${sum[off_drops]}"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]

#!/usr/bin/env bash
# DCQCN between two droced nodes through a bottleneck without PFC (issue 13):
# Debian's ib_write_bw through the drop-in libibverbs, client on node B
# writing to the server on node A (af_packet on a veth pair in a namespace of
# its own); B's TX goes through the fault injector's bottleneck mode
# ([port.fault.tx.bottleneck]: BN_GBPS, RED/ECN between Kmin 5 KB and Kmax
# 100 KB on the queue a frame leaves behind, tail drop at 400 KB). DCQCN on B
# is turned on and off at run time (droce-ctl dcqcn set), alternating, ROUNDS
# times; per run the drops, marks, CNPs, retransmits (droce-ctl counters,
# differences) and ib_write_bw's throughput, and mid-run B's QPs' rates and
# decreases (droce-ctl qps). Prints a table.
# With CHECK=1 (the meson test engine_bn_lossy) it also samples B's QPs
# (qp_rates.py, every SAMPLE_MS, 250 by default) and exits 1 unless, in every
# round, ib_write_bw ran, with DCQCN nothing was dropped or retransmitted, the
# QPs' Jain index from 0.5 s for 2 s was >= JAIN_MIN (0.95) and the mean queue
# the frames found was under Kmax, and without DCQCN frames were dropped and
# retransmitted. The per-QP case with PFC and a late starter: bn_fair.sh.
#   [QPS=16] [SECS=3] [ROUNDS=2] [BN_GBPS=0.5] [PMAX=0.2] [LINE_MBPS=1000] [AI_MBPS=5] [HAI_MBPS=50]
#   [VALIDATE=1] [STALL_HOLD_US=N] [WINDOW_US=N]  (more [port.dcqcn_params] keys: validate_rate, ...)
#   [EXTRA='key = value']  (any other [port.dcqcn_params] lines)
#   [PFC_XOFF=BYTES [PFC_XON=BYTES]]  (PFC on the bottleneck; the table then counts pauses too)
#   [ROCE='initial_window = 8']  ([roce] lines of node B, the sender)
#   [SAMPLE_MS=N [KEEP=DIR]]  (qp_rates.py samples both nodes every N ms: DIR/{a,b}-ROUND-{on,off}.jsonl)
#   [CHECK=1 [JAIN_MIN=0.95]]
#   bn_pair.sh DROCED DROCE_CTL FRONT_LIBDIR
# Runs as root (network namespace). lib/transport/README.md, "Two droced
# nodes without PFC", has what it measured.
set -uo pipefail
DROCED=$1
CTL=$2
LIBDIR=$3
QPS=${QPS:-16}
SECS=${SECS:-3}
ROUNDS=${ROUNDS:-2}
BN_GBPS=${BN_GBPS:-0.5}
CHECK=${CHECK:-0}
[ "$CHECK" = 1 ] && SAMPLE_MS=${SAMPLE_MS:-250}
JAIN_MIN=${JAIN_MIN:-0.95}
fail=0
ns=droce-bn-$$
T=$(mktemp -d /tmp/droce-bn-pair-XXXXXX)
pids=()
source "$(dirname "$0")/../lib/droced_start.sh"
cleanup() {
  droced_node_stop "${pids[@]}"
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
# shellcheck source=../lib/netns.sh
source "$(dirname "$0")/../lib/netns.sh"  # droce_veth_ns, AFP_RUN
if ! droce_veth_ns "$ns"; then echo "SKIP: cannot create network namespaces"; exit 77; fi
in_ns() { ip netns exec "$ns" "$@"; }
node() {
  DN_TIMEOUT=600 DN_DEVARGS=,framecnt=16384 DN_AFP_RUN=$AFP_RUN DN_PORT_TOML=$6 \
    droced_node "$1" "$ns" "$2" "$3" "$4" "$5" "$T" "$DROCED"
  local rc=$?
  pids+=("$DN_PID")
  return $rc
}
BN=$'[port.fault.tx.bottleneck]\n'"rate_gbps = $BN_GBPS"$'\nkmin_bytes = 5000\nkmax_bytes = 100000\npmax = '"${PMAX:-0.2}"$'\nlimit_bytes = 400000\nmark_dequeue = true'
[ -n "${PFC_XOFF:-}" ] && BN+=$'\n'"pfc_xoff_bytes = $PFC_XOFF"$'\n'"pfc_xon_bytes = ${PFC_XON:-$((PFC_XOFF / 2))}"
# DCQCN off at start; the parameters of test/engine/perf_bottleneck.sh.
DQ="dcqcn = false"$'\n[port.dcqcn_params]\n'"line_rate_mbps = ${LINE_MBPS:-1000}"$'\nalpha_g = 1020\nalpha_update_period_us = 55\ntime_reset_us = 55\nbyte_reset = 156250\nthreshold = 5\nai_rate_mbps = '"${AI_MBPS:-5}"$'\nhai_rate_mbps = '"${HAI_MBPS:-50}"$'\nclamp_tgt_rate = 1\n'"validate_rate = ${VALIDATE:-0}"$'\n'"stall_hold_us = ${STALL_HOLD_US:-0}"$'\n'"window_us = ${WINDOW_US:-0}"$'\n'"${EXTRA:-}"
node a va 10.42.0.1 02:00:0a:2a:00:01 "0@0,1@1" "" || exit 1
DN_ROCE_TOML=${ROCE:-} node b vb 10.42.0.2 02:00:0a:2a:00:02 "0@1,1@0" "$DQ"$'\n'"$BN" || exit 1
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=$(DROCE_SOCKET=$T/a-verbs.sock timeout 10 ibv_devinfo -v 2>&1)
gidx=$(echo "$out" | sed -n 's/.*GID\[ *\([0-9]*\)\]:.*::ffff:10.42.0.1.*/\1/p' | head -n 1)
[ -n "$gidx" ] || { echo "no GID of 10.42.0.1 on node A:"; echo "$out"; exit 1; }
port=$((20000 + RANDOM % 20000))
snap() {  # snap NODE: the node's counters as name=value, summed over instances
  "$CTL" -s "$T/$1-ctl.sock" --json counters 2>/dev/null | python3 -c 'import json,sys,collections
s=collections.Counter()
for g in json.load(sys.stdin).get("groups", []):
    for inst in g.get("instances", []):
        for k, x in zip(g["names"], inst["values"]):
            s[g["group"] + "." + k] += x
print(json.dumps(s))'
}
printf '%-5s %-4s %9s %7s %8s %8s %8s %10s %8s %7s\n' round dcqcn Gb/s drops marks cnps_rx wcuts retransmit timeouts pauses
for r in $(seq 1 "$ROUNDS"); do
  for mode in on off; do
    "$CTL" -s "$T/b-ctl.sock" dcqcn set -p vb --dcqcn "$mode" >/dev/null || echo "dcqcn set failed"
    before=$(snap b)
    sp=()
    if [ -n "${SAMPLE_MS:-}" ]; then  # both nodes' QPs and counters (qp_rates.py), kept in KEEP
      for nd in a b; do
        python3 "$(dirname "$0")/qp_rates.py" sample "$T/$nd-ctl.sock" "$T/$nd-$r-$mode.jsonl" "$SAMPLE_MS" $((SECS + 30)) &
        sp+=($!)
      done
    fi
    port=$((port + 1))
    DROCE_SOCKET=$T/a-verbs.sock in_ns timeout 60 ib_write_bw -x "$gidx" -q "$QPS" -D "$SECS" -p "$port" >"$T/a.log" 2>&1 &
    apid=$!
    sleep 0.4
    DROCE_SOCKET=$T/b-verbs.sock in_ns timeout 60 ib_write_bw -x "$gidx" -q "$QPS" -D "$SECS" -p "$port" --report_gbits localhost >"$T/b.log" 2>&1 &
    bpid=$!
    # Mid-run: B's RC QPs' reaction points (rate decreases, rates).
    sleep "$(python3 -c "print($SECS / 2 + 1)")"
    mid=$("$CTL" -s "$T/b-ctl.sock" --json qps 2>/dev/null | python3 -c 'import json,sys
q=[r for r in json.load(sys.stdin)["qps"] if r["type"] == "RC" and r["state"] == "RTS"]
lim=[r["rate_mbps"] for r in q if r["rp_limited"]]
print("mid-run: %d QPs, %d limited, rate %s Mb/s, decreases %d, paced %d" % (len(q), len(lim),
      "%.0f-%.0f" % (min(lim), max(lim)) if lim else "-", sum(r["rate_decreases"] for r in q), sum(r["paced"] for r in q)))')
    wait "$bpid"
    rb=$?
    wait "$apid"; ra=$?
    after=$(snap b)
    for p in "${sp[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    [ -n "${KEEP:-}" ] && [ -n "${SAMPLE_MS:-}" ] && mkdir -p "$KEEP" && cp "$T"/[ab]-"$r-$mode".jsonl "$KEEP"/
    gbps=$(grep -E '^ *65536 +[0-9]+ ' "$T/b.log" | awk '{print $4}')
    rates='{}'
    [ -n "${SAMPLE_MS:-}" ] && rates=$(python3 "$(dirname "$0")/qp_rates.py" report "$T/b-$r-$mode.jsonl" --skip 0.5 --win 2 --late-gap 2 --json 2>/dev/null)
    python3 - "$before" "$after" "$r" "$mode" "${gbps:-?}" "$ra/$rb" "${rates:-{\}}" "$CHECK" "$QPS" "$JAIN_MIN" <<'EOF' || fail=1
import json, sys
b, a = json.loads(sys.argv[1]), json.loads(sys.argv[2])
d = lambda k: a.get(k, 0) - b.get(k, 0)
keys = list(a)
def find(sub):
    ks = [k for k in keys if k.endswith(sub)]
    return sum(d(k) for k in ks)
print("%-5s %-4s %9s %7d %8d %8d %8d %10d %8d %7d %s" % (sys.argv[3], sys.argv[4], sys.argv[5], find("fault_tx_bn_drop"), find("fault_tx_bn_mark"),
      find("transport.cnp_received"), find("transport.window_cuts"), find("req_retransmits"), find("ack_timeouts"), find("fault_tx_bn_pause"),
      "" if sys.argv[6] == "0/0" else "exit " + sys.argv[6]))
w = json.loads(sys.argv[7]).get("early")
if w:
    print("      from 0.5 s for 2 s: %.0f Mb/s, per QP %.1f-%.1f, Jain %.4f, queue %.1f KB mean, %.2f%% of the frames >= Kmax" % (
          w["total_mbps"], min(w["mbps"].values()), max(w["mbps"].values()), w["jain"],
          w["queue"]["mean_bytes"] / 1000, 100 * w["queue"]["over_kmax"]))
if sys.argv[8] == "1":
    on = sys.argv[4] == "on"
    drops, rtx = find("fault_tx_bn_drop"), find("req_retransmits")
    bad = []
    if sys.argv[6] != "0/0": bad.append("ib_write_bw exit " + sys.argv[6])
    if on and (drops or rtx): bad.append("with DCQCN %d drops, %d retransmits (want 0)" % (drops, rtx))
    if not on and not (drops and rtx): bad.append("without DCQCN %d drops, %d retransmits (want both > 0)" % (drops, rtx))
    if on and not (w and len(w["mbps"]) == int(sys.argv[9]) and w["jain"] >= float(sys.argv[10])):
        bad.append("with DCQCN Jain of %d QPs under %s" % (int(sys.argv[9]), sys.argv[10]))
    if on and not (w and w["queue"] and w["queue"]["mean_bytes"] < 100000):
        bad.append("with DCQCN the mean queue not under Kmax")
    for x in bad: print("FAIL round %s %s: %s" % (sys.argv[3], sys.argv[4], x))
    sys.exit(1 if bad else 0)
EOF
    echo "      $mid"
  done
done
if [ "$CHECK" = 1 ]; then
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  [ "$fail" = 0 ] && echo "ok: $ROUNDS rounds" || echo "FAIL"
  exit "$fail"
fi
exit 0

#!/usr/bin/env bash
# DCQCN fairness between two droced nodes through a bottleneck with PFC (issue
# 13), the test of what test/engine/bn_pair.sh measures: Debian's ib_write_bw
# through the drop-in libibverbs, client on node B writing to the server on
# node A (af_packet on a veth pair in a namespace of its own); B's TX goes
# through the fault injector's bottleneck ([port.fault.tx.bottleneck]: BN_GBPS,
# RED/ECN between Kmin 5 KB and Kmax 100 KB (Pmax 1 at Kmax) marking on
# departure, PFC Xoff 300 KB / Xon 200 KB, tail drop at 400 KB). test/engine/qp_rates.py samples
# B's RC QPs (droce-ctl qps: tx_bytes, the payload each QP sent) every
# SAMPLE_MS and computes each QP's rate and Jain's index over a window after
# convergence. Runs, DCQCN switched on B with droce-ctl dcqcn set:
#   on:  QPS QPs for ON_SECS; LATE_QPS more (a second ib_write_bw) join LATE_AT
#        seconds later. Checks: no drop; Jain of the first QPS QPs >= JAIN_MIN
#        from SKIP s for WIN s (before the late ones); in the window from SKIP s
#        after the late ones start, Jain of all >= JAIN_MIN and the late QPs'
#        mean rate >= LATE_MIN of the early ones' (their share).
#   off: QPS QPs for OFF_SECS: no drop either (PFC); from SKIP s, at least 100
#        pauses per second and PAUSE_X times those of the QPS QPs with DCQCN in
#        their window and after the late QPs joined (only when the runs fill
#        >= 85% of the bottleneck in those windows:
#        a sender short of CPU pauses after its stalls, DCQCN or not).
#   on4: SMALL_QPS QPs for SMALL_SECS with DCQCN: Jain >= JAIN_MIN, no drop.
#   on2: TWO_QPS QPs for SMALL_SECS with DCQCN: the same checks.
# The queue (qp_rates.py, from B's port counters fault_tx_bn_frames,
# _bn_over_kmax, _bn_queue_sum): in each DCQCN window above (on's two, on4's,
# on2's) the mean queue the frames found is under Kmax, and at most KMAX_SHARE
# of them found it at Kmax or more with 2 and 4 QPs, KMAX_SHARE16 with 16,
# KMAX_SHARE20 with the 20 after the join (the queue rises with the number of
# QPs: measured 2026-12-06, 13 runs, 0% / 0.9-7.7% / 13.5-26.3%, means 6-12 KB /
# 51-59 KB / 69-78 KB; without DCQCN 97-99.8%, 240-247 KB, checked >= 0.5 when the
# bottleneck binds; the 16 and 20 QPs' checked when their window carried >= 85%
# of it). DCQCN's AI/HAI are the paper's 40/200 Mb/s at 40 Gb/s
# scaled to 1 Gb/s (1 and 5 Mb/s): with 5 and 50 the 16 QPs' queue rode at
# Kmax (30% of frames >= Kmax, 53% with 20; with RED's Pmax 0.2, 69% and 85%).
# Prints each run's counters (differences of droce-ctl counters on B) and the
# windows; exit 1 if a check fails.
#   bn_fair.sh DROCED DROCE_CTL FRONT_LIBDIR
# Environment (defaults are the meson test's): BN_GBPS=1 QPS=16 LATE_QPS=4
#   LATE_AT=7 ON_SECS=14 OFF_SECS=5 SMALL_QPS=4 SMALL_SECS=6 SKIP=3 WIN=3
#   SAMPLE_MS=250 JAIN_MIN=0.95 LATE_MIN=0.5 PAUSE_X=4 LINE_MBPS=1000 TWO_QPS=2
#   KMAX_SHARE=0.05 KMAX_SHARE16=0.2 KMAX_SHARE20=0.4 PMAX=1.0 STALL_HOLD_US=500
#   AI_MBPS=1 HAI_MBPS=5 WINDOW_US=0 (dcqcn window_us)
#   KEEP=DIR (keep the samples, DIR/RUN.jsonl)
set -uo pipefail
DROCED=$1
CTL=$2
LIBDIR=$3
BN_GBPS=${BN_GBPS:-1}
QPS=${QPS:-16}
LATE_QPS=${LATE_QPS:-4}
LATE_AT=${LATE_AT:-7}
ON_SECS=${ON_SECS:-14}
OFF_SECS=${OFF_SECS:-5}
SMALL_QPS=${SMALL_QPS:-4}
SMALL_SECS=${SMALL_SECS:-6}
TWO_QPS=${TWO_QPS:-2}
KMAX_SHARE=${KMAX_SHARE:-0.05}
KMAX_SHARE16=${KMAX_SHARE16:-0.2}
KMAX_SHARE20=${KMAX_SHARE20:-0.4}
PMAX=${PMAX:-1.0}
STALL_HOLD_US=${STALL_HOLD_US:-500}
AI_MBPS=${AI_MBPS:-1}
HAI_MBPS=${HAI_MBPS:-5}
WINDOW_US=${WINDOW_US:-0}
SKIP=${SKIP:-3}
WIN=${WIN:-3}
SAMPLE_MS=${SAMPLE_MS:-250}
JAIN_MIN=${JAIN_MIN:-0.95}
LATE_MIN=${LATE_MIN:-0.5}
PAUSE_X=${PAUSE_X:-4}
HERE=$(dirname "$0")
ns=droce-bnf-$$
T=$(mktemp -d /tmp/droce-bn-fair-XXXXXX)
pids=()
jobs_=()
pass=0
fail=0
# shellcheck source=../lib/droced_start.sh
source "$HERE/../lib/droced_start.sh"
cleanup() {
  local p
  for p in "${jobs_[@]}"; do kill -KILL "$p" 2>/dev/null; done
  droced_node_stop "${pids[@]}"
  ip netns del "$ns" 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$T"/*.jsonl "$KEEP"/ 2>/dev/null; fi
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
# shellcheck source=../lib/netns.sh
source "$HERE/../lib/netns.sh"  # droce_veth_ns, AFP_RUN
if ! droce_veth_ns "$ns"; then echo "SKIP: cannot create network namespaces"; exit 77; fi
in_ns() { ip netns exec "$ns" "$@"; }
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
node() {
  DN_TIMEOUT=300 DN_DEVARGS=,framecnt=16384 DN_AFP_RUN=$AFP_RUN DN_PORT_TOML=$6 \
    droced_node "$1" "$ns" "$2" "$3" "$4" "$5" "$T" "$DROCED"
  local rc=$?
  pids+=("$DN_PID")
  return $rc
}
BN=$'[port.fault.tx.bottleneck]\n'"rate_gbps = $BN_GBPS"$'\nkmin_bytes = 5000\nkmax_bytes = 100000\npmax = '"$PMAX"$'\nlimit_bytes = 400000\nmark_dequeue = true\npfc_xoff_bytes = 300000\npfc_xon_bytes = 200000'
# DCQCN off at start; bn_pair.sh's parameters with validate_rate, stall_hold_us
# (as engine_perf_bottleneck_pfc16) and the paper's AI/HAI scaled to 1 Gb/s.
DQ="dcqcn = false"$'\n[port.dcqcn_params]\n'"line_rate_mbps = ${LINE_MBPS:-1000}"$'\nalpha_g = 1020\nalpha_update_period_us = 55\ntime_reset_us = 55\nbyte_reset = 156250\nthreshold = 5\nai_rate_mbps = '"$AI_MBPS"$'\nhai_rate_mbps = '"$HAI_MBPS"$'\nclamp_tgt_rate = 1\nvalidate_rate = 1\nstall_hold_us = '"$STALL_HOLD_US"$'\nwindow_us = '"$WINDOW_US"
# Two loops on a 2-CPU machine: A's core on CPU 1, B's on CPU 0.
if node a va 10.43.0.1 02:00:0a:2b:00:01 "0@0,1@1" "" && node b vb 10.43.0.2 02:00:0a:2b:00:02 "0@1,1@0" "$DQ"$'\n'"$BN"; then
  ok "two droced nodes, B's TX through a ${BN_GBPS} Gb/s bottleneck with PFC"
else
  bad "droced did not start"
  exit 1
fi
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Sanitizer build: the drop-in is instrumented, Debian's programs are not.
PRE=()
[ -n "${DROCE_TEST_PRELOAD:-}" ] && PRE=(env "LD_PRELOAD=$DROCE_TEST_PRELOAD")
out=$(DROCE_SOCKET=$T/a-verbs.sock timeout 10 "${PRE[@]}" ibv_devinfo -v 2>&1)
gidx=$(echo "$out" | sed -n 's/.*GID\[ *\([0-9]*\)\]:.*::ffff:10.43.0.1.*/\1/p' | head -n 1)
[ -n "$gidx" ] || { echo "no GID of 10.43.0.1 on node A:"; echo "$out"; exit 1; }
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
# pair QPS SECS LOG: an ib_write_bw server on A and its client on B (background,
# pid appended to jobs_ and in $pair_pid); waits (bounded) for the server to listen.
pair() {
  port=$((port + 1))
  DROCE_SOCKET=$T/a-verbs.sock in_ns timeout -k 5 $(($2 + 30)) "${PRE[@]}" ib_write_bw -x "$gidx" -q "$1" -D "$2" \
    -p "$port" >"$3.a" 2>&1 &
  jobs_+=($!)
  local _
  for _ in $(seq 50); do in_ns ss -ltn 2>/dev/null | grep -q ":$port " && break; sleep 0.1; done
  DROCE_SOCKET=$T/b-verbs.sock in_ns timeout -k 5 $(($2 + 30)) "${PRE[@]}" ib_write_bw -x "$gidx" -q "$1" -D "$2" \
    -p "$port" --report_gbits localhost >"$3" 2>&1 &
  pair_pid=$!
  jobs_+=($!)
}
# run NAME MODE QPS SECS [LATE_QPS LATE_AT LATE_SECS]: one run; leaves $T/NAME.res
# (JSON: counters' differences, seconds, ib_write_bw's Gb/s and exit codes, windows).
run() {
  local name=$1 mode=$2 q=$3 secs=$4 lq=${5:-0} lat=${6:-0} lsecs=${7:-0}
  "$CTL" -s "$T/b-ctl.sock" dcqcn set -p vb --dcqcn "$mode" >/dev/null || echo "dcqcn set failed"
  local before after t0 t1 rc1 rc2=0 sp p2=""
  before=$(snap b)
  python3 "$HERE/qp_rates.py" sample "$T/b-ctl.sock" "$T/$name.jsonl" "$SAMPLE_MS" $((secs + 40)) &
  sp=$!
  jobs_+=("$sp")
  t0=$(date +%s.%N)
  pair "$q" "$secs" "$T/$name.b1"
  local p1=$pair_pid
  if [ "$lq" -gt 0 ]; then
    sleep "$lat"
    pair "$lq" "$lsecs" "$T/$name.b2"
    p2=$pair_pid
  fi
  wait "$p1"; rc1=$?
  [ -n "$p2" ] && { wait "$p2"; rc2=$?; }
  t1=$(date +%s.%N)
  kill -TERM "$sp" 2>/dev/null
  wait "$sp" 2>/dev/null
  # The servers end with their clients (bounded by their timeout).
  local p
  for p in "${jobs_[@]}"; do [ "$p" != "$sp" ] && wait "$p" 2>/dev/null; done
  jobs_=()
  after=$(snap b)
  python3 - "$before" "$after" "$t0" "$t1" "$rc1/$rc2" "$T/$name.b1" "$T/$name.b2" \
    "$(python3 "$HERE/qp_rates.py" report "$T/$name.jsonl" --skip "$SKIP" --win "$WIN" --late-gap 2 --json)" \
    >"$T/$name.res" <<'EOF'
import json, re, sys
b, a = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def find(sub):
    return sum(a.get(k, 0) - b.get(k, 0) for k in a if k.endswith(sub))
def gbps(path):
    try:
        m = re.findall(r"^ *65536 +\d+ +\S+ +(\S+)", open(path).read(), re.M)
        return float(m[-1]) if m else None
    except OSError:
        return None
print(json.dumps({"secs": float(sys.argv[4]) - float(sys.argv[3]), "drops": find("fault_tx_bn_drop"),
                  "marks": find("fault_tx_bn_mark"), "pauses": find("fault_tx_bn_pause"),
                  "cnps": find("transport.cnp_received"), "retransmits": find("req_retransmits"),
                  "timeouts": find("ack_timeouts"), "rc": sys.argv[5], "gbps": [gbps(sys.argv[6]), gbps(sys.argv[7])],
                  "rates": json.loads(sys.argv[8])}))
EOF
  python3 - "$T/$name.res" "$name" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("%-4s %5.1f s  ib_write_bw %s Gb/s (exit %s)  drops %d  pauses %d (%.0f/s)  marks %d  cnps %d  retransmits %d  timeouts %d" % (
    sys.argv[2], r["secs"], "+".join("%.2f" % g for g in r["gbps"] if g is not None) or "?", r["rc"], r["drops"],
    r["pauses"], r["pauses"] / r["secs"], r["marks"], r["cnps"], r["retransmits"], r["timeouts"]))
EOF
  python3 "$HERE/qp_rates.py" report "$T/$name.jsonl" --skip "$SKIP" --win "$WIN" --late-gap 2
}
# get NAME EXPR: a value of NAME's result (python expression over r)
get() { python3 -c "import json; r = json.load(open('$T/$1.res')); print($2)" 2>/dev/null; }
check() {  # check DESC PYTHON-CONDITION-OVER-r NAME
  if [ "$(get "$3" "bool($2)")" = "True" ]; then ok "$1"; else bad "$1"; fi
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
run on on "$QPS" "$ON_SECS" "$LATE_QPS" "$LATE_AT" $((ON_SECS - LATE_AT - 1))
run off off "$QPS" "$OFF_SECS"
run on4 on "$SMALL_QPS" "$SMALL_SECS"
run on2 on "$TWO_QPS" "$SMALL_SECS"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
check "ib_write_bw ran (exit 0) with DCQCN, both of them" "r['rc'] == '0/0'" on
check "ib_write_bw ran (exit 0) without DCQCN" "r['rc'] == '0/0'" off
check "ib_write_bw ran (exit 0) with $SMALL_QPS QPs" "r['rc'] == '0/0'" on4
check "ib_write_bw ran (exit 0) with $TWO_QPS QPs" "r['rc'] == '0/0'" on2
check "DCQCN, $QPS + $LATE_QPS QPs: no drop (PFC)" "r['drops'] == 0" on
check "DCQCN, $QPS QPs: Jain >= $JAIN_MIN from ${SKIP} s" "r['rates']['early_n'] == $QPS and r['rates']['early']['jain'] >= $JAIN_MIN" on
check "DCQCN, late $LATE_QPS QPs: Jain of all >= $JAIN_MIN, late QPs' rate >= $LATE_MIN of the others'" \
  "r['rates'].get('late_n') == $LATE_QPS and r['rates']['late']['jain'] >= $JAIN_MIN and r['rates']['late']['late_ratio'] >= $LATE_MIN" on
check "without DCQCN: no drop either (PFC)" "r['drops'] == 0" off
# The pauses of the converged QPs (the early window, and the window after the
# late QPs joined), not of the whole run: the starts pause with DCQCN too.
# (After the join alpha used to collapse to 0 and the pauses came back as
# without DCQCN: alpha was kept in whole 1/1024 steps; lib/transport/dcqcn.cc.)
# Only when the bottleneck binds in both runs (>= 85% of BN_GBPS): a sender short
# of CPU (a CPU hog beside the test: ~0.55 Gb/s) pauses after each stall of its
# loop, with DCQCN as much as without (378/s and 534/s), and alpha collapses.
on_ps=$(get on "r['rates']['early']['pauses_per_s']")
late_ps=$(get on "r['rates']['late']['pauses_per_s']")
bind=$(python3 -c "import json
r = [json.load(open('$T/%s.res' % n))['rates'][w]['total_mbps'] for n, w in (('on', 'early'), ('on', 'late'), ('off', 'early'))]
print('yes' if min(r) >= 850 * $BN_GBPS else 'no (%.0f, %.0f and %.0f Mb/s)' % tuple(r))" 2>/dev/null)
if [ "$bind" = yes ]; then
  check "without DCQCN: >= 100 pauses/s and >= ${PAUSE_X}x the pauses per second with DCQCN from ${SKIP} s (${on_ps:-?}/s)" \
    "r['rates']['early']['pauses_per_s'] >= 100 and r['rates']['early']['pauses_per_s'] >= $PAUSE_X * ${on_ps:-1e9}" off
  check "without DCQCN: >= ${PAUSE_X}x the pauses per second with DCQCN after the late QPs joined (${late_ps:-?}/s)" \
    "r['rates']['early']['pauses_per_s'] >= $PAUSE_X * ${late_ps:-1e9}" off
else
  echo "skip the pauses' check: the sender did not fill the bottleneck: ${bind:-?}"
fi
check "DCQCN, $SMALL_QPS QPs: no drop, Jain >= $JAIN_MIN from ${SKIP} s" \
  "r['drops'] == 0 and r['rates']['early_n'] == $SMALL_QPS and r['rates']['early']['jain'] >= $JAIN_MIN" on4
check "DCQCN, $TWO_QPS QPs: no drop, Jain >= $JAIN_MIN from ${SKIP} s" \
  "r['drops'] == 0 and r['rates']['early_n'] == $TWO_QPS and r['rates']['early']['jain'] >= $JAIN_MIN" on2
# The queue under Kmax once converged, in each window with DCQCN: the mean
# queue the frames found, and the share of them that found Kmax (100 KB) or more.
# The 16 and 20 QPs' only when their window carried >= 85% of the bottleneck:
# a sender short of CPU sends bursts after its stalls, which pass Kmax whatever
# DCQCN does (the highest share measured, 26% with 20 QPs, was in the run that
# carried 0.82 Gb/s; engine_perf_bottleneck_pfc16 skips such runs too).
for w in on:early:$KMAX_SHARE16 on:late:$KMAX_SHARE20 on4:early:$KMAX_SHARE on2:early:$KMAX_SHARE; do
  IFS=: read -r n win lim <<<"$w"
  if [ "$n" = on ] && [ "$(get on "r['rates']['$win']['total_mbps'] >= 850 * $BN_GBPS")" != True ]; then
    echo "skip the queue's check in on's $win window: the sender carried $(get on "'%.0f' % r['rates']['$win']['total_mbps']") Mb/s," \
      "$(get on "'%.1f KB mean, %.2f%% of the frames >= Kmax' % (r['rates']['$win']['queue']['mean_bytes'] / 1000, 100 * r['rates']['$win']['queue']['over_kmax'])")"
    continue
  fi
  check "DCQCN, $n $win window: mean queue < Kmax, <= $lim of the frames found it >= Kmax ($(get "$n" \
    "'%.1f KB, %.2f%%' % (r['rates']['$win']['queue']['mean_bytes'] / 1000, 100 * r['rates']['$win']['queue']['over_kmax'])"))" \
    "r['rates']['$win']['queue']['mean_bytes'] < 100000 and r['rates']['$win']['queue']['over_kmax'] <= $lim" "$n"
done
off_q=$(get off "'%.1f KB, %.1f%%' % (r['rates']['early']['queue']['mean_bytes'] / 1000, 100 * r['rates']['early']['queue']['over_kmax'])")
if [ "$bind" = yes ]; then
  check "without DCQCN: >= 50% of the frames found the queue >= Kmax ($off_q)" "r['rates']['early']['queue']['over_kmax'] >= 0.5" off
else
  echo "without DCQCN: the queue $off_q (not checked: the sender did not fill the bottleneck)"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

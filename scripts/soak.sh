#!/usr/bin/env bash
# Soak (issue 9): mixed verbs traffic between two droced nodes for N minutes,
# with injected loss and clients SIGKILLed mid-run, sampling each daemon's
# hugepage use, RSS and open file descriptors; exit 1 if any of them grows
# after the warm-up (or a daemon dies, or a run that was not killed fails).
#
#   scripts/soak.sh [--minutes N] [--build DIR] [--csv FILE] [--loss P] [--interval S] [--workers W]
#     --minutes   run time (default 30; scripts/test.sh runs 2)
#     --build     build directory with droced, droce-ctl and the shim front (default build)
#     --csv       the samples (default DIR/soak/soak.csv); a summary goes next to it (.summary.txt)
#     --loss      probability each node's RX drops a frame (droce-ctl fault set, default 0.01)
#     --interval  seconds between samples (default 5)
#     --workers   client loops running at once (default 3)
#
# Two droced nodes from test/lib/droced_pair.sh (a namespace each, bridged).
# Each worker loops over Debian's ibv_rc_pingpong -c, ibv_srq_pingpong -c,
# ib_write_bw, ib_read_bw, ib_send_bw and ib_atomic_bw (server on node a,
# client on node b, through the shim); one run in three is SIGKILLed 1-3 s in
# (client, server or both). Every run's outcome goes to FILE's .runs.csv.
#
# Samples (CSV: t_s,node,rss_kb,hugetlb_kb,fds,clients,qps,mrs,phase), every
# --interval s under load ("run") and at idle checkpoints ("idle": before the
# first run, six times during the run, after the last): the droced process's
# VmRSS and HugetlbPages (/proc/PID/status: its own hugepages, which
# HugePages_Free cannot tell apart from other processes'), entries in
# /proc/PID/fd, and droce-ctl's live shim clients, QPs and MRs. At a
# checkpoint the workers finish their runs and wait, and both nodes must have
# dropped every client and QP (bounded wait) before the sample is taken.
#
# Verdict per node, after the warm-up (the first 20% of the run, at least
# 20 s): each idle sample may exceed the first idle sample after the warm-up
# by at most the tolerance (RSS: 5% or 8 MiB; hugepages: 4 MiB; fds: 2: the
# fd count follows the clients under load, so only idle samples judge it);
# under load the maximum RSS and hugepage use of the second half may exceed
# the first half's by at most the same tolerance; no client, QP or MR left at
# any checkpoint; no run saw corrupted data (the pingpongs' "invalid data");
# at most 5% of the runs that were not killed failed (a pingpong whose peer
# exits before the last ACK under loss ends in RETRY_EXC: they have no closing
# handshake); no droced died.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
minutes=30
build=$root/build
csv=
loss=0.01
interval=5
workers=3
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) minutes=$2; shift 2 ;;
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    --loss) loss=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
DROCED=$build/app/droced/droced
CTL=$build/app/droce-ctl/droce-ctl
LIBDIR=$build/lib/shim/front
for f in "$DROCED" "$CTL" "$LIBDIR/libibverbs.so.1"; do
  [ -e "$f" ] || { echo "soak.sh: $f missing (build first: ninja -C $build)" >&2; exit 2; }
done
[ -n "$csv" ] || csv=$build/soak/soak.csv
mkdir -p "$(dirname "$csv")"
runs=${csv%.csv}.runs.csv
summary=${csv%.csv}.summary.txt

T=$(mktemp -d /tmp/droce-soak-XXXXXX)
source "$root/test/lib/droced_pair.sh"
wpids=()
cleanup() {
  touch "$T/stop"
  for p in "${wpids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${wpids[@]}"; do wait "$p" 2>/dev/null; done
  droced_pair_down
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
DROCED_PAIR_TIMEOUT=$((minutes * 60 + 600)) droced_pair_up s 10.45.0 "$T" "$DROCED"
rc=$?
if [ $rc -eq 77 ]; then echo "SKIP: cannot create network namespaces"; exit 77; fi
if [ $rc -ne 0 ]; then echo "FAIL droced did not start"; exit 1; fi
gidx=$DP_GIDX
K=$DP_K
SA=$T/a-verbs.sock
SB=$T/b-verbs.sock
ctl() { "$CTL" -s "$T/$1-ctl.sock" --timeout 3000 "${@:2}"; }
for n in a b; do
  ctl "$n" fault set -p "v$n" -d rx --drop "$loss" >/dev/null || { echo "FAIL fault set on node $n"; exit 1; }
done
echo "soak: $minutes min, $workers workers, RX loss $loss on both nodes, a sample every ${interval}s -> $csv"

kinds=("ibv_rc_pingpong -g $gidx -n 300 -s 4096 -c"
       "ib_write_bw -x $gidx -s 65536 -n 200"
       "ibv_srq_pingpong -g $gidx -n 50 -c"
       "ib_read_bw -x $gidx -s 65536 -n 100"
       "ib_send_bw -x $gidx -s 4096 -n 500"
       "ib_atomic_bw -x $gidx -n 500")
echo "t_s,worker,kind,outcome" >"$runs"
t0=$(date +%s)

# worker W: runs kinds[(W + i) % n] until $T/stop exists; one run in three
# (at random) is SIGKILLed (client, server or both) 1-3 s after the client
# started. While $T/pause exists it waits (an idle checkpoint).
worker() {
  local w=$1 i=0 port=$((20000 + w * 2000)) k cmd name sp cp ra rb outcome victim
  while [ ! -e "$T/stop" ]; do
    if [ -e "$T/pause" ]; then  # an idle checkpoint: wait (at most 10 min) until it is over
      touch "$T/paused.$w"
      for _ in $(seq 3000); do [ -e "$T/pause" ] && [ ! -e "$T/stop" ] || break; sleep 0.2; done
      rm -f "$T/paused.$w"
      continue
    fi
    i=$((i + 1))
    k=$(((w + i) % ${#kinds[@]}))
    cmd=${kinds[$k]}
    name=${cmd%% *}
    for _ in $(seq 100); do
      port=$((port + 1))
      [ $port -ge $((21000 + w * 2000)) ] && port=$((20000 + w * 2000))
      [ -z "$(ip netns exec "$K" ss -Htan "sport = :$port" 2>/dev/null)" ] && break
    done
    # shellcheck disable=SC2086
    DROCE_SOCKET=$SA ip netns exec "$K" timeout 60 $cmd -p "$port" >"$T/w$w.a" 2>&1 &
    sp=$!
    for _ in $(seq 100); do
      [ -n "$(ip netns exec "$K" ss -Htln "sport = :$port" 2>/dev/null)" ] && break
      kill -0 "$sp" 2>/dev/null || break
      sleep 0.05
    done
    # shellcheck disable=SC2086
    DROCE_SOCKET=$SB ip netns exec "$K" timeout 60 $cmd -p "$port" localhost >"$T/w$w.b" 2>&1 &
    cp=$!
    outcome=
    if [ $((RANDOM % 3)) -eq 0 ]; then
      sleep "$((1 + RANDOM % 3))"  # chaos timing, not synchronisation: kill whatever is in flight
      case $((RANDOM % 3)) in
        0) victim=$(pgrep -P "$cp") ;;
        1) victim=$(pgrep -P "$sp") ;;
        *) victim="$(pgrep -P "$cp") $(pgrep -P "$sp")" ;;
      esac
      # shellcheck disable=SC2086
      [ -n "${victim// /}" ] && kill -KILL $victim 2>/dev/null && outcome=killed
      # Its partner may wait for a peer that is gone until its own timeout:
      # give it 5 s to notice, then kill it too.
      if [ -n "$outcome" ]; then
        for _ in $(seq 50); do kill -0 "$cp" 2>/dev/null || kill -0 "$sp" 2>/dev/null || break; sleep 0.1; done
        # shellcheck disable=SC2046
        kill -KILL $(pgrep -P "$cp") $(pgrep -P "$sp") 2>/dev/null
      fi
    fi
    wait "$cp" 2>/dev/null; rb=$?
    wait "$sp" 2>/dev/null; ra=$?
    if [ -z "$outcome" ]; then
      if grep -q "invalid data" "$T/w$w.a" "$T/w$w.b"; then
        outcome=corrupt  # the pingpongs' -c check prints this and still exits 0
        { echo "== worker $w run $i: $cmd: DATA CORRUPTED"; grep -h "invalid data" "$T/w$w.a" "$T/w$w.b" | head -n 3; } >>"$T/failures.txt"
      elif [ $ra -eq 0 ] && [ $rb -eq 0 ] && ! grep -qi "fail\|error\|couldn't" "$T/w$w.a" "$T/w$w.b"; then
        outcome=pass
      else
        outcome=fail
        { echo "== worker $w run $i: $cmd (exit $ra/$rb)"; tail -n 5 "$T/w$w.a" "$T/w$w.b"; } >>"$T/failures.txt"
      fi
    fi
    echo "$(($(date +%s) - t0)),$w,$name,$outcome" >>"$runs"
  done
}

# sample PHASE: one CSV row per node. droce-ctl's object counts only at idle
# checkpoints: under load the sample is /proc only (cheap on a loaded host).
sample() {
  local n pid rss huge fds shim= qps= mrs=
  for n in a b; do
    pid=$(droced_pair_node_pid "$n")
    if [ -z "$pid" ]; then echo "FAIL node $n's droced is gone"; return 1; fi
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
    huge=$(awk '/^HugetlbPages:/ {print $2}' "/proc/$pid/status")
    fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    if [ "$1" = idle ]; then
      shim=$(ctl "$n" --json call shim 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["clients"])' 2>/dev/null)
      qps=$(ctl "$n" --json qps 2>/dev/null | python3 -c 'import json,sys; print(len([q for q in json.load(sys.stdin)["qps"] if q["qpn"] != 1]))' 2>/dev/null)
      # Not counted: QP1 and the RDMA CM's own MR (its MAD buffers, `call shim` cm.*.mr_key), droced's for good.
      mrs=$(python3 -c 'import json,subprocess,sys
mrs = json.loads(sys.argv[1])["mrs"]
cm = json.loads(sys.argv[2]).get("cm", {})
own = {d.get("mr_key") for d in cm.values() if isinstance(d, dict)}
print(len([m for m in mrs if m.get("key") not in own]))' "$(ctl "$n" --json mrs 2>/dev/null)" "$(ctl "$n" --json call shim 2>/dev/null)" 2>/dev/null)
    fi
    echo "$(($(date +%s) - t0)),$n,$rss,${huge:-0},$fds,$shim,$qps,$mrs,$1" >>"$csv"
  done
}
# nodes_idle: no shim client and no QP left on either node (bounded wait, 10 s);
# QPN 1 is droced's own (the CM's QP1).
nodes_idle() {
  local n c q
  for _ in $(seq 100); do
    c=0
    for n in a b; do
      q=$(ctl "$n" --json call shim 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["clients"])' 2>/dev/null)
      [ "$q" = 0 ] || c=1
      q=$(ctl "$n" --json qps 2>/dev/null | python3 -c 'import json,sys; print(len([q for q in json.load(sys.stdin)["qps"] if q["qpn"] != 1]))' 2>/dev/null)
      [ "$q" = 0 ] || c=1
    done
    [ $c -eq 0 ] && return 0
    sleep 0.1
  done
  return 1
}
# checkpoint: the workers finish their runs and wait, the nodes drop every
# object, an "idle" sample is taken, the workers go on. The idle samples are
# the leak series: with no client, nothing should be left to hold memory or fds.
checkpoint() {
  touch "$T/pause"
  for _ in $(seq 1500); do  # a run ends within its 60 s timeout
    [ "$(find "$T" -maxdepth 1 -name 'paused.*' | wc -l)" -ge "$workers" ] && break
    sleep 0.1
  done
  local r=0
  if nodes_idle; then sample idle || r=1; else echo "FAIL objects left on a node at a checkpoint"; idle_ok=0; fi
  rm -f "$T/pause"
  return $r
}
echo "t_s,node,rss_kb,hugetlb_kb,fds,clients,qps,mrs,phase" >"$csv"
sample idle || exit 1  # before the first run
for w in $(seq 1 "$workers"); do
  worker "$w" 2>"$T/w$w.stderr" &  # bash's "Killed" job notices
  wpids+=($!)
done
end=$((t0 + minutes * 60))
cp_every=$((minutes * 10))  # six idle checkpoints per run (30 min: every 5 min; at least 30 s apart)
[ $cp_every -lt 30 ] && cp_every=30
next_cp=$((t0 + cp_every))
dead=0
idle_ok=1
while [ "$(date +%s)" -lt "$end" ]; do
  sample run || { dead=1; break; }
  if [ "$(date +%s)" -ge "$next_cp" ] && [ "$(date +%s)" -lt $((end - cp_every / 2)) ]; then
    checkpoint || { dead=1; break; }
    next_cp=$(($(date +%s) + cp_every))
  fi
  sleep "$interval"  # the sampling period
done
touch "$T/stop"
for p in "${wpids[@]}"; do wait "$p"; done
wpids=()
# Every client is gone: the nodes must drop all their objects.
if nodes_idle; then
  [ $dead -eq 0 ] && { sample idle || dead=1; }
else
  idle_ok=0
  [ $dead -eq 0 ] && { sample idle || dead=1; }
fi
[ -e "$T/failures.txt" ] && cat "$T/failures.txt"

python3 - "$csv" "$runs" "$minutes" "$dead" "$idle_ok" <<'EOF' | tee "$summary"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
runs = list(csv.DictReader(open(sys.argv[2])))
minutes, dead, idle = float(sys.argv[3]), sys.argv[4] == "1", sys.argv[5] == "1"
warm = max(20.0, 0.2 * minutes * 60)
ok = not dead
series = ("rss_kb", "hugetlb_kb", "fds")
tol = {"rss_kb": lambda m: max(8192, 0.05 * m), "hugetlb_kb": lambda m: 4096, "fds": lambda m: 2}
print(f"soak {minutes:g} min: {sum(r['phase'] == 'run' for r in rows) // 2} samples per node under load, "
      f"{sum(r['phase'] == 'idle' for r in rows) // 2} idle checkpoints, warm-up {warm:.0f} s")
for node in ("a", "b"):
    run = [r for r in rows if r["node"] == node and r["phase"] == "run" and float(r["t_s"]) >= warm]
    idl = [r for r in rows if r["node"] == node and r["phase"] == "idle"]
    ref = next((r for r in idl if float(r["t_s"]) >= warm), None)
    if len(run) < 4 or ref is None or ref is idl[-1]:
        print(f"FAIL node {node}: {len(run)} samples under load and {len(idl)} idle ones: too few after the warm-up")
        ok = False
        continue
    later = idl[idl.index(ref) + 1:]
    for k in series:
        v = [int(r[k]) for r in run]
        h1, h2 = v[: len(v) // 2], v[len(v) // 2:]
        base = int(ref[k])
        t = tol[k](base)
        grow = [int(r[k]) - base for r in later]
        good = max(grow) <= t
        # Under load RSS and hugepages may rise with the clients, never trend up
        # (fds follow the number of clients: only the idle series judges them).
        if k != "fds":
            good &= max(h2) <= max(h1) + tol[k](max(h1))
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} node {node} {k}: idle {' '.join(r[k] for r in idl)} "
              f"(after warm-up: +{max(grow)} at most, tolerance {t:.0f}); under load start {v[0]} end {v[-1]} "
              f"min {min(v)} max {max(v)} (max 1st half {max(h1)}, 2nd half {max(h2)})")
    left = {k: idl[-1][k] for k in ("clients", "qps", "mrs")}
    good = idle and all(v == "0" for v in left.values())
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} node {node} idle at every checkpoint and after the last run: {left}")
by = {}
for r in runs:
    by.setdefault(r["kind"], {}).setdefault(r["outcome"], 0)
    by[r["kind"]][r["outcome"]] += 1
for kind, c in sorted(by.items()):
    print(f"runs {kind}: " + ", ".join(f"{o} {n}" for o, n in sorted(c.items())))
fails = sum(c.get("fail", 0) for c in by.values())
passes = sum(c.get("pass", 0) for c in by.values())
corrupt = sum(c.get("corrupt", 0) for c in by.values())
# A pingpong under loss can end in RETRY_EXC when its peer exits before the
# last ACK arrives (ibv_*_pingpong have no closing handshake): a few failed
# runs are expected; many mean something broke.
if corrupt or not passes or fails > 0.05 * (fails + passes):
    print(f"FAIL {corrupt} runs with corrupted data, {fails} runs that were not killed failed, {passes} passed")
    ok = False
else:
    print(f"ok   {passes} runs passed, {fails} not killed failed (at most 5%), none with corrupted data")
if dead:
    print("FAIL a droced died")
print("soak: " + ("passed" if ok else "FAILED"))
sys.exit(0 if ok else 1)
EOF

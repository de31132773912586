#!/usr/bin/env bash
# scripts/afpacket-run against the collision it exists for: two af_packet
# processes in one network namespace whose PACKET_FANOUT group ids (DPDK 22.11
# net_af_packet: (pid ^ ifindex) & 0xffff) are equal. The collision is made on
# purpose: the second process is given the clashing process id (written to
# /proc/sys/kernel/ns_last_pid just before it is forked).
#   afpacket_run.sh [PATH/TO/droce-perf]
# With droce-perf, the same is also shown with real DPDK nodes: started
# directly at the clashing pid, the second node fails ("could not set
# PACKET_FANOUT"); through afpacket-run it starts.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
RUN=$root/scripts/afpacket-run
JOIN=$here/fanout_join.py
perf=${1:-}
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (network namespaces, ns_last_pid)"; exit 77; }
[ -w /proc/sys/kernel/ns_last_pid ] || { echo "SKIP: /proc/sys/kernel/ns_last_pid is not writable"; exit 77; }
ns=droce-afp-$$
T=$(mktemp -d /tmp/droce-afp-XXXXXX)
export DROCE_AFP_REGISTRY=$T/registry
pids=()
main_shell=$BASHPID
# Only the script itself cleans up: start_at kills a child that got the wrong
# pid, and a TERM that lands between its fork and exec runs this shell's traps
# in the child (seen under load: the child's exit removed $T and the
# namespace under the running test).
cleanup() {
  [ "$BASHPID" = "$main_shell" ] || return 0
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  ip netns del "$ns" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
trap '[ "$BASHPID" = "$main_shell" ] && exit 1; exit 143' INT TERM
source "$root/test/lib/netns.sh"
droce_veth_ns "$ns" || { echo "SKIP: cannot create network namespaces"; exit 77; }
ia=$(ip netns exec "$ns" cat /sys/class/net/va/ifindex)
ib=$(ip netns exec "$ns" cat /sys/class/net/vb/ifindex)
pid_max=$(cat /proc/sys/kernel/pid_max)
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

# wait_for FILE PATTERN: up to 20 s.
wait_for() {
  for _ in $(seq 1 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
# clash PID IFINDEX_OF_PID OTHER_IFINDEX: the process id that draws PID's fanout id on the other interface.
clash() { echo $(( ($1 ^ $2 ^ $3) & 0xffff )); }
# usable PID: a pid the kernel can hand out and nobody holds.
usable() { [ "$1" -gt 300 ] && [ "$1" -lt "$pid_max" ] && ! kill -0 "$1" 2>/dev/null; }
# start_at PID LOG CMD...: runs CMD in the background as process PID (sets STARTED);
# other processes of the machine may take the pid first: up to 100 tries.
start_at() {
  local want=$1 log=$2 p
  shift 2
  for _ in $(seq 1 100); do
    usable "$want" || return 1
    : >"$log"
    echo $((want - 1)) >/proc/sys/kernel/ns_last_pid
    "$@" >"$log" 2>&1 &
    p=$!
    if [ "$p" -eq "$want" ]; then STARTED=$p; pids+=("$p"); return 0; fi
    kill "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  return 1
}
# joiner IFACE LOG: a fanout_join.py on IFACE in the namespace, started normally; sets STARTED and GROUP.
joiner() {
  ip netns exec "$ns" python3 "$JOIN" "$1" >"$2" 2>&1 &
  STARTED=$!
  pids+=("$STARTED")
  wait_for "$2" "^joined" || return 1
  GROUP=$(awk '{print $3}' "$2")
}

# 1. A joins on vb; B, started directly as the pid that clashes on va, is refused.
for _ in $(seq 1 20); do  # A's pid must leave a usable clashing pid
  joiner vb "$T/a.log" || { bad "a process joins its fanout group on vb"; cat "$T/a.log"; exit 1; }
  pa=$STARTED ga=$GROUP
  target=$(clash "$pa" "$ib" "$ia")
  usable "$target" && break
  kill "$pa"; wait "$pa" 2>/dev/null
done
echo "A: pid $pa on vb (ifindex $ib): group $ga; the pid that draws it on va (ifindex $ia): $target"
if start_at "$target" "$T/b.log" ip netns exec "$ns" python3 "$JOIN" va; then
  wait "$STARTED" 2>/dev/null
  if grep -q "^refused $target $ga EINVAL" "$T/b.log"; then
    ok "without afpacket-run: pid $target on va draws group $ga too and is refused (EINVAL), as DPDK's port is"
  else
    bad "without afpacket-run, pid $target on va: expected a refusal, got: $(cat "$T/b.log")"
  fi
else
  bad "could not start a process as pid $target"
fi

# 2. The same pid through afpacket-run: it moves to a free group, and stays signalable through the parent.
if start_at "$target" "$T/c.log" ip netns exec "$ns" "$RUN" va python3 "$JOIN" va; then
  parent=$STARTED
  if wait_for "$T/c.log" "^joined"; then
    read -r _ pc gc <"$T/c.log"
    if [ "$pc" != "$target" ] && [ "$gc" != "$ga" ]; then
      ok "through afpacket-run: pid $target would clash, so it ran as pid $pc in group $gc"
    else
      bad "through afpacket-run: joined as pid $pc group $gc (A's group $ga)"
    fi
    kill -TERM "$parent"
    rc=0
    wait "$parent" || rc=$?
    gone=1
    for _ in $(seq 1 50); do kill -0 "$pc" 2>/dev/null || { gone=0; break; }; sleep 0.1; done
    if [ $gone -eq 0 ] && [ $rc -eq 0 ]; then
      ok "TERM to the launcher's pid reached the process (exit 0, pid $pc gone)"
    else
      bad "TERM to the launcher: exit $rc, pid $pc still there: $gone"
    fi
  else
    bad "through afpacket-run at pid $target: $(cat "$T/c.log")"
  fi
else
  bad "could not start a process as pid $target"
fi

# 3. A free pid: exec'd in place, no extra process.
ip netns exec "$ns" "$RUN" va python3 "$JOIN" va >"$T/d.log" 2>&1 &
pd=$!
pids+=("$pd")
if wait_for "$T/d.log" "^joined" && [ "$(awk '{print $2}' "$T/d.log")" = "$pd" ]; then
  ok "a free pid runs in place (pid $pd, the caller's \$!)"
else
  bad "a free pid: caller's pid $pd, log: $(cat "$T/d.log")"
fi
kill "$pd" 2>/dev/null
wait "$pd" 2>/dev/null

# 4. A process started through afpacket-run that has not opened its socket yet
# (here one that never does) still holds its group: the registry.
ip netns exec "$ns" "$RUN" vb python3 -c "import select; select.select([], [], [], 60)" >/dev/null 2>&1 &
pe=$!
pids+=("$pe")
wait_for "$DROCE_AFP_REGISTRY" "^$pe " || bad "the launched process is registered"
target=$(clash "$pe" "$ib" "$ia")
if usable "$target" && start_at "$target" "$T/f.log" ip netns exec "$ns" "$RUN" va python3 "$JOIN" va; then
  if wait_for "$T/f.log" "^joined" && [ "$(awk '{print $2}' "$T/f.log")" != "$target" ]; then
    ok "a registered process that has no socket yet keeps its group (pid $target moved to $(awk '{print $2}' "$T/f.log"))"
  else
    bad "registry: $(cat "$T/f.log")"
  fi
else
  echo "note: pid $target (clash with the registered process) not usable here; registry check skipped"
fi
kill "$pe" 2>/dev/null

# 5. Two nodes started back to back (no fork between them: consecutive pids, so
# for ifindex 2 and 3 they clash whenever the first pid is even): 10 pairs
# without the launcher (counted, shown), 10 through it (none may clash).
pairs() {  # pairs with|without: prints how many of 10 pairs had a refusal
  local n=0 a b
  for _ in $(seq 1 10); do
    if [ "$1" = with ]; then
      ip netns exec "$ns" "$RUN" vb python3 "$JOIN" vb >"$T/na.log" 2>&1 &
      a=$!
      ip netns exec "$ns" "$RUN" va python3 "$JOIN" va >"$T/nb.log" 2>&1 &
      b=$!
    else
      ip netns exec "$ns" python3 "$JOIN" vb >"$T/na.log" 2>&1 &
      a=$!
      ip netns exec "$ns" python3 "$JOIN" va >"$T/nb.log" 2>&1 &
      b=$!
    fi
    wait_for "$T/na.log" "joined\|refused"
    wait_for "$T/nb.log" "joined\|refused"
    grep -q refused "$T/na.log" "$T/nb.log" && n=$((n + 1))
    kill "$a" "$b" 2>/dev/null
    wait "$a" "$b" 2>/dev/null
  done
  echo "$n"
}
n_without=$(pairs without)
n_with=$(pairs with)
if [ "$n_with" -eq 0 ]; then
  ok "back-to-back pairs: $n_without of 10 clashed without afpacket-run, $n_with of 10 through it"
else
  bad "back-to-back pairs through afpacket-run: $n_with of 10 clashed ($n_without of 10 without it)"
fi

# 6. Real DPDK nodes (droce-perf servers: they probe net_af_packet, then wait for a client).
# Both checks start a node at the pid that clashes with the node on vb. Other
# processes of the machine (tests running beside this one) may take that pid
# between the two: then the attempt starts over with a new node on vb (new
# pid, new clashing pid), up to 5 times; only a finished attempt is reported.
if [ -n "$perf" ]; then
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  pids=()
  EAL=(--in-memory --no-pci --log-level=lib.eal:error)
  finished=0
  for attempt in 1 2 3 4 5; do
    # No timeout in front (it forks): the pid that draws the group must be droce-perf's own ($!).
    ip netns exec "$ns" "$perf" write_bw -p 19001 --device net_af_packet0,iface=vb --ip 10.60.0.2 \
      -- --lcores=0@1 "${EAL[@]}" >"$T/pa.log" 2>&1 &
    pa=$!
    pids+=("$pa")
    if ! wait_for "$T/pa.log" "waiting for the client"; then
      bad "droce-perf node on vb starts"; sed 's/^/  | /' "$T/pa.log"
      finished=1
      break
    fi
    target=$(clash "$pa" "$ib" "$ia")
    r1= r2=
    if start_at "$target" "$T/pb.log" ip netns exec "$ns" "$perf" write_bw -p 19002 --device net_af_packet1,iface=va \
        --ip 10.60.0.1 -- --lcores=0@0 "${EAL[@]}"; then
      pb=$STARTED
      for _ in $(seq 1 300); do kill -0 "$pb" 2>/dev/null || break; grep -q "waiting for the client" "$T/pb.log" && break; sleep 0.1; done
      if grep -q "could not set PACKET_FANOUT" "$T/pb.log" && ! grep -q "waiting for the client" "$T/pb.log"; then
        r1="ok real DPDK, without afpacket-run: the node at pid $target fails: $(grep -m1 -o 'could not set PACKET_FANOUT.*' "$T/pb.log")"
      else
        r1="bad real DPDK, without afpacket-run at pid $target: expected the PACKET_FANOUT failure: $(tr '\n' ' ' <"$T/pb.log")"
      fi
      kill "$pb" 2>/dev/null; wait "$pb" 2>/dev/null
      if start_at "$target" "$T/pc.log" ip netns exec "$ns" "$RUN" va "$perf" write_bw -p 19003 --device net_af_packet1,iface=va \
          --ip 10.60.0.1 -- --lcores=0@0 "${EAL[@]}"; then
        pc=$STARTED
        if wait_for "$T/pc.log" "waiting for the client"; then
          r2="ok real DPDK, through afpacket-run from pid $target: the node starts"
        else
          r2="bad real DPDK through afpacket-run from pid $target: $(tr '\n' ' ' <"$T/pc.log")"
        fi
        kill "$pc" 2>/dev/null; wait "$pc" 2>/dev/null
      fi
    fi
    kill "$pa" 2>/dev/null; wait "$pa" 2>/dev/null
    if [ -n "$r1" ] && [ -n "$r2" ]; then
      for r in "$r1" "$r2"; do
        case "$r" in ok\ *) ok "${r#ok }" ;; *) bad "${r#bad }" ;; esac
      done
      finished=1
      break
    fi
    echo "note: attempt $attempt: pid $target was taken by another process before both nodes ran; again with a new node on vb"
  done
  [ "$finished" -eq 1 ] || bad "5 attempts: another process took the clashing pid each time"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

#!/usr/bin/env bash
# A hostile network at a live droced node (issue 9): while data-checked
# transfers run between two droced nodes, a raw AF_PACKET socket sends every
# class of bad frame at node A (hostile_net.py); each class must show up in a
# drop counter, the transfers must complete with their data verified, and the
# daemon must still answer ping and droce-ctl afterwards.
#
# The nodes come from test/lib/droced_pair.sh: a namespace per node (va:
# droced A, 10.44.0.1; vb: droced B, 10.44.0.2) bridged with a kernel
# namespace K (br0, 10.44.0.9: the attacker's address) that runs the verbs
# programs, the attacker (sending and sniffing on pa, the kernel end of va)
# and ping.
# Node A also serves hostile_target: RC QPs whose peer is the attacker's
# address, the targets of the wrong-key, wrong-length, wild-VA and
# unsolicited-response classes (each refusal is fatal for its QP, as rxe's
# class C errors; the live transfer's QP is hit only by frames it must drop).
#
#   hostile_net.sh DROCED DROCE_CTL FRONT_LIBDIR HOSTILE_TARGET
set -uo pipefail
DROCED=$1
CTL=$2
LIBDIR=$3
TARGET=$4
ATTACK=$(dirname "$0")/hostile_net.py
T=$(mktemp -d /tmp/droce-hostile-XXXXXX)
source "$(dirname "$0")/../lib/droced_pair.sh"
pass=0
fail=0
cleanup() {
  [ -n "${tfd:-}" ] && exec 3>&-
  droced_pair_down
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
DROCED_PAIR_TIMEOUT=600 droced_pair_up h 10.44.0 "$T" "$DROCED"
rc=$?
if [ $rc -eq 77 ]; then echo "SKIP: cannot create network namespaces"; exit 77; fi
if [ $rc -ne 0 ]; then bad "droced did not start"; exit 1; fi
ok "two droced nodes, each in a namespace of its own, bridged with the kernel; IPv4 GID index $DP_GIDX"
K=$DP_K
gidx=$DP_GIDX
APID=${DP_PIDS[0]}
ATTACKER_MAC=$(ip netns exec "$K" cat /sys/class/net/br0/address)
SA=$T/a-verbs.sock
SB=$T/b-verbs.sock
in_k() { ip netns exec "$K" "$@"; }
pre=(env)
[ -n "${DROCE_TEST_PRELOAD:-}" ] && pre=(env LD_PRELOAD="$DROCE_TEST_PRELOAD" ASAN_OPTIONS=detect_leaks=0)

port=$((20000 + RANDOM % 20000))
next_port() {
  for _ in $(seq 100); do
    port=$((port + 1))
    [ -z "$(in_k ss -Htln "sport = :$port" 2>/dev/null)" ] && return
  done
}
# pingpong LOG N: one data-checked ibv_rc_pingpong (-c: the receiver checks
# every message), server on node A, client on node B; 0 if both report success.
pingpong() {
  next_port
  DROCE_SOCKET=$SA in_k timeout 120 "${pre[@]}" ibv_rc_pingpong -g "$gidx" -n "$2" -s 4096 -c -p "$port" >"$1.a" 2>&1 &
  local sp=$!
  for _ in $(seq 100); do
    [ -n "$(in_k ss -Htln "sport = :$port" 2>/dev/null)" ] && break
    kill -0 "$sp" 2>/dev/null || break
    sleep 0.05
  done
  DROCE_SOCKET=$SB in_k timeout 120 "${pre[@]}" ibv_rc_pingpong -g "$gidx" -n "$2" -s 4096 -c -p "$port" localhost >"$1.b" 2>&1
  local rb=$?
  wait "$sp"
  local ra=$?
  # -c prints "invalid data in page N" on a mismatch and still exits 0.
  [ $ra -eq 0 ] && [ $rb -eq 0 ] && grep -q "iters in" "$1.b" && ! grep -qi "fail\|error\|couldn't\|invalid data" "$1.a" "$1.b"
}
if pingpong "$T/pp0" 100; then ok "ibv_rc_pingpong -c between the nodes before the attack"; else
  bad "ibv_rc_pingpong before the attack"; tail -n 5 "$T/pp0.a" "$T/pp0.b"; exit 1; fi

# The attacker's target QPs on node A.
mkfifo "$T/tin"
DROCE_SOCKET=$SA in_k timeout 300 "${pre[@]}" "$TARGET" 10.44.0.9 "$gidx" 7 <"$T/tin" >"$T/target.txt" 2>&1 &
tpid=$!
exec 3>"$T/tin"
tfd=1
for _ in $(seq 100); do
  grep -q "^ready" "$T/target.txt" && break
  kill -0 "$tpid" 2>/dev/null || break
  sleep 0.1
done
if grep -q "^ready" "$T/target.txt"; then ok "hostile_target: 7 RC QPs on node A towards the attacker's address"; else
  bad "hostile_target did not start"; cat "$T/target.txt"; exit 1; fi

# Data-checked transfers back to back until the attack is over (at most 60).
(
  i=0
  while [ ! -e "$T/stop" ] && [ $i -lt 60 ]; do
    i=$((i + 1))
    if pingpong "$T/loop$i" 1000; then echo "pass $i"; else
      echo "fail $i"; tail -n 5 "$T/loop$i.a" "$T/loop$i.b" | sed 's/^/    /'; fi
  done
) >"$T/transfers.txt" 2>&1 &
lpid=$!
in_k timeout 240 python3 "$ATTACK" --ctl "$CTL" --sock "$T/a-ctl.sock" --iface pa --node-ip 10.44.0.1 \
  --node-mac 02:00:0a:2c:00:01 --peer-ip 10.44.0.2 --attacker-ip 10.44.0.9 --attacker-mac "$ATTACKER_MAC" \
  --target "$T/target.txt" >"$T/attack.txt" 2>&1
arc=$?
running=0
kill -0 "$lpid" 2>/dev/null && running=1
touch "$T/stop"
sed 's/^/       /' "$T/attack.txt"
if [ $arc -eq 0 ]; then ok "every class of hostile frame counted in a drop counter of node A"; else
  bad "hostile frames: $(tail -n 1 "$T/attack.txt")"; fi
wait "$lpid"
np=$(grep -c "^pass" "$T/transfers.txt")
nf=$(grep -c "^fail" "$T/transfers.txt")
if [ "$running" -eq 1 ] && [ "$np" -ge 1 ] && [ "$nf" -eq 0 ]; then
  ok "transfers during the attack: $np ibv_rc_pingpong -c -n 1000 -s 4096 runs, all with their data verified"
else
  bad "transfers during the attack: $np passed, $nf failed (still running at the end of the attack: $running)"
  cat "$T/transfers.txt"
fi

# The target QPs: the refused requests moved theirs to ERR, the unsolicited
# responses left theirs alone, and no hostile byte reached the MR.
echo done >&3
exec 3>&-
tfd=
wait "$tpid"
trc=$?
want="qp 0 state=ERR qp 1 state=ERR qp 2 state=ERR qp 3 state=ERR qp 4 state=ERR qp 5 state=ERR qp 6 state=RTS"
got=$(grep "^qp [0-9] state=" "$T/target.txt" | tr '\n' ' ' | sed 's/ $//')
if [ $trc -eq 0 ] && grep -q "mr pattern intact" "$T/target.txt" && [ "$got" = "$want" ]; then
  ok "target MR untouched; refused QPs in ERR, the one sent ghost responses still RTS"
else
  bad "target after the attack (exit $trc): $got"; cat "$T/target.txt"
fi

# The node still answers the kernel and droce-ctl, and still moves data.
if kill -0 "$APID" 2>/dev/null; then ok "droced A alive"; else bad "droced A died"; fi
if in_k ping -c 3 -i 0.2 -W 2 10.44.0.1 >"$T/ping.txt" 2>&1; then ok "kernel ping of node A answered"; else
  bad "ping of node A"; cat "$T/ping.txt"; fi
if "$CTL" -s "$T/a-ctl.sock" status >"$T/status.txt" 2>&1 && "$CTL" -s "$T/a-ctl.sock" --json qps >/dev/null 2>&1; then
  ok "droce-ctl status / qps answered"
else
  bad "droce-ctl after the attack"; cat "$T/status.txt"
fi
if pingpong "$T/pp9" 200; then ok "ibv_rc_pingpong -c after the attack"; else
  bad "ibv_rc_pingpong after the attack"; tail -n 5 "$T/pp9.a" "$T/pp9.b"; fi
echo "node A's drop counters:"
"$CTL" -s "$T/a-ctl.sock" counters -n 2>/dev/null | grep -E "rx_(drop|parse|icrc|no_qp|bad)|ghost|err_nak" | sed 's/^/       /'
for n in a b; do
  if grep -qi "critical\|assert\|sanitizer" "$T/$n.log"; then bad "node $n log has errors"; tail -n 20 "$T/$n.log" | sed "s/^/  $n| /"; fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

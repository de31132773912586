#!/usr/bin/env bash
# Interoperability of droce with Linux Soft-RoCE (rdma_rxe) in QEMU guests,
# through the harness in ../shared/rxe-peer (README there). droce runs as
# build/app/droce-interop/droce-interop on net_af_packet bound to a veth in the
# harness's namespace; the peer runs Debian's unmodified ibv_*_pingpong in a guest.
# Every run is captured (tshark, in the namespace); every RoCEv2 packet droce
# sent is checked with droce-pcap (ICRC, decode) and tshark (no malformed or
# error-level expert mark). Prints a table at the end.
#
#   scripts/interop.sh [--ci | --full] [--keep-guests]
#     --ci    (default) the CI subset: RC/UC/UD pingpong both directions at MTU 1024,
#             RC with 1% loss on each side; a few minutes under TCG
#     --full  also larger messages, more iterations, MTU 4096 (guest MTU 9000), more loss runs
# Exit status: 0 all passed, 1 a run failed, 77 skipped (no harness / QEMU / root /
# the guest cannot boot): scripts/test.sh counts 77 as skipped, never as passed.
# Environment: RXEPEER (path of the rxepeer CLI), RXEPEER_NS (namespace, default rxepeer),
#   INTEROP_IFACE (veth name, default dpdk0), INTEROP_OUT (captures, default build/interop),
#   INTEROP_ONLY (a glob: run only the matching tests, e.g. 'ud_*'), INTEROP_MTU (only runs at this MTU).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
SKIP=77

mode=ci
keep=0
for a in "$@"; do
  case $a in
    --ci) mode=ci ;;
    --full) mode=full ;;
    --keep-guests) keep=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "interop.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

skip() {
  echo "################################################################" >&2
  echo "## interop: SKIPPED: $*" >&2
  echo "## (no rxe peer available: this is NOT a pass)" >&2
  echo "################################################################" >&2
  exit $SKIP
}

# The harness sits beside the clone (CI: shared/ next to it); a worktree under wt/ looks one level up.
if [ -z "${RXEPEER:-}" ]; then
  for c in "$root/../shared/rxe-peer/rxepeer" "$root/../../shared/rxe-peer/rxepeer"; do
    [ -x "$c" ] && { RXEPEER=$(cd "$(dirname "$c")" && pwd)/rxepeer; break; }
  done
  RXEPEER=${RXEPEER:-$root/../shared/rxe-peer/rxepeer}
fi
NS=${RXEPEER_NS:-rxepeer}
export RXEPEER_NS=$NS
IFACE=${INTEROP_IFACE:-dpdk0}
OUT=${INTEROP_OUT:-$root/build/interop}
TOOL=$root/build/app/droce-interop/droce-interop
PCAPTOOL=$root/build/app/droce-pcap
DROCE_IP=10.77.0.100
G1=iop1
G1_IP=10.77.0.1
BR_IP=10.77.0.254  # the harness's bridge address: kernel TCP of this namespace for the exchanges

[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, QEMU)"
[ -x "$RXEPEER" ] || skip "the rxe-peer harness is not at $RXEPEER"
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed"
command -v tshark >/dev/null || skip "tshark is not installed"
[ -f "${RXEPEER_WORK:-/var/tmp/rxe-peer}/setup.env" ] || skip "the harness is not set up (run: $RXEPEER setup)"
for b in "$TOOL" "$PCAPTOOL"; do
  if [ ! -x "$b" ]; then
    [ -f "$root/build/build.ninja" ] && timeout 1200 ninja -C "$root/build" -j2 app/droce-interop/droce-interop app/droce-pcap >/dev/null
    [ -x "$b" ] || { echo "interop: $b is not built (and could not be built)" >&2; exit 1; }
  fi
done
mkdir -p "$OUT"
rm -f "$OUT"/*.pcap "$OUT"/*.log

rx() { timeout -k 5 "$1" "$RXEPEER" "${@:2}"; }  # rx SECONDS ARGS...: every harness call bounded

guests=()
cleanup() {
  local g
  [ -n "${TSHARK_PID:-}" ] && kill -INT "$TSHARK_PID" 2>/dev/null
  [ -n "${DROCE_PID:-}" ] && kill -TERM "$DROCE_PID" 2>/dev/null
  if [ $keep -eq 0 ]; then
    for g in "${guests[@]}"; do rx 60 stop "$g" >/dev/null 2>&1; done
    rx 30 detach "$IFACE" >/dev/null 2>&1
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# boot_guest NAME IP MTU: boots (or reboots) one guest and attaches the veth with that MTU.
boot_guest() {
  local name=$1 ip=$2 mtu=$3
  CUR_MTU=$mtu
  rx 60 stop "$name" >/dev/null 2>&1
  rx 30 detach "$IFACE" >/dev/null 2>&1
  echo "== booting guest $name ($ip, MTU $mtu)"
  if ! rx 240 start "$name" --ip "$ip/24" --mtu "$mtu" --timeout 200 >"$OUT/boot-$name.log" 2>&1; then
    tail -n 20 "$OUT/boot-$name.log" >&2
    rx 20 console "$name" 2>/dev/null | tail -n 20 >&2
    rx 60 stop "$name" >/dev/null 2>&1
    if ((${#ROWS[@]})); then  # a reboot in the middle of the matrix: results so far must not turn into a skip
      echo "interop: guest $name could not be rebooted after ${#ROWS[@]} runs (see $OUT/boot-$name.log)" >&2
      exit 1
    fi
    skip "guest $name could not boot (see $OUT/boot-$name.log)"
  fi
  guests+=("$name")
  grep -E "RXEPEER_(GID|ACTIVE_MTU|KERNEL|ACCEL|UPTIME)" "$OUT/boot-$name.log" | sed 's/^/   /'
  rx 30 attach "$IFACE" --mtu "$mtu" >"$OUT/attach.log" 2>&1 || { cat "$OUT/attach.log" >&2; exit 1; }
  ip netns exec "$NS" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null
  ip netns exec "$NS" ip link set "$IFACE" mtu "$mtu" 2>/dev/null
}

# capture_start FILE / capture_stop
capture_start() {
  ip netns exec "$NS" timeout -k 5 900 tshark -q -i "$IFACE-br" -f "udp port 4791" -F pcap -w "$1" >"$1.tshark.log" 2>&1 &
  TSHARK_PID=$!
  local i
  for i in $(seq 1 100); do
    grep -q "Capturing on" "$1.tshark.log" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "interop: tshark did not start capturing" >&2
}
capture_stop() {
  sleep 0.5
  kill -INT "$TSHARK_PID" 2>/dev/null
  wait "$TSHARK_PID" 2>/dev/null
  TSHARK_PID=
}

# check_capture PCAP: every RoCEv2 frame droce sent: ICRC (droce-pcap) and the Wireshark dissector.
# Prints "packets/bad_icrc/malformed".
check_capture() {
  local pcap=$1 mine=${1%.pcap}.droce.pcap mac=$2
  tshark -r "$pcap" -Y "eth.src==$mac" -F pcap -w "$mine" >/dev/null 2>&1
  local n bad mal
  n=$(tshark -r "$mine" 2>/dev/null | wc -l)
  bad=$("$PCAPTOOL" -q "$mine" 2>/dev/null | sed -n 's/.* \([0-9]*\) bad.*/\1/p' | head -1)
  [ -n "$bad" ] || bad=$([ "$n" -eq 0 ] && echo 0 || echo "?")
  # UDP checksum 0 over IPv6 is flagged as an error by Wireshark (RFC 8200 8.1); rxe sends the
  # same (the ICRC covers the packet), so it is reported apart, not as malformed.
  # Wireshark tries heuristic upper-layer dissectors (RPC-over-RDMA, Ethertype/CRTP, SMB Direct, ...)
  # on every SEND payload and marks short or random payloads "Malformed" whoever sends them (a
  # synthetic 1-byte RC SEND of the pingpong's 0x7b bytes is flagged): those say nothing about
  # RoCE, so they are turned off; the InfiniBand/RoCE dissector itself stays fully checked.
  local heur=(rpcrdma_infiniband smb_direct_infiniband smcr_infiniband iser_infiniband lnet_ib sdp_infiniband
              fc_infiniband eth_over_ib) topt=() h out
  for h in "${heur[@]}"; do topt+=(--disable-heuristic "$h"); done
  if out=$(tshark "${topt[@]}" -r "$mine" -Y "_ws.malformed || !infiniband || (_ws.expert.severity >= error && !(ipv6 && udp.checksum == 0))" 2>/dev/null); then
    mal=$(printf '%s' "$out" | grep -c .)
  else
    mal="?"  # this tshark does not know one of the heuristic names: fail loudly rather than pass
  fi
  echo "$n/$bad/$mal"
}

ROWS=()
FAILS=0
RETRIES=0
# run_one TEST DIRECTION MTU LOSS SIZE ITERS
#   DIRECTION: d2r (droce client -> rxe server) | r2d (rxe client -> droce server)
#   LOSS: 0 | droce:P (droce drops P of its received and sent frames) | rxe:P (netem in the guest, percent)
#         | rnr:MS (droce keeps one receive posted and reposts it MS ms late: the peer meets RNR NAKs)
#         | ipv6 (no loss, GID index 0 on both sides: RoCEv2 over IPv6 link-local)
run_one() {
  local test=$1 dir=$2 mtu=$3 loss=$4 size=$5 iters=$6
  [[ -z "${INTEROP_ONLY:-}" || "$test" == $INTEROP_ONLY ]] || return 0
  local tag="$test-$dir-$mtu-${loss//[:.]/_}-$size"
  local pcap="$OUT/$tag.pcap" dlog="$OUT/$tag.droce.log" glog="$OUT/$tag.guest.log"
  local bin=ibv_$test gargs=(-d rxe0 -g 1 -n "$iters" -s "$size") dargs=(-n "$iters" -s "$size" -m "$mtu")
  [ "$test" = ud_pingpong ] || gargs+=(-m "$mtu" -c)
  [ "$test" = ud_pingpong ] && gargs+=(-c)
  local dev="net_af_packet0,iface=$IFACE"
  [ "$mtu" -gt 1024 ] && dev="$dev,framesz=8192,blocksz=8192"
  local tmo=$((60 + iters / 5))
  [ "$loss" = 0 ] || tmo=$((tmo * 3))
  case $loss in
    droce:*) dargs+=(--fault-drop "${loss#droce:}" --fault-tx-drop "${loss#droce:}") ;;
    rnr:*) dargs+=(--lazy-recv "${loss#rnr:}") ;;
    ipv6) gargs[3]=0; dargs+=(-g 0) ;;  # GID index 0 on both sides: fe80:: link-local, RoCEv2 over IPv6
    rxe:*) rx 30 exec "$G1" --timeout 20 -- tc qdisc replace dev eth0 root netem loss "${loss#rxe:}%" >/dev/null ;;
  esac
  echo "== $test $dir MTU $mtu loss $loss size $size iters $iters"
  capture_start "$pcap"
  local drc grc
  if [ "$dir" = d2r ]; then
    local job
    job=$(rx 30 exec "$G1" --bg --timeout "$tmo" -- "$bin" "${gargs[@]}")
    sleep 1
    ip netns exec "$NS" timeout -k 5 "$tmo" "$TOOL" "$test" "$G1_IP" --device "$dev" --ip "$DROCE_IP" \
      --timeout "$((tmo - 5))" "${dargs[@]}" >"$dlog" 2>&1
    drc=$?
    rx $((tmo + 30)) wait "$G1" "$job" --timeout "$((tmo + 10))" >"$glog" 2>&1
    grc=$?
  else
    ip netns exec "$NS" timeout -k 5 "$tmo" "$TOOL" "$test" --device "$dev" --ip "$DROCE_IP" \
      --timeout "$((tmo - 5))" "${dargs[@]}" >"$dlog" 2>&1 &
    DROCE_PID=$!
    local i
    for i in $(seq 1 300); do grep -q "waiting for the client" "$dlog" 2>/dev/null && break; sleep 0.1; done
    rx $((tmo + 30)) exec "$G1" --timeout "$tmo" -- "$bin" "${gargs[@]}" "$BR_IP" >"$glog" 2>&1
    grc=$?
    wait "$DROCE_PID"
    drc=$?
    DROCE_PID=
  fi
  capture_stop
  case $loss in rxe:*) rx 30 exec "$G1" --timeout 20 -- tc qdisc del dev eth0 root >/dev/null 2>&1 ;; esac
  local chk n bad mal
  local mac
  mac=$(sed -n 's/^ device .* mac \([0-9a-f:]*\) gid.*/\1/p' "$dlog" | head -1)
  chk=$(check_capture "$pcap" "${mac:-00:00:00:00:00:00}")
  IFS=/ read -r n bad mal <<<"$chk"
  local dfig gfig retx
  dfig=$(sed -n 's/.*usec_per_iter=\([0-9.]*\) mbit=\([0-9.]*\).*/\1 us\/iter \2 Mb\/s/p' "$dlog" | tail -1)
  gfig=$(sed -n 's/.*iters in .* = \([0-9.]*\) usec\/iter.*/\1/p' "$glog" | tail -1)
  retx=$(grep -o "req_retransmits=[0-9]*\|dup_request=[0-9]*\|seq_nak_sent=[0-9]*\|seq_nak_received=[0-9]*\|rnr_nak_sent=[0-9]*\|rnr_nak_received=[0-9]*" "$dlog" |
         sed 's/req_retransmits/retx/;s/dup_request/dup/;s/seq_nak_sent/naks/;s/seq_nak_received/nakr/;s/rnr_nak_sent/rnrs/;s/rnr_nak_received/rnrr/' | tr '\n' ' ')
  local res=PASS
  if [ "$drc" -ne 0 ] || [ "$grc" -ne 0 ] || ! grep -q "result=PASS" "$dlog" || [ "$bad" != 0 ] || [ "$mal" != 0 ] || [ "$n" -eq 0 ]; then
    res=FAIL
    FAILS=$((FAILS + 1))
    echo "   FAILED (droce rc $drc, guest rc $grc, droce frames $n, bad ICRC $bad, malformed $mal)"
    grep -v "^EAL\|^TELEMETRY" "$dlog" | tail -n 8 | sed 's/^/   droce: /'
    tail -n 8 "$glog" | sed 's/^/   guest: /'
  fi
  local dirname
  [ "$dir" = d2r ] && dirname="droce->rxe" || dirname="rxe->droce"
  ROWS+=("$(printf '%-12s %-11s %-5s %-10s %-5s %-6s droce %-26s rxe %-9s %s| frames %s icrc-bad %s malformed %s' \
    "$test" "$dirname" "$mtu" "$loss" "$size" "$res" "${dfig:-?}" "${gfig:-?}us" "$retx" "$n" "$bad" "$mal")")
  echo "   ${ROWS[-1]}"
  [ $res = PASS ]
}

# The guest's virtio-net TX can stall for good under TCG after long bursts (seen at 64 KiB
# pingpongs: the guest's qdisc counts packets its tap never receives; ping gets no answer).
guest_ok() {
  local i
  for i in 1 2 3; do ip netns exec "$NS" ping -c 1 -W 2 "$G1_IP" >/dev/null 2>&1 && return 0; done
  return 1
}
# run_case ARGS...: run_one; if it failed and the guest stopped answering, reboot it and run again
# once; the row says so. A failure with a healthy guest stays a failure.
run_case() {
  [[ -z "${INTEROP_ONLY:-}" || "$1" == $INTEROP_ONLY ]] || return 0
  [[ -z "${INTEROP_MTU:-}" || "$3" == "$INTEROP_MTU" ]] || return 0
  if ! guest_ok; then
    echo "== guest $G1 does not answer ping: rebooting it"
    boot_guest "$G1" "$G1_IP" "$CUR_MTU"
  fi
  run_one "$@" && return 0
  guest_ok && return 1
  echo "   guest $G1 stopped answering (virtio-net TX stall under TCG): reboot, run again once"
  unset 'ROWS[-1]'
  FAILS=$((FAILS - 1))
  RETRIES=$((RETRIES + 1))
  boot_guest "$G1" "$G1_IP" "$CUR_MTU"
  run_one "$@"
  ROWS[-1]="${ROWS[-1]} [retried after a guest reboot]"
}

boot_guest "$G1" "$G1_IP" 1500
if [ $mode = ci ]; then
  for t in rc_pingpong uc_pingpong; do
    run_case $t d2r 1024 0 4096 200
    run_case $t r2d 1024 0 4096 200
  done
  run_case ud_pingpong d2r 1024 0 512 200
  run_case ud_pingpong r2d 1024 0 512 200
  run_case rc_pingpong d2r 1024 droce:0.01 4096 200
  run_case rc_pingpong r2d 1024 rxe:1 4096 200
  run_case rc_pingpong d2r 1024 rnr:5 4096 100
  run_case rc_pingpong r2d 1024 rnr:5 4096 100
  run_case rc_pingpong d2r 1024 ipv6 4096 100
  run_case rc_pingpong r2d 1024 ipv6 4096 100
else
  for s in 1 4096 65536; do
    run_case rc_pingpong d2r 1024 0 $s 500
    run_case rc_pingpong r2d 1024 0 $s 500
  done
  # UC has no recovery: a frame the TCG guest drops loses the message and stalls the pingpong.
  # 64-packet bursts (64 KiB) lost frames between the bridge and rxe in 1 of ~370 messages.
  for s in 1 4096 16384; do
    run_case uc_pingpong d2r 1024 0 $s 500
    run_case uc_pingpong r2d 1024 0 $s 500
  done
  for s in 2 512 1024; do
    run_case ud_pingpong d2r 1024 0 $s 500
    run_case ud_pingpong r2d 1024 0 $s 500
  done
  for l in droce:0.01 rxe:1; do
    run_case rc_pingpong d2r 1024 $l 65536 200
    run_case rc_pingpong r2d 1024 $l 65536 200
  done
  for t in rc_pingpong uc_pingpong ud_pingpong; do
    run_case $t d2r 1024 ipv6 512 300
    run_case $t r2d 1024 ipv6 512 300
  done
  run_case rc_pingpong d2r 1024 rnr:5 65536 200
  run_case rc_pingpong r2d 1024 rnr:20 4096 200
  boot_guest "$G1" "$G1_IP" 9000
  run_case rc_pingpong d2r 4096 0 65536 300
  run_case rc_pingpong r2d 4096 0 65536 300
  run_case uc_pingpong d2r 4096 0 16384 300
  run_case uc_pingpong r2d 4096 0 16384 300
  run_case ud_pingpong d2r 4096 0 4096 300
  run_case ud_pingpong r2d 4096 0 4096 300
fi

echo
echo "interop results ($mode; droce $DROCE_IP on $IFACE, rxe guest $G1 $G1_IP; captures in $OUT)"
printf '%-12s %-11s %-5s %-10s %-5s %-6s %s\n' test direction MTU loss/mode size result "figures | capture check (droce's packets)"
for r in "${ROWS[@]}"; do echo "$r"; done
echo "${#ROWS[@]} runs, $FAILS failed, $RETRIES retried after a guest reboot"
[ "$FAILS" -eq 0 ]

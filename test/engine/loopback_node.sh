#!/usr/bin/env bash
# Loopback through ONE droced node (lib/engine/README.md, Loopback): both ends
# of every connection are processes on the same droced, through the drop-in
# libibverbs / librdmacm, talking to the node's own GID (10.31.0.2, GID index
# 1); the TCP exchange of the pingpongs and perftest goes over the
# namespace's kernel loopback (localhost). droced runs two cores (the shim
# places each client on a core round robin, so server and client QPs are on
# different cores and frames cross through the SPSC rings) on an af_packet
# port whose kernel end only watches: no RoCE frame may reach it.
# Checks: Debian's ibv_rc_pingpong -g 1 -c, ibv_ud_pingpong, ib_write_bw,
# ib_read_lat, ib_atomic_bw, ib_send_bw -c UD, ib_send_bw with immediate
# data... each exits 0 without an error; rping -V (RDMA CM to itself: REQ,
# REP, RTU from QP1 to QP1 of the same port, data checked) and udaddy (SIDR
# to itself); then the port counters: frames looped back, none received from
# the wire, and the kernel's end of the veth saw no RoCE frame.
#   loopback_node.sh DROCED DROCE_CTL FRONT_DIR
set -uo pipefail
DROCED=$1
CTL=$2
FRONT=$3
ns=droce-lb-$$
T=$(mktemp -d /tmp/droce-lb-XXXXXX)
pid=
pass=0
fail=0
cleanup() {
  if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT INT TERM
if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
# In the background it execs (as cm_pair.sh's on()): $! is then the
# program's `timeout`, which passes the TERM of a failed pair on.
in_ns() {
  local x=
  [ "$BASHPID" != "$$" ] && x=exec
  $x ip netns exec "$ns" "$@"
}
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
ip -n "$ns" link set lo up
ip -n "$ns" link add vk type veth peer name vd
in_ns sysctl -qw net.ipv6.conf.vd.disable_ipv6=1
in_ns sysctl -qw net.ipv6.conf.vk.disable_ipv6=1
ip -n "$ns" link set vd up
ip -n "$ns" link set vk up
A=10.31.0.2
SOCK=$T/ctl.sock
VSOCK=$T/verbs.sock
cat >"$T/node.toml" <<EOF
[eal]
args = ["--in-memory", "--no-pci", "--log-level=lib.eal:error", "--log-level=pmd.net.af_packet:error"]
lcores = "0,1"
main_lcore = 0

[[port]]
name = "vd"
device = "net_af_packet0,iface=vd,qpairs=2,framecnt=4096"
mac = "02:00:0a:1f:00:02"
ipv4 = ["$A/24"]
rx_queues = 2
tx_queues = 2

[[core]]
lcore = 0
queues = [{ port = "vd", rx = 0 }]

[[core]]
lcore = 1
queues = [{ port = "vd", rx = 1, tx = 1 }]

[roce]
mr_memory_mb = 16

[control]
socket = "$SOCK"
mode = "0600"

[shim]
socket = "$VSOCK"
mode = "0600"

[log]
level = "info"
EOF
in_ns timeout -k 5 "${LOOPBACK_TIMEOUT:-500}" "$DROCED" --config "$T/node.toml" >"$T/droced.log" 2>&1 &
pid=$!
up=0
for _ in $(seq 1 150); do
  if [ -S "$SOCK" ] && [ -S "$VSOCK" ] && grep -q "running" "$T/droced.log"; then up=1; break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [ "$up" -ne 1 ]; then
  echo "FAIL droced did not start"; cat "$T/droced.log"; exit 1
fi
ok "droced starts (two cores on one af_packet port)"

# An ASan build's front needs the ASan runtime first (DROCE_TEST_PRELOAD).
pre=(env DROCE_SOCKET="$VSOCK" LD_LIBRARY_PATH="$FRONT")
[ -n "${DROCE_TEST_PRELOAD:-}" ] && pre+=(LD_PRELOAD="$DROCE_TEST_PRELOAD" ASAN_OPTIONS=detect_leaks=0)
rx_frames_vk() { in_ns cat /sys/class/net/vk/statistics/rx_packets; }
vk0=$(rx_frames_vk)

port=18600
# wait_listen PORT SERVER_PID: the server's TCP port listens (10 s at most).
wait_listen() {
  for _ in $(seq 1 100); do
    [ -n "$(in_ns ss -Htln "sport = :$1" 2>/dev/null)" ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# pair NAME CMD...: server and client of CMD on this one node (TCP exchange
# over localhost); both must exit 0 without reporting an error.
pair() {
  local name=$1
  shift
  port=$((port + 1))
  in_ns timeout 60 "${pre[@]}" "$@" -p "$port" >"$T/s.log" 2>&1 &
  local sp=$!
  local rc_c=1
  if wait_listen "$port" "$sp"; then
    in_ns timeout 60 "${pre[@]}" "$@" -p "$port" localhost >"$T/c.log" 2>&1
    rc_c=$?
  else
    echo "(server did not listen)" >"$T/c.log"
    kill -TERM "$sp" 2>/dev/null
  fi
  wait "$sp"
  local rc_s=$?
  # ibv_*_pingpong -c exits 0 even when its check fails: it only prints "invalid data".
  if [ $rc_s -eq 0 ] && [ $rc_c -eq 0 ] && ! grep -qi "fail\|error\|couldn't\|invalid data" "$T/s.log" "$T/c.log"; then
    ok "$name"
    grep -E '^ *[0-9]+ +[0-9]+ |bytes in .* seconds' "$T/c.log" | tail -n 2 | sed 's/^/       /'
  else
    bad "$name (server exit $rc_s, client exit $rc_c)"
    tail -n 12 "$T/s.log" | sed 's/^/  server| /'
    tail -n 12 "$T/c.log" | sed 's/^/  client| /'
  fi
}

pair "ibv_rc_pingpong -g 1 -c (RC SEND to ourselves, data checked)" ibv_rc_pingpong -g 1 -n 200 -s 4096 -c
pair "ibv_rc_pingpong -g 1 -s 65536 -c" ibv_rc_pingpong -g 1 -n 50 -s 65536 -c
pair "ibv_ud_pingpong -g 1 -c (UD to ourselves)" ibv_ud_pingpong -g 1 -n 100 -s 1024 -c
pair "ibv_srq_pingpong -g 1 -c" ibv_srq_pingpong -g 1 -n 50 -c
pair "ib_write_bw -s 65536" ib_write_bw -x 1 -s 65536 -n 500 --report_gbits
pair "ib_write_bw -s 64" ib_write_bw -x 1 -s 64 -n 5000
pair "ib_read_bw -s 65536" ib_read_bw -x 1 -s 65536 -n 200 --report_gbits
pair "ib_read_lat -s 64" ib_read_lat -x 1 -s 64 -n 500
pair "ib_atomic_bw" ib_atomic_bw -x 1 -n 2000
pair "ib_atomic_lat (fetch-and-add)" ib_atomic_lat -x 1 -n 200 -A FETCH_AND_ADD
pair "ib_send_bw -c UD -s 1024" ib_send_bw -x 1 -c UD -s 1024 -n 1000 -r 1000 --rate_limit_type=SW --rate_limit=2000 --rate_units=p
pair "ib_send_bw -s 4096" ib_send_bw -x 1 -s 4096 -n 1000 --report_gbits
pair "ib_write_bw -c UC -s 65536" ib_write_bw -x 1 -c UC -s 65536 -n 100

# RDMA CM to itself: the node's CM agent gets its own REQ (SIDR_REQ for
# udaddy) on QP1 through the loopback and answers it.
cm_listeners() {
  for _ in $(seq 1 150); do
    "$CTL" -s "$SOCK" --json cm 2>/dev/null |
      python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["listeners"] >= 1 else 1)' 2>/dev/null && return 0
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
cm_pair() {  # cm_pair NAME SERVER... -- CLIENT...
  local name=$1 srv=() cli=()
  shift
  while [ "$1" != -- ]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  in_ns timeout 60 "${pre[@]}" "${srv[@]}" >"$T/s.log" 2>&1 &
  local sp=$!
  crc=1
  if cm_listeners "$sp"; then
    in_ns timeout 60 "${pre[@]}" "${cli[@]}" >"$T/c.log" 2>&1
    crc=$?
  else
    echo "(no listener)" >"$T/c.log"
  fi
  [ "$crc" -ne 0 ] && kill -TERM "$sp" 2>/dev/null
  wait "$sp"
  src=$?
}
cm_pair rping rping -s -a "$A" -p 17174 -v -V -C 20 -- rping -c -a "$A" -p 17174 -v -V -C 20
nc=$(grep -c '^ping data: ' "$T/c.log")
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && [ "$nc" -eq 20 ] && ! grep -q 'mismatch' "$T/c.log" "$T/s.log"; then
  ok "rping -V -C 20 to our own address (RDMA CM to itself, data checked)"
else
  bad "rping: client exit $crc ($nc pings), server exit $src"
  tail -n 8 "$T/s.log" | sed 's/^/  server| /'; tail -n 8 "$T/c.log" | sed 's/^/  client| /'
fi
cm_pair udaddy udaddy -b "$A" -c 1 -C 20 -- udaddy -s "$A" -c 1 -C 20
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'test complete' "$T/c.log" && grep -q 'test complete' "$T/s.log"; then
  ok "udaddy -C 20 to our own address (SIDR to itself)"
else
  bad "udaddy: client exit $crc, server exit $src"
  tail -n 8 "$T/s.log" | sed 's/^/  server| /'; tail -n 8 "$T/c.log" | sed 's/^/  client| /'
fi

# The counters: everything went through the loopback, nothing over the wire.
"$CTL" -s "$SOCK" --json counters -g port >"$T/ctr.json"
read -r lb rroce lbfull lbdrop <<<"$(python3 -c '
import json,sys
g=json.load(open(sys.argv[1]))["groups"][0]
v={}
for inst in g["instances"]:
    for n,x in zip(g["names"], inst["values"]): v[n]=v.get(n,0)+x
print(v["tx_loopback"], v["rx_roce"], v["loopback_full"], v["loopback_drops"])' "$T/ctr.json")"
vk1=$(rx_frames_vk)
echo "       port counters: tx_loopback $lb, rx_roce $rroce, loopback_full $lbfull, loopback_drops $lbdrop; kernel end of the veth received $((vk1 - vk0)) frames"
if [ "${lb:-0}" -gt 10000 ] && [ "${rroce:-1}" -eq 0 ] && [ $((vk1 - vk0)) -lt 50 ]; then
  ok "frames looped back inside droced, none on the wire"
else
  bad "loopback counters (tx_loopback ${lb:-?}, rx_roce ${rroce:-?}, veth frames $((vk1 - vk0)))"
fi
if ! kill -0 "$pid" 2>/dev/null; then bad "droced died"; fi
"$CTL" -s "$SOCK" shutdown >/dev/null 2>&1
wait "$pid"; rc=$?
pid=
[ "$rc" -eq 0 ] && ok "droced exits cleanly" || bad "droced exit $rc"
if [ "$fail" -ne 0 ]; then tail -n 30 "$T/droced.log" | sed 's/^/  droced| /'; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

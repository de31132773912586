#!/usr/bin/env bash
# Runs Debian's unmodified ibverbs programs (ibverbs-utils, perftest) against
# the drop-in libibverbs.so.1 and a ShimServer with the loopback test double
# (shim_test_server), two processes per test over their default TCP
# exchange on localhost. Checks each reports success, that the server is
# left with no objects, and that a client killed with SIGKILL mid-transfer
# leaves nothing behind while another pair's transfer completes with its
# data verified.
#   verbs_tools_test.sh SHIM_TEST_SERVER LIBDIR [quick]
set -u
server_bin=$1
libdir=$2
mode=${3:-full}
work=$(mktemp -d /tmp/droce-verbs-tools.XXXXXX)
sock=$work/droced.sock
pass=0
fail=0
port=$((20000 + RANDOM % 20000))

cleanup() {
  [ -n "${spid:-}" ] && kill -TERM "$spid" 2>/dev/null && wait "$spid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$server_bin" "$sock" >"$work/server.log" 2>&1 &
spid=$!
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "server did not start"; cat "$work/server.log"; exit 1; }

export DROCE_SOCKET=$sock
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# Runs a verbs program under `timeout`, with DROCE_TEST_PRELOAD (the ASan
# runtime in a sanitizer build) preloaded into it alone.
run() {
  local t=$1
  shift
  if [ -n "${DROCE_TEST_PRELOAD:-}" ]; then
    timeout "$t" env LD_PRELOAD="$DROCE_TEST_PRELOAD" "$@"
  else
    timeout "$t" "$@"
  fi
}

# The same for a background job whose pid must be the timeout process:
# call as `run_bg T CMD... &` (the subshell execs timeout).
run_bg() {
  local t=$1
  shift
  if [ -n "${DROCE_TEST_PRELOAD:-}" ]; then
    exec timeout "$t" env LD_PRELOAD="$DROCE_TEST_PRELOAD" "$@"
  fi
  exec timeout "$t" "$@"
}

# The next TCP port nobody listens on (other test suites may run beside us).
next_port() {
  for _ in $(seq 100); do
    port=$((port + 1))
    [ -z "$(ss -Htln "sport = :$port" 2>/dev/null)" ] && return
  done
}

ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

# stats: ask the server for its counters (SIGUSR1) and print the last line.
stats() {
  local n
  n=$(grep -c '^stats' "$work/server.log")
  kill -USR1 "$spid"
  for _ in $(seq 50); do
    [ "$(grep -c '^stats' "$work/server.log")" -gt "$n" ] && break
    sleep 0.05
  done
  grep '^stats' "$work/server.log" | tail -n 1
}
no_objects() {
  local s
  for _ in $(seq 40); do
    s=$(stats)
    echo "$s" | grep -q 'clients=0 pd=0 mr=0 channel=0 cq=0 srq=0 qp=0 ah=0 mw=0 mapped=0' && return 0
    sleep 0.1
  done
  echo "  server: $s"
  return 1
}

# pair NAME CMD...: server side, then client side with "localhost"; both must
# exit 0 within the time limit.
pair() {
  local name=$1
  shift
  next_port
  run 60 "$@" -p "$port" >"$work/a.log" 2>&1 &
  local apid=$!
  # The client connects once the server listens (it opens the device and
  # sets up its QP first; a fixed 0.3 s pause was too short beside other suites).
  for _ in $(seq 200); do
    [ -n "$(ss -Htln "sport = :$port" 2>/dev/null)" ] && break
    sleep 0.05
  done
  run 60 "$@" -p "$port" localhost >"$work/b.log" 2>&1
  local rb=$?
  wait "$apid"
  local ra=$?
  if [ $ra -eq 0 ] && [ $rb -eq 0 ] && ! grep -qi "fail\|error\|couldn't" "$work/a.log" "$work/b.log"; then
    ok "$name"
  else
    bad "$name (exit $ra/$rb)"
    grep -v "^ *\(GID\|---\|local address\|remote address\)" "$work/a.log" | tail -n 25
    grep -v "^ *\(GID\|---\|local address\|remote address\)" "$work/b.log" | tail -n 25
  fi
}

if [ "$mode" != kill ]; then
# Device queries.
out=$(run 10 ibv_devices 2>&1)
if echo "$out" | grep -q "droce0.*020203fffe040506"; then ok "ibv_devices"; else bad "ibv_devices: $out"; fi
out=$(run 10 ibv_devinfo -v 2>&1)
if echo "$out" | grep -q "hca_id:.*droce0" && echo "$out" | grep -q "link_layer:.*Ethernet" &&
   echo "$out" | grep -q "vendor_id:.*0xffffff" && echo "$out" | grep -q "PORT_ACTIVE" &&
   echo "$out" | grep -q "GID\[  0\]:.*fe80::2:3ff:fe04:506, RoCE v2" &&
   echo "$out" | grep -q "GID\[  1\]:.*::ffff:10.99.0.1, RoCE v2"; then
  ok "ibv_devinfo -v"
else
  bad "ibv_devinfo -v"
  echo "$out" | tail -n 20
fi

# The IBVERBS_1.0 versions of the device-level calls (.symver aliases).
if [ -n "${DROCE_COMPAT_1_0_CHECK:-}" ]; then
  out=$(run 10 "$DROCE_COMPAT_1_0_CHECK" 2>&1)
  if [ $? -eq 0 ] && echo "$out" | grep -q "1.0: droce0 vendor 0xffffff gid\[1\] ends 10.99.0.1"; then
    ok "IBVERBS_1.0 and 1.1 versions side by side"
  else
    bad "IBVERBS_1.0 versions: $out"
  fi
fi

# ibverbs-utils pingpongs (-c: the receiver validates the data).
for s in 2 4096 1048576; do
  pair "ibv_rc_pingpong -s $s" ibv_rc_pingpong -g 0 -n 100 -s "$s" -c
  pair "ibv_uc_pingpong -s $s" ibv_uc_pingpong -g 0 -n 100 -s "$s" -c
done
pair "ibv_rc_pingpong -e (completion channel)" ibv_rc_pingpong -g 0 -n 200 -e -c
pair "ibv_ud_pingpong -s 2" ibv_ud_pingpong -g 0 -n 100 -s 2 -c
pair "ibv_ud_pingpong -s 1024" ibv_ud_pingpong -g 0 -n 100 -s 1024 -c
pair "ibv_srq_pingpong" ibv_srq_pingpong -g 0 -n 100 -c
pair "ibv_srq_pingpong -s 65536" ibv_srq_pingpong -g 0 -n 50 -s 65536 -c

# perftest over its default TCP exchange.
pair "ib_write_bw -a" ib_write_bw -x 0 -a -n 20
pair "ib_read_bw -a" ib_read_bw -x 0 -a -n 20
pair "ib_write_bw -c UC -a" ib_write_bw -x 0 -c UC -a -n 20
pair "ib_atomic_bw" ib_atomic_bw -x 0 -n 200
pair "ib_atomic_lat" ib_atomic_lat -x 0 -n 200
pair "ib_send_bw -c UD" ib_send_bw -x 0 -c UD -n 100
if [ "$mode" = full ]; then
  for s in 2 1048576; do
    pair "ib_send_bw -s $s" ib_send_bw -x 0 -s "$s" -n 50
    pair "ib_send_lat -s $s" ib_send_lat -x 0 -s "$s" -n 20
    pair "ib_write_lat -s $s" ib_write_lat -x 0 -s "$s" -n 20
    pair "ib_read_lat -s $s" ib_read_lat -x 0 -s "$s" -n 20
  done
fi
if no_objects; then ok "no objects left after the tools"; else bad "objects left after the tools"; fi
fi

# SIGKILL mid-transfer: an ib_write_bw pair runs for seconds; kill -9 its
# client while an ibv_rc_pingpong pair (validating data) runs beside it.
next_port
run_bg 60 ib_write_bw -x 0 -D 20 -p "$port" >"$work/kill-a.log" 2>&1 &
kapid=$!
sleep 0.3
run_bg 60 ib_write_bw -x 0 -D 20 -p "$port" localhost >"$work/kill-b.log" 2>&1 &
kbpid=$!
next_port
run_bg 60 ibv_rc_pingpong -g 0 -n 2000 -c -p "$port" >"$work/pp-a.log" 2>&1 &
ppa=$!
sleep 0.3
run_bg 60 ibv_rc_pingpong -g 0 -n 2000 -c -p "$port" localhost >"$work/pp-b.log" 2>&1 &
ppb=$!
sleep 1.5
mid=$(stats)
# the perftest client is the child of timeout
victim=$(pgrep -P "$kbpid" ib_write_bw)
if [ -n "$victim" ] && echo "$mid" | grep -q "qp=[1-9]"; then
  kill -KILL "$victim"
  kill -KILL "$(pgrep -P "$kapid" ib_write_bw)" 2>/dev/null
  wait "$kapid" "$kbpid" 2>/dev/null
  wait "$ppa"
  ra=$?
  wait "$ppb"
  rb=$?
  if [ $ra -eq 0 ] && [ $rb -eq 0 ]; then ok "pingpong beside a killed client completes with data verified"; else
    bad "pingpong beside a killed client (exit $ra/$rb)"
    tail -n 3 "$work/pp-a.log" "$work/pp-b.log"
  fi
  if no_objects; then ok "SIGKILLed client left no QP, MR or shared memory"; else bad "SIGKILLed client left objects"; fi
else
  bad "kill test: transfer not running (mid: $mid)"
  kill "$kapid" "$kbpid" "$ppa" "$ppb" 2>/dev/null
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

#!/bin/bash
# Debian's unmodified rdmacm programs through the drop-in librdmacm against
# the test-double server with the RDMA CM (shim_test_server SOCKET cm: the
# loopback verbs backend and a real cm::Agent whose MADs come back to it,
# loopback_cm.h). Server and client programs both use its one device
# (10.99.0.1): REQ/REP/RTU, SIDR, DREQ/DREP and the data all go through the
# library, the ShimServer's CM sessions and the front.
#   rdmacm_tools_test.sh SHIM_TEST_SERVER FRONT_DIR RDMACM_CHECK
set -u
server_bin=$1
front=$2
check_bin=$3
T=$(mktemp -d /tmp/droce-rdmacm-tools-XXXXXX)
A=10.99.0.1
pass=0
fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
srv=
cleanup() {
  [ -n "$srv" ] && kill -TERM "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT

"$server_bin" "$T/s.sock" cm >"$T/server.log" 2>&1 &
srv=$!
for _ in $(seq 100); do grep -q ready "$T/server.log" && break; sleep 0.05; done
grep -q ready "$T/server.log" || { echo "FAIL test server did not start"; cat "$T/server.log"; exit 1; }
export DROCE_SOCKET=$T/s.sock
export LD_LIBRARY_PATH=$front
# Under the sanitizers the front is instrumented, the programs are not.
if [ -n "${DROCE_TEST_PRELOAD:-}" ]; then export LD_PRELOAD=$DROCE_TEST_PRELOAD ASAN_OPTIONS=detect_leaks=0; fi

# The library's own checks against a live server (no CM peer needed).
if out=$(timeout 60 "$check_bin" droced "$A" 10.98.0.1 "$A" 2>&1); then
  ok "rdmacm_check ($(echo "$out" | tail -n 1))"
else
  bad "rdmacm_check:"; echo "$out" | grep -v '^ok ' | sed 's/^/       /'
fi

# stats: the server's counters now (SIGUSR1 makes it print a line).
stats() {
  local n
  n=$(grep -c '^stats' "$T/server.log")
  kill -USR1 "$srv"
  for _ in $(seq 100); do [ "$(grep -c '^stats' "$T/server.log")" -gt "$n" ] && break; sleep 0.02; done
  grep '^stats' "$T/server.log" | tail -n 1
}
# pair NAME SERVER... -- CLIENT...: the client starts once the server program
# listens (the test server counts a listening id; up to 10 s). Outputs in
# $T/NAME.{s,c}, exit codes in src/crc.
pair() {
  local name=$1 s=() c=() l=0
  shift
  while [ "$1" != -- ]; do s+=("$1"); shift; done
  shift
  c=("$@")
  timeout -k 5 60 "${s[@]}" >"$T/$name.s" 2>&1 &
  local sp=$!
  for _ in $(seq 100); do
    l=$(stats | sed -n 's/.*cm_listeners=\([0-9]*\).*/\1/p')
    [ "${l:-0}" -gt 0 ] && break
    kill -0 "$sp" 2>/dev/null || break
    sleep 0.1
  done
  crc=1
  if [ "${l:-0}" -gt 0 ]; then
    timeout -k 5 45 "${c[@]}" >"$T/$name.c" 2>&1
    crc=$?
  else
    echo "(the server never listened)" >"$T/$name.c"
  fi
  [ "$crc" -ne 0 ] && kill -TERM "$sp" 2>/dev/null
  wait "$sp"
  src=$?
}
# stdout goes to a file fully buffered, stderr unbuffered: a program's error
# lands before its data lines, so show the lines that are not ping data first.
show() {
  local f
  for f in server:s client:c; do
    echo "       --- ${f%:*}"
    grep -v 'ping data: ' "$T/$1.${f#*:}" | tail -n 12 | sed 's/^/       /'
    tail -n 3 "$T/$1.${f#*:}" | sed 's/^/       /'
  done
}
both_ok() {  # both_ok NAME PATTERN_CLIENT PATTERN_SERVER DESCRIPTION
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q "$2" "$T/$1.c" && grep -q "$3" "$T/$1.s"; then
    ok "$4"
  else
    bad "$4: client rc $crc, server rc $src"; show "$1"
  fi
}

pair rping rping -s -a "$A" -p 17174 -v -V -C 20 -- rping -c -a "$A" -p 17174 -v -V -C 20
nc=$(grep -c '^ping data: ' "$T/rping.c")
ns=$(grep -c '^server ping data: ' "$T/rping.s")
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && [ "$nc" -eq 20 ] && [ "$ns" -eq 20 ] && ! grep -q mismatch "$T/rping.c"; then
  ok "rping -v -V -C 20: 20 pings, data checked"
else
  bad "rping: client rc $crc ($nc pings), server rc $src ($ns)"; show rping
fi
pair ucmatose ucmatose -b "$A" -p 17175 -c 4 -C 20 -- ucmatose -s "$A" -p 17175 -c 4 -C 20
both_ok ucmatose 'return status 0' 'return status 0' "ucmatose -c 4 -C 20 (RC, SENDs both ways, disconnect)"
pair ucmatose_m ucmatose -b "$A" -p 17176 -m -- ucmatose -s "$A" -p 17176 -m
both_ok ucmatose_m 'return status 0' 'return status 0' "ucmatose -m (rdma_migrate_id to a new channel)"
pair udaddy udaddy -b "$A" -c 2 -C 20 -- udaddy -s "$A" -c 2 -C 20
both_ok udaddy 'return status 0' 'return status 0' "udaddy -c 2 -C 20 (UD: SIDR_REQ/SIDR_REP, AHs)"
pair rdma_sc rdma_server -s "$A" -p 17177 -- rdma_client -s "$A" -p 17177
both_ok rdma_sc 'rdma_client: end 0' 'rdma_server: end 0' "rdma_server / rdma_client (rdma_getaddrinfo, rdma_create_ep, synchronous ids)"
pair wbw ib_write_bw -R -n 200 -- ib_write_bw -R -n 200 "$A"
both_ok wbw '^ 65536 *200' '^ 65536 *200' "ib_write_bw -R"
pair sbw_ud ib_send_bw -R -c UD -n 200 -- ib_send_bw -R -c UD -n 200 "$A"
both_ok sbw_ud '^ [0-9]* *200' '^ [0-9]* *200' "ib_send_bw -R -c UD"
pair rlat ib_read_lat -R -n 200 -- ib_read_lat -R -n 200 "$A"
both_ok rlat '^ 2 *200' 'remote address' "ib_read_lat -R"

# A connected client killed: the server's droce connection gets a DREQ
# (the server tears the dead client's connections down) and its rping ends.
timeout -k 5 60 rping -s -v -a "$A" -p 17178 -C 100000000 >"$T/kill.s" 2>&1 &
ksp=$!
for _ in $(seq 100); do
  l=$(stats | sed -n 's/.*cm_listeners=\([0-9]*\).*/\1/p')
  [ "${l:-0}" -gt 0 ] && break
  sleep 0.1
done
# Not under timeout: the KILL below must reach rping itself.
rping -c -a "$A" -p 17178 -C 100000000 >"$T/kill.c" 2>&1 &
kcp=$!
# Connected once pings flow (the server's -v lines reach its log, 4 KiB of
# stdio buffer at a time); up to 10 s.
for _ in $(seq 200); do
  grep -q 'server ping data' "$T/kill.s" && break
  kill -0 "$kcp" 2>/dev/null || break
  sleep 0.05
done
if grep -q 'server ping data' "$T/kill.s"; then
  kill -KILL "$kcp"
  wait "$kcp" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$ksp" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$ksp" 2>/dev/null; then
    bad "rping server still running 10 s after its client was killed"
    kill -TERM "$ksp"
  else
    ok "client killed mid-run: the server got DISCONNECTED and ended"
  fi
else
  bad "rping for the kill test did not connect"; kill -KILL "$kcp" 2>/dev/null; kill -TERM "$ksp"
fi
wait "$kcp" 2>/dev/null
wait "$ksp" 2>/dev/null

# Nothing left in the server once every program is gone: verbs objects and
# CM ids and channels (the server sees the last disconnects a little after
# the programs exit: asked again, up to 5 s).
clean='clients=0 pd=0 mr=0 channel=0 cq=0 srq=0 qp=0 ah=0 mw=0 mapped=0 .* cm_ids=0 cm_channels=0 cm_listeners=0'
st=
for _ in $(seq 50); do
  st=$(stats)
  echo "$st" | grep -q "$clean" && break
  sleep 0.1
done
if echo "$st" | grep -q "$clean"; then
  ok "no client, verbs object, mapping or CM id left ($st)"
else
  bad "left in the server: $st"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

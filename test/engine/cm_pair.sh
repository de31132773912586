#!/usr/bin/env bash
# Debian's unmodified rdmacm-utils between two droced nodes through the
# drop-in librdmacm (lib/shim/front/rdmacm): the server program uses node a's
# droced, the client node b's; the CM MADs and the data cross the veth pair.
#   rping -v -V -C 20 (data checked by both ends), ucmatose (RC, send/recv),
#   udaddy (UD, SIDR), mckey (UD multicast, both ways), rdma_server/rdma_client (synchronous API, rdma_create_ep),
#   fio --ioengine=rdma (verb=send with verify=crc32c, verb=write, verb=read),
#   perftest -R (ib_write_bw, ib_send_bw -c UD, ib_read_lat), cmtime (20
#   connections; the server destroys every passive id), qperf -cm1 rc_bw/rc_lat
#   (its control TCP through an address on the namespace's loopback), rping -C
#   and ib_write_bw -R under 1% loss on both nodes;
# and first the library's behaviour against a live droced with no CM peer
# (rdmacm_check droced); last, nothing left in either droced.
#   cm_pair.sh DROCED DROCE_CTL FRONT_DIR RDMACM_CHECK
set -uo pipefail
DROCED=$1
CTL=$2
FRONT=$3
CHECK=$4
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/droced_pair.sh
. "$here/../lib/droced_pair.sh"
T=$(mktemp -d /tmp/droce-cm-pair-XXXXXX)
NET=10.62.0
A=$NET.1
pass=0
fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
cleanup() {
  droced_pair_down
  rm -rf "$T"
}
trap cleanup EXIT INT TERM

# Every program here (droced_pair_up's ibv_devinfo included) uses the fronts.
export LD_LIBRARY_PATH=$FRONT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
DROCED_PAIR_TIMEOUT=800 droced_pair_up cm "$NET" "$T" "$DROCED"
rc=$?
[ "$rc" -eq 77 ] && { echo "SKIP: cannot create network namespaces"; exit 77; }
[ "$rc" -ne 0 ] && { echo "FAIL droced nodes did not start"; exit 1; }

# on NODE SECS CMD...: CMD in the kernel namespace through node NODE's droced.
# Started in the background (or inside $(...)) it execs, so that $! is the
# `timeout` (ip netns exec and env exec as well), which passes a TERM on to
# the program: a TERM to the function's bash subshell left the program
# running (a failed perftest -R attempt's server lived on next to its retry,
# holding two connections that cmtime's check then found on node a).
on() {
  local node=$1 secs=$2 x=
  shift 2
  [ "$BASHPID" != "$$" ] && x=exec
  DROCE_SOCKET=$T/$node-verbs.sock $x \
    ip netns exec "$DP_K" timeout -k 5 "$secs" \
    ${DROCE_TEST_PRELOAD:+env LD_PRELOAD="$DROCE_TEST_PRELOAD" ASAN_OPTIONS=detect_leaks=0} "$@"
}

# The library against a live droced, no peer.
if out=$(on a 60 "$CHECK" droced "$A" "$NET.77" "$NET.2" 2>&1); then
  ok "rdmacm_check against droced ($(echo "$out" | tail -n 1))"
else
  bad "rdmacm_check against droced:"
  echo "$out" | grep -v '^ok ' | sed 's/^/       /'
fi

# cm_ctr NODE NAME: RDMA CM counter NAME of node NODE, summed over its devices.
cm_ctr() {
  "$CTL" -s "$T/$1-ctl.sock" --json cm 2>/dev/null | python3 -c '
import json, sys
print(sum(d["counters"].get(sys.argv[1], 0) for d in json.load(sys.stdin).get("devices", {}).values()))' "$2" 2>/dev/null || echo 0
}

# pair NAME SERVER... -- CLIENT...: the server through node a, the client
# through node b, started once `droce-ctl cm` on node a lists a listener;
# the client is still retried (bounded) while its connection is refused (REJ, or for UD a SIDR_REP
# "no listener": UNREACHABLE) and the server still runs. A refused connection
# never reaches the server program, so each client makes one connection.
# Outputs in $T/NAME.{s,c}; sets src/crc.
#
# A program that opens a second connection to the same port after a first
# exchange (perftest -R: its control connection, then the test QPs) races its
# server: if the client's second REQ arrives before the server listens again
# (the server is late: a loaded CPU, or a lost ACK holding its last send for
# the ACK timeout), node a answers REJ "invalid service ID", as Linux does.
# perftest 4.5-0.17 then redoes its control connection, which lands on the
# server's new listener as a test QP: its first SEND meets a QP with no
# receive posted and gets RNR NAKs until the run times out (seen 2 times in 90
# runs under 1% loss, and once in a CI run without loss). Such a run (a failed
# client while node a counted a REJ for no listener) is started again, at most
# twice; every other failure counts.
pair() {
  local n0 try
  for try in 1 2 3; do
    n0=$(cm_ctr a rej_no_listener)
    pair_once "$@"
    [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && return
    [ "$(cm_ctr a rej_no_listener)" -gt "$n0" ] || return
    echo "     $1: the client's REQ came before the server listened again (REJ no listener); run again ($try)"
  done
}
pair_once() {
  local name=$1 srv=() cli=()
  shift
  while [ "$1" != -- ]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  # The previous program's listener must be gone first: droced sees a program's
  # hang-up a little after it exits, and a listener count that still holds the
  # old server's would start the client early; its REQ then meets no listener
  # (REJ), and perftest 4.5-0.17's client retries with the ids and nodes it
  # has just destroyed and freed (use after free: it crashed, or its REQ
  # reached the new server, which then hung with the retried client).
  for _ in $(seq 100); do
    "$CTL" -s "$T/a-ctl.sock" --json cm 2>/dev/null |
      python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["listeners"] == 0 else 1)' 2>/dev/null && break
    sleep 0.1
  done
  on a 90 "${srv[@]}" >"$T/$name.s" 2>&1 &
  local sp=$!
  # The client starts once node a lists the server's listener (droce-ctl cm,
  # 20 s at most); the retries below stay for a listener that comes late.
  for _ in $(seq 200); do
    "$CTL" -s "$T/a-ctl.sock" --json cm 2>/dev/null |
      python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["listeners"] >= 1 else 1)' 2>/dev/null && break
    kill -0 "$sp" 2>/dev/null || break
    sleep 0.1
  done
  crc=1
  for _ in $(seq 50); do
    on b "${PAIR_CLIENT_SECS:-60}" "${cli[@]}" >"$T/$name.c" 2>&1
    crc=$?
    [ "$crc" -eq 0 ] && break
    grep -qiE 'reject|refused|unreachable|CM event bl blka [78]$' "$T/$name.c" || break
    kill -0 "$sp" 2>/dev/null || break
    sleep 0.1
  done
  if [ "$crc" -ne 0 ]; then kill -TERM "$sp" 2>/dev/null; fi
  wait "$sp"
  src=$?
}
# ctr NODE NAME: the sum of transport counter NAME over node NODE's cores.
ctr() {
  "$CTL" -s "$T/$1-ctl.sock" --json counters 2>/dev/null | python3 -c '
import json, sys
print(sum(v for g in json.load(sys.stdin)["groups"] if g["group"] == "transport"
          for i in g["instances"] for k, v in zip(g["names"], i["values"]) if k == sys.argv[1]))' "$2" 2>/dev/null
}
show() {  # show NAME: the tails of both outputs, and each node's non-zero error counters
  echo "       --- server"; tail -n 8 "$T/$1.s" | sed 's/^/       /'
  echo "       --- client"; tail -n 8 "$T/$1.c" | sed 's/^/       /'
  local n
  for n in a b; do
    echo "       --- node $n: $("$CTL" -s "$T/$n-ctl.sock" --json counters 2>/dev/null | python3 -c '
import json, re, sys
bad = re.compile("timeout|retry|retransmit|nak|err|drop|no_qp|ghost|lost|bad")
t = {}
for g in json.load(sys.stdin)["groups"]:
    if g["group"] in ("transport", "port"):
        for i in g["instances"]:
            for k, v in zip(g["names"], i["values"]):
                if v and bad.search(k): t[k] = t.get(k, 0) + v
print(" ".join(f"{k}={v}" for k, v in sorted(t.items())))' 2>/dev/null)"
  done
}

# rping: 20 RDMA READ/WRITE ping-pongs with the payload checked (-V) by the
# client; the server prints what it read.
pair rping rping -s -a "$A" -p 17174 -v -V -C 20 -- rping -c -a "$A" -p 17174 -v -V -C 20
nc=$(grep -c '^ping data: ' "$T/rping.c")
ns=$(grep -c '^server ping data: ' "$T/rping.s")
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && [ "$nc" -eq 20 ] && [ "$ns" -ge 20 ] && ! grep -q 'mismatch' "$T/rping.c"; then
  ok "rping -v -V -C 20: 20 pings, data checked (server saw $ns)"
else
  bad "rping: client rc $crc ($nc pings), server rc $src ($ns)"; show rping
fi

# ucmatose: RC connections, SENDs both ways, disconnect.
pair ucmatose ucmatose -b "$A" -p 17175 -c 1 -C 20 -- ucmatose -s "$A" -p 17175 -c 1 -C 20
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'test complete' "$T/ucmatose.c" && grep -q 'test complete' "$T/ucmatose.s"; then
  ok "ucmatose -C 20"
else
  bad "ucmatose: client rc $crc, server rc $src"; show ucmatose
fi

# udaddy: UD (SIDR_REQ/SIDR_REP), messages through AHs both ways.
pair udaddy udaddy -b "$A" -c 1 -C 20 -- udaddy -s "$A" -c 1 -C 20
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'test complete' "$T/udaddy.c" && grep -q 'test complete' "$T/udaddy.s"; then
  ok "udaddy -C 20"
else
  bad "udaddy: client rc $crc, server rc $src"; show udaddy
fi

# mckey: UD multicast (rdma_join_multicast_ex, MULTICAST_JOIN, ibv_attach_mcast,
# SENDs to QPN 0xFFFFFF). The receiver joins the group and waits for its 10
# messages (mckey's own loop has no timeout: `on` bounds it); once it has
# joined (its "mckey: joined" line: stdbuf -oL, mckey's stdout is a file), the
# sender on the other node joins and sends 10. Both directions.
# mckey_run NAME RNODE RADDR SNODE SADDR GROUP: sets crc/src.
mckey_run() {
  local name=$1 rnode=$2 raddr=$3 snode=$4 saddr=$5 group=$6
  on "$rnode" 60 stdbuf -oL mckey -m "$group" -b "$raddr" -C 10 >"$T/$name.s" 2>&1 &
  local rp=$!
  for _ in $(seq 200); do
    grep -q '^mckey: joined' "$T/$name.s" && break
    kill -0 "$rp" 2>/dev/null || break
    sleep 0.1
  done
  on "$snode" 60 mckey -m "$group" -b "$saddr" -s -C 10 >"$T/$name.c" 2>&1
  crc=$?
  wait "$rp"
  src=$?
}
for dir in "b a $NET.2 $A" "a b $A $NET.2"; do
  read -r snode rnode saddr raddr <<<"$dir"
  mckey_run "mckey_$snode$rnode" "$rnode" "$raddr" "$snode" "$saddr" 239.62.0.7
  n=mckey_$snode$rnode
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'data transfers complete' "$T/$n.s" &&
     grep -q 'data transfers complete' "$T/$n.c" && grep -q 'joined dgid: ::ffff:239.62.0.7' "$T/$n.s"; then
    ok "mckey -m 239.62.0.7 -C 10: node $snode sends, node $rnode receives all 10"
  else
    bad "mckey $snode -> $rnode: sender rc $crc, receiver rc $src"; show "$n"
  fi
done

# rdma_server / rdma_client: rdma_getaddrinfo, rdma_create_ep, synchronous ids.
pair rdma_sc rdma_server -s "$A" -p 17177 -- rdma_client -s "$A" -p 17177
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'rdma_client: end 0' "$T/rdma_sc.c" && grep -q 'rdma_server: end 0' "$T/rdma_sc.s"; then
  ok "rdma_server / rdma_client"
else
  bad "rdma_server/rdma_client: client rc $crc, server rc $src"; show rdma_sc
fi

# fio's rdma engine (librdmacm + libibverbs; --thread: one process, so the
# timeouts reach every job). The server job (rw=read) listens; the client job
# (rw=write) connects and moves 16 MiB in 64 KiB blocks. verb=send with
# verify=crc32c: each block the server receives carries the verify header and
# checksum the client's fio wrote, and the server checks them; verb=write and
# verb=read: RDMA WRITEs into and READs from the server's buffers. fio
# registers two buffers of one struct that share a page (its send and receive
# control blocks): the drop-in libibverbs used to refuse the second one.
# fio connects and accepts with rnr_retry_count 0 (its conn_params are zeroed),
# so with Linux as here a SEND that finds no receive posted fails the client at
# the first RNR NAK; the server re-posts a buffer only once its job has taken
# the block. The server posts 64 receives for the client's 4 in flight: slack
# for a server thread descheduled on a loaded host (8 and 8 failed once).
FIO=(fio --thread --ioengine=rdma --bs=64k --size=16m --verify_state_save=0)
FIO_S=("${FIO[@]}" --iodepth=64)
FIO_C=("${FIO[@]}" --iodepth=4)
fio_io() {  # fio_io FILE READ|WRITE: io= of the job's summary line
  sed -n "s/^ *$2: .*io=\([^ ]*\) .*/\1/p" "$1" | head -n 1
}
pair fio_send "${FIO_S[@]}" --name=s --port=17180 --rw=read --verify=crc32c -- \
  "${FIO_C[@]}" --name=c --port=17180 --hostname="$A" --rw=write --verb=send --verify=crc32c
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && [ "$(fio_io "$T/fio_send.s" READ)" = 16.0MiB ] &&
   [ "$(fio_io "$T/fio_send.c" WRITE)" = 16.0MiB ] && ! grep -q 'verify:' "$T/fio_send.s"; then
  ok "fio rdma verb=send, verify=crc32c: 16 MiB checked by the server ($(sed -n 's/^ *READ: bw=\([^ ]*\) .*/\1/p' "$T/fio_send.s"))"
else
  bad "fio verb=send verify: client rc $crc, server rc $src"; show fio_send
fi
# The same with a client that writes no verify headers: the server's check
# must refuse the blocks (so the case above did check something).
PAIR_CLIENT_SECS=15 pair fio_nover "${FIO_S[@]}" --name=s --port=17181 --rw=read --verify=crc32c -- \
  "${FIO_C[@]}" --name=c --port=17181 --hostname="$A" --rw=write --verb=send
if [ "$src" -ne 0 ] && grep -q 'verify: bad magic header' "$T/fio_nover.s"; then
  ok "fio rdma verb=send: blocks without verify headers are refused by the server's check"
else
  bad "fio verb=send without verify headers: server rc $src"; show fio_nover
fi
for verb in write read; do
  pair "fio_$verb" "${FIO_S[@]}" --name=s --port=1718$([ $verb = write ] && echo 2 || echo 3) --rw=read -- \
    "${FIO_C[@]}" --name=c --port=1718$([ $verb = write ] && echo 2 || echo 3) --hostname="$A" --rw=write --verb=$verb
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && [ "$(fio_io "$T/fio_$verb.c" WRITE)" = 16.0MiB ]; then
    ok "fio rdma verb=$verb: 16 MiB ($(sed -n 's/^ *WRITE: bw=\([^ ]*\) .*/\1/p' "$T/fio_$verb.c"))"
  else
    bad "fio verb=$verb: client rc $crc, server rc $src"; show "fio_$verb"
  fi
done

# perftest over the CM (-R): RC WRITE bandwidth, UD SEND, READ latency.
perf() {  # perf NAME DESCRIPTION ARGS...
  local name=$1 what=$2
  shift 2
  PAIR_CLIENT_SECS=30 pair "$name" "$@" -- "$@" "$A"
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -qE '^ +[0-9]+ +[0-9]+ ' "$T/$name.c"; then
    ok "$what: $(grep -E '^ +[0-9]+ +[0-9]+ ' "$T/$name.c" | tail -n 1 | tr -s ' ')"
  else
    bad "$what: client rc $crc, server rc $src"; show "$name"
  fi
}
perf wbw "ib_write_bw -R" ib_write_bw -R -n 500
perf sbw_ud "ib_send_bw -R -c UD" ib_send_bw -R -c UD -n 500
perf rlat "ib_read_lat -R" ib_read_lat -R -n 500

# cmtime: 20 RC connections set up and torn down at once (rdmacm-utils 44).
# Its server never exits by itself (it reads events until rdma_get_cm_event
# fails; later rdma-core versions count the disconnects): on each
# DISCONNECTED it calls rdma_disconnect, rdma_destroy_qp and rdma_destroy_id
# on a thread of its own. So once the client is done, node a must be back to
# the listener alone (one CM id, no connection): every passive id got its
# DISCONNECTED and was destroyed. Then the server is stopped (TERM).
cm_state() {  # cm_state NODE: "ids listeners connections-not-listening" from droce-ctl cm
  "$CTL" -s "$T/$1-ctl.sock" --json cm 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
conns = [c for dev in d.get("devices", {}).values() for c in dev.get("connections", []) if c.get("state") != "listen"]
print(d["ids"], d["listeners"], len(conns))' 2>/dev/null
}
# Not through on(): $! must be timeout (ip netns exec and env exec), which
# forwards TERM to cmtime.
DROCE_SOCKET=$T/a-verbs.sock ip netns exec "$DP_K" timeout -k 5 120 \
  ${DROCE_TEST_PRELOAD:+env LD_PRELOAD="$DROCE_TEST_PRELOAD" ASAN_OPTIONS=detect_leaks=0} \
  cmtime -b "$A" -p 17186 >"$T/cmtime.s" 2>&1 &
cmt=$!
for _ in $(seq 200); do
  [ "$(cm_state a | cut -d' ' -f2)" = 1 ] && break
  kill -0 "$cmt" 2>/dev/null || break
  sleep 0.1
done
on b 60 cmtime -s "$A" -p 17186 -c 20 >"$T/cmtime.c" 2>&1
crc=$?
st=
for _ in $(seq 100); do
  st=$(cm_state a)
  [ "$st" = "1 1 0" ] && break
  sleep 0.1
done
kill -0 "$cmt" 2>/dev/null && srv_alive=1 || srv_alive=0
kill -TERM "$cmt" 2>/dev/null
wait "$cmt"
if [ "$crc" -eq 0 ] && grep -qE '^disconnect +:' "$T/cmtime.c" && ! grep -q 'event:' "$T/cmtime.c" &&
   [ "$st" = "1 1 0" ] && [ "$srv_alive" = 1 ]; then
  ok "cmtime -c 20: connect $(awk '$1 == "connect" {print $NF}' "$T/cmtime.c") us/conn, disconnect $(awk '$1 == "disconnect" {print $NF}' "$T/cmtime.c") us/conn; the server destroyed all 20 passive ids"
else
  bad "cmtime: client rc $crc, node a (ids listeners connections) '$st' (want '1 1 0'), server running $srv_alive"
  show cmtime
fi

# qperf -cm1: its control connection is kernel TCP to the server name, the
# same address it gives rdma_resolve_addr. Node a's address lives in droced,
# so the kernel namespace gets it too, on its loopback (arp_ignore=1 keeps the
# kernel from answering ARP for it on the bridge, where node a answers):
# qperf's TCP then reaches the server in the same namespace, and its RDMA CM
# connection goes through node b to node a over the wire.
ip -n "$DP_K" addr add "$A/32" dev lo
ip netns exec "$DP_K" sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.br0.arp_ignore=1
DROCE_SOCKET=$T/a-verbs.sock ip netns exec "$DP_K" timeout -k 5 90 \
  ${DROCE_TEST_PRELOAD:+env LD_PRELOAD="$DROCE_TEST_PRELOAD" ASAN_OPTIONS=detect_leaks=0} \
  qperf -lp 17187 >"$T/qperf.s" 2>&1 &
qp=$!
for _ in $(seq 100); do
  ip netns exec "$DP_K" ss -Hltn 'sport = :17187' | grep -q . && break
  sleep 0.1
done
on b 60 qperf -lp 17187 "$A" -cm1 -t 2 rc_bw rc_lat quit >"$T/qperf.c" 2>&1
crc=$?
for _ in $(seq 100); do kill -0 "$qp" 2>/dev/null || break; sleep 0.1; done
kill -TERM "$qp" 2>/dev/null
wait "$qp"
src=$?
ip -n "$DP_K" addr del "$A/32" dev lo
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'bw  *=' "$T/qperf.c" && grep -q 'latency  *=' "$T/qperf.c"; then
  ok "qperf -cm1 rc_bw rc_lat: $(grep -E 'bw +=|latency +=' "$T/qperf.c" | tr -s ' ' | paste -sd,)"
else
  bad "qperf -cm1: client rc $crc, server rc $src"; show qperf
fi

# 1% loss on both nodes (droced's fault injection, each direction of each
# port): the CM's retries still connect and disconnect, the transport's
# retransmissions carry the data.
cm_retries() {
  local n sum=0 r
  for n in a b; do
    r=$("$CTL" -s "$T/$n-ctl.sock" --json cm 2>/dev/null | python3 -c '
import json, sys
print(sum(dev["counters"].get("retries", 0) for dev in json.load(sys.stdin).get("devices", {}).values()))' 2>/dev/null)
    sum=$((sum + ${r:-0}))
  done
  echo "$sum"
}
set_loss() {
  local n
  for n in a b; do
    "$CTL" -s "$T/$n-ctl.sock" fault set -p "v$n" -d rx --drop "$1" >/dev/null &&
      "$CTL" -s "$T/$n-ctl.sock" fault set -p "v$n" -d tx --drop "$1" >/dev/null || return 1
  done
}
r0=$(cm_retries)
if set_loss 0.01; then
  pair rping_loss rping -s -a "$A" -p 17188 -v -V -C 20 -- rping -c -a "$A" -p 17188 -v -V -C 20
  nc=$(grep -c '^ping data: ' "$T/rping_loss.c")
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && [ "$nc" -eq 20 ] && ! grep -q 'mismatch' "$T/rping_loss.c"; then
    ok "rping -C 20 under 1% loss on both nodes: 20 pings, data checked"
  else
    bad "rping under loss: client rc $crc ($nc pings), server rc $src"; show rping_loss
  fi
  # perftest's teardown is not loss-proof: each side's last SEND of the final
  # handshake completes only with its ACK, but the other side destroys its QP
  # as soon as it has what it waited for. When that ACK is lost (~2% here),
  # the sender retries into a QPN that no longer exists and ends with
  # RETRY_EXC after the test itself is done, on any fabric (seen 6 times in
  # 90 runs: the server's last SEND 4 times, the client's 2). That case is told
  # apart from a failure by its trace: both sides printed their results, the
  # failed side's only error is that last send, and the other node dropped
  # its retries for want of a QP.
  local_nq_a=$(ctr a rx_no_qp) local_nq_b=$(ctr b rx_no_qp)
  PAIR_CLIENT_SECS=30 pair wbw_loss ib_write_bw -R -n 200 -- ib_write_bw -R -n 200 "$A"
  res=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$T/wbw_loss.c" | tail -n 1 | sed 's/[[:space:]]*Bad wc.*//' | tr -s ' ')
  last_send_lost() {  # last_send_lost FILE NODE NQ0: FILE's only error is its last send, NODE dropped its retries
    grep -qE '^ +[0-9]+ +[0-9]+ ' "$1" && [ "$(grep -c 'Bad wc status' "$1")" = 1 ] &&
      grep -q 'Bad wc status 12' "$1" && grep -q 'Failed to close connection' "$1" &&
      [ "$(( $(ctr "$2" rx_no_qp) - $3 ))" -gt 0 ]
  }
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && [ -n "$res" ]; then
    ok "ib_write_bw -R under 1% loss on both nodes: $res"
  elif [ -n "$res" ] && { { [ "$crc" -eq 0 ] && [ "$src" -eq 1 ] && last_send_lost "$T/wbw_loss.s" b "$local_nq_b"; } ||
                          { [ "$crc" -eq 1 ] && [ "$src" -eq 0 ] && last_send_lost "$T/wbw_loss.c" a "$local_nq_a"; }; }; then
    ok "ib_write_bw -R under 1% loss on both nodes: $res (the $([ "$src" -eq 1 ] && echo server || echo client)'s last handshake SEND lost its ACK after its peer had gone: RETRY_EXC after the test, perftest's teardown)"
  else
    bad "ib_write_bw -R under 1% loss: client rc $crc, server rc $src"; show wbw_loss
  fi
  echo "     CM retries under loss: $(( $(cm_retries) - r0 ))"
  set_loss 0
else
  bad "droce-ctl fault set failed"
fi

# Nothing left on either node once the programs are gone: no shim client,
# no verbs object (droced sees the last hang-ups a little after the
# programs exit: asked again, up to 5 s).
droced_pair_check_empty "$CTL" "$T"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

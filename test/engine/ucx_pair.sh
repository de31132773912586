#!/usr/bin/env bash
# Debian's unmodified UCX (ucx-utils 1.13: ucx_info, ucx_perftest) between two
# droced nodes through the drop-in libibverbs: the server program uses node
# a's droced, the client node b's; the data crosses the veth pair, the
# programs' own TCP exchange the kernel namespace's loopback.
#   ucx_info -d lists rc_verbs and ud_verbs on droce0:1;
#   UCT put_lat and put_bw (zero-copy, 64 KiB) over rc_verbs, am_lat over
#   ud_verbs; UCP tag_lat and tag_bw (64 KiB) over rc_verbs (UCX_TLS=
#   rc_verbs,ud_verbs:aux: UCP wires rc_verbs up through ud_verbs, its
#   auxiliary transport); last, nothing left in either droced.
# What UCX needs besides the drop-in (lib/shim/README.md, UCX):
#   - /dev/infiniband/<dev_name> must be a character device the user may read
#     and write, or UCX does not list the device (it never opens it). Each
#     program here runs in a private mount namespace whose /dev is an overlay
#     holding /dev/infiniband/droce0 (a null device); the host's /dev is
#     not touched.
#   - UCX_UD_VERBS_ETH_DGID_CHECK=n: UCX's ud_verbs reads the L3 type of a
#     received RoCE packet from wc.sl (mlx5's convention; droce, like rxe,
#     reports 0) and then compares an IPv6 GRH's destination with its GIDs,
#     which an IPv4 packet's header does not match: every UD packet dropped.
#   ucx_pair.sh DROCED DROCE_CTL FRONT_DIR
set -uo pipefail
DROCED=$1
CTL=$2
FRONT=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/droced_pair.sh
. "$here/../lib/droced_pair.sh"
command -v ucx_perftest >/dev/null && command -v ucx_info >/dev/null ||
  { echo "SKIP: ucx-utils not installed (scripts/setup.sh installs it)"; exit 77; }
T=$(mktemp -d /tmp/droce-ucx-pair-XXXXXX)
NET=10.64.0
pass=0
fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
cleanup() {
  droced_pair_down
  rm -rf "$T"
}
trap cleanup EXIT INT TERM

export LD_LIBRARY_PATH=$FRONT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
DROCED_PAIR_TIMEOUT=600 droced_pair_up ux "$NET" "$T" "$DROCED"
rc=$?
[ "$rc" -eq 77 ] && { echo "SKIP: cannot create network namespaces"; exit 77; }
[ "$rc" -ne 0 ] && { echo "FAIL droced nodes did not start"; exit 1; }

export UCX_UD_VERBS_ETH_DGID_CHECK=n
# on NODE SECS CMD...: CMD in the kernel namespace through node NODE's droced,
# in a mount namespace of its own whose /dev has /dev/infiniband/droce0.
on() {
  local node=$1 secs=$2 x=
  shift 2
  # In the background, exec: $! is then the program's `timeout` (ip netns
  # exec, unshare and bash -c exec too), which a TERM reaches.
  [ "$BASHPID" != "$$" ] && x=exec
  DROCE_SOCKET=$T/$node-verbs.sock $x ip netns exec "$DP_K" unshare -m --propagation private \
    bash -c 'o=$(mktemp -d) && mount -t tmpfs tmpfs "$o" && mkdir "$o/u" "$o/w" &&
      mount -t overlay overlay -o "lowerdir=/dev,upperdir=$o/u,workdir=$o/w" /dev &&
      mkdir -p /dev/infiniband && mknod -m 666 /dev/infiniband/droce0 c 1 3 || exit 125
      exec timeout -k 5 "$@"' on "$secs" \
    "$@"
}

out=$(on a 60 ucx_info -d 2>&1)
if echo "$out" | grep -A1 "Transport: rc_verbs" | grep -q "Device: droce0:1" &&
   echo "$out" | grep -A1 "Transport: ud_verbs" | grep -q "Device: droce0:1" &&
   ! echo "$out" | grep -q "failed to open interface"; then
  ok "ucx_info -d: rc_verbs and ud_verbs on droce0:1"
else
  bad "ucx_info -d"
  echo "$out" | grep -E "Memory domain|Transport|Device|failed|ERROR" | head -n 20 | sed 's/^/       /'
fi

port=$((20000 + RANDOM % 20000))
# perf NAME ARGS...: ucx_perftest's server through node a, its client through
# node b once the server listens on its TCP port (10 s at most).
perf() {
  local name=$1
  shift
  port=$((port + 1))
  on a 90 ucx_perftest -p "$port" "$@" >"$T/$name.s" 2>&1 &
  local sp=$!
  for _ in $(seq 100); do
    [ -n "$(ip netns exec "$DP_K" ss -Htln "sport = :$port" 2>/dev/null)" ] && break
    kill -0 "$sp" 2>/dev/null || break
    sleep 0.1
  done
  on b 90 ucx_perftest 127.0.0.1 -p "$port" "$@" >"$T/$name.c" 2>&1
  local crc=$?
  [ "$crc" -ne 0 ] && kill -TERM "$sp" 2>/dev/null
  wait "$sp"
  local src=$?
  local fin
  fin=$(grep '^Final:' "$T/$name.c")
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && [ -n "$fin" ]; then
    # Final: iterations, latency (usec) 50%/avg/overall, bandwidth (MB/s)
    # avg/overall, message rate (msg/s) avg/overall.
    ok "$name ($*)"
    echo "$fin" | awk '{ printf "       latency %s us (median %s), bandwidth %s MB/s, %s msg/s\n", $4, $3, $6, $8 }'
  else
    bad "$name: client rc $crc, server rc $src"
    echo "       --- server"; grep -v "Unable to detach" "$T/$name.s" | tail -n 8 | sed 's/^/       /'
    echo "       --- client"; grep -v "Unable to detach" "$T/$name.c" | tail -n 8 | sed 's/^/       /'
  fi
}

n=(-n "${UCX_PAIR_ITERS:-2000}" -w 100)
perf put_lat -t put_lat -x rc_verbs -d droce0:1 "${n[@]}"
perf put_bw -t put_bw -x rc_verbs -d droce0:1 -D zcopy -s 65536 "${n[@]}"
perf am_lat_ud -t am_lat -x ud_verbs -d droce0:1 "${n[@]}"
# UCX's own "rc_v": the data on rc_verbs, ud_verbs only to wire it up.
export UCX_NET_DEVICES=droce0:1 UCX_TLS=rc_verbs,ud_verbs:aux
perf tag_lat -t tag_lat "${n[@]}"
perf tag_bw -t tag_bw -s 65536 "${n[@]}"

# Nothing left on either node once the programs are gone (droced sees the
# last hang-ups a little after the programs exit: asked again, up to 5 s).
droced_pair_check_empty "$CTL" "$T"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

#!/usr/bin/env bash
# Two processes exchange frames over net_memif: memif_peer server and client.
#   memif_pair.sh PATH/TO/memif_peer [FRAMES]
set -uo pipefail
peer=$1
frames=${2:-20000}
sock=/tmp/droce-memif-$$.sock
spid=
cleanup() {
  if [ -n "$spid" ]; then kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; fi
  rm -f "$sock"
}
trap cleanup EXIT INT TERM
timeout -k 5 60 "$peer" server "$sock" &
spid=$!
# The client connects once at start: wait for the server's socket.
for _ in $(seq 1 100); do
  [ -S "$sock" ] && break
  sleep 0.05
done
timeout -k 5 60 "$peer" client "$sock" "$frames"
crc=$?
wait "$spid"
src=$?
spid=
echo "client exit $crc, server exit $src"
[ "$crc" -eq 0 ] && [ "$src" -eq 0 ]

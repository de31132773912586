#!/usr/bin/env bash
# droce-nvmf-perf --verify against droce-nvmf, two processes joined by
# net_memif (shared memory) in a network namespace of their own: data written
# with a per-block tag (4 KiB in the capsule, 32 KiB by keyed SGL) and read
# back, then a short random mix; exit 0 only when every block verified and no
# command failed. Not timed (no figures are checked).
#   perf_memif.sh PATH/TO/droce-nvmf PATH/TO/droce-nvmf-perf PATH/TO/config/nvmf.toml
set -uo pipefail
tgt=$1
perf=$2
cfg=$3
ns=droce-nh-$$
sock=/tmp/droce-nvmf-memif-$$.sock
tmp=$(mktemp -d)
tpid=
cleanup() {
  if [ -n "$tpid" ]; then kill -TERM "$tpid" 2>/dev/null; wait "$tpid" 2>/dev/null; fi
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$tmp" "$sock"
}
trap cleanup EXIT INT TERM
if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
ip -n "$ns" link set lo up
EAL=(--log-level=lib.eal:error --log-level=pmd.net.memif:error)
ip netns exec "$ns" timeout -k 5 120 "$tgt" -c "$cfg" \
  --device "net_memif0,role=server,socket=$sock,id=5,mac=02:00:0a:16:00:02" --ip 10.22.0.2 \
  -- --lcores=0@1 "${EAL[@]}" >"$tmp/target.log" 2>&1 &
tpid=$!
for _ in $(seq 1 200); do grep -q 'listening on' "$tmp/target.log" 2>/dev/null && break; sleep 0.1; done
grep -q 'listening on' "$tmp/target.log" || { echo "FAIL: droce-nvmf did not start"; cat "$tmp/target.log"; exit 1; }
fails=0
run() {  # run NAME ARGS...
  local name=$1 rc=1 attempt
  shift
  # The memif client PMD fails its start when its first connect() is refused: try again.
  for attempt in 1 2 3; do
    ip netns exec "$ns" timeout -k 5 60 "$perf" -a 10.22.0.2 -n nqn.2026-12.org.droce:ram0 --timeout 10000 "$@" \
      --device "net_memif1,role=client,socket=$sock,id=5,mac=02:00:0a:16:00:01" --ip 10.22.0.1 \
      -- --lcores=0@0 "${EAL[@]}" >"$tmp/$name.log" 2>&1 && rc=0 && break
    grep -q "Failed to connect socket" "$tmp/$name.log" || break
    sleep 0.5
  done
  if [ $rc -eq 0 ]; then
    echo "ok: $name"
    grep -E '^verify:|IOPS' "$tmp/$name.log" | sed 's/^/    /'
  else
    echo "FAIL: $name"
    grep -v '^EAL\|^TELEMETRY' "$tmp/$name.log" | tail -n 15 | sed 's/^/  perf| /'
    fails=$((fails + 1))
  fi
}
run verify_4k --verify --verify-ios 2000 -q 32 -o 4096 --io-queues 2
run verify_32k --verify --verify-ios 300 -q 8 -o 32768
run randrw -w randrw -q 16 -o 4096 -t 2
kill -TERM "$tpid"
if ! wait "$tpid"; then echo "FAIL: droce-nvmf did not exit 0 on SIGTERM"; tail -n 10 "$tmp/target.log"; fails=$((fails + 1)); fi
tpid=
[ "$fails" -eq 0 ] && echo "all passed"
[ "$fails" -eq 0 ]

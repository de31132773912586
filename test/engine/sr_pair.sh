#!/usr/bin/env bash
# Selective repeat between two droced nodes, seen through droce-ctl qps.
#
# One network namespace of our own holds a veth pair va/vb; droced A owns va,
# droced B vb (net_af_packet, as shim_pair.sh). Both run selective repeat;
# B lists A as a peer running it, A learns it from B's marked requests. B's
# TX loses 1% of its frames (the fault injector). Debian's ib_write_bw runs
# through the drop-in libibverbs, server on A, client on B (requests B -> A).
# Mid-transfer, `droce-ctl qps` on each node must show the QP's
# selective-repeat state and counters next to the DCQCN columns:
#   B (requester): sr "negotiated", sr_resent > 0, sr_sacks_received > 0
#   A (responder): sr "negotiated" (learned), sr_ooo_placed > 0, sr_sacks_sent > 0
# and the table's header has SR and its counters after PACED; a QP without
# it (the GSI QP 1, UD) shows "off".
#   sr_pair.sh DROCED DROCE_CTL FRONT_LIBDIR
set -uo pipefail
DROCED=$1
CTL=$2
LIBDIR=$3
ns=droce-sr-$$
T=$(mktemp -d /tmp/droce-sr-pair-XXXXXX)
pids=()
pass=0
fail=0
# shellcheck source=../lib/droced_start.sh
source "$(dirname "$0")/../lib/droced_start.sh"
cleanup() {
  [ -n "${apid:-}" ] && kill -KILL "$apid" 2>/dev/null
  [ -n "${bpid:-}" ] && kill -KILL "$bpid" 2>/dev/null
  droced_node_stop "${pids[@]}"
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
# shellcheck source=../lib/netns.sh
source "$(dirname "$0")/../lib/netns.sh"  # droce_veth_ns, AFP_RUN
if ! droce_veth_ns "$ns"; then echo "SKIP: cannot create network namespaces"; exit 77; fi
in_ns() { ip netns exec "$ns" "$@"; }
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
node() {  # node NAME IFACE IP MAC LCORES PORT_TOML ROCE_TOML
  DN_TIMEOUT=120 DN_DEVARGS=,framecnt=16384 DN_AFP_RUN=$AFP_RUN DN_PORT_TOML=$6 DN_ROCE_TOML=$7 \
    droced_node "$1" "$ns" "$2" "$3" "$4" "$5" "$T" "$DROCED"
  local rc=$?
  pids+=("$DN_PID")
  return $rc
}
# Two loops on a 2-CPU machine: A's core on CPU 1, B's on CPU 0.
if node a va 10.41.0.1 02:00:0a:29:00:01 "0@0,1@1" "" "selective_repeat = true" &&
  node b vb 10.41.0.2 02:00:0a:29:00:02 "0@1,1@0" $'[port.fault]\nseed = 7\n[port.fault.tx]\ndrop = 0.01' \
    $'selective_repeat = true\nselective_repeat_peers = ["10.41.0.1"]'; then
  ok "two droced nodes with selective repeat, B's TX losing 1%"
else
  bad "droced did not start"
  exit 1
fi
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Sanitizer build: the drop-in is instrumented and Debian's programs are not,
# so the ASan runtime is preloaded (meson sets DROCE_TEST_PRELOAD).
pre=(env)
[ -n "${DROCE_TEST_PRELOAD:-}" ] && pre=(env LD_PRELOAD="$DROCE_TEST_PRELOAD" ASAN_OPTIONS=detect_leaks=0)
# The GID index of A's 10.41.0.1 (its ::ffff: GID; ibv_devinfo needs the
# preload too). No fallback: index 0 is the fe80:: link-local GID, which is not
# in B's selective_repeat_peers, so a run on it would negotiate no SR at all.
out=$(DROCE_SOCKET=$T/a-verbs.sock timeout 10 "${pre[@]}" ibv_devinfo -v 2>&1)
gidx=$(echo "$out" | sed -n 's/.*GID\[ *\([0-9]*\)\]:.*::ffff:10.41.0.1.*/\1/p' | head -n 1)
if [ -z "$gidx" ]; then
  bad "ibv_devinfo -v against node A: no GID of 10.41.0.1"
  head -n 20 <<<"$out"
  exit 1
fi
port=$((20000 + RANDOM % 20000))

DROCE_SOCKET=$T/a-verbs.sock in_ns timeout 60 "${pre[@]}" ib_write_bw -x "$gidx" -D 4 -p "$port" >"$T/a.log" 2>&1 &
apid=$!
sleep 0.4
DROCE_SOCKET=$T/b-verbs.sock in_ns timeout 60 "${pre[@]}" ib_write_bw -x "$gidx" -D 4 -p "$port" localhost >"$T/b.log" 2>&1 &
bpid=$!
# Mid-transfer (bounded: 8 s): both nodes' RC QP connected (the server's stays in
# RTR: it only receives) with its counters moving.
qa= qb=
for _ in $(seq 40); do
  sleep 0.2
  qa=$("$CTL" -s "$T/a-ctl.sock" --json qps 2>/dev/null)
  qb=$("$CTL" -s "$T/b-ctl.sock" --json qps 2>/dev/null)
  python3 - "$qa" "$qb" <<'EOF' && break
import json, sys
a, b = (json.loads(x)["qps"] for x in sys.argv[1:3])
rc = lambda q: [r for r in q if r["type"] == "RC" and r["state"] in ("RTS", "RTR")]
sys.exit(0 if rc(a) and rc(b) and rc(b)[0]["sr_resent"] > 0 and rc(a)[0]["sr_sacks_sent"] > 0 else 1)
EOF
done
tab=$("$CTL" -s "$T/b-ctl.sock" qps 2>&1)
wait "$bpid"
rb=$?
bpid=
wait "$apid"
ra=$?
apid=
if [ $ra -eq 0 ] && [ $rb -eq 0 ]; then
  ok "ib_write_bw A <- B under 1% loss"
  grep -E '^ *[0-9]+ +[0-9]+ ' "$T/b.log" | tail -n 1 | sed 's/^/       /'
else
  bad "ib_write_bw (exit $ra/$rb)"
  tail -n 8 "$T/a.log" "$T/b.log"
fi

check() {  # check NAME PYTHON_CONDITION: on a, b (the connected RC QP of each node) and qa, qb (all QPs)
  if python3 - "$qa" "$qb" "$2" <<'EOF'; then ok "$1"; else bad "$1"; fi
import json, sys
qa, qb = (json.loads(x)["qps"] for x in sys.argv[1:3])
rc = lambda q: [r for r in q if r["type"] == "RC" and r["state"] in ("RTS", "RTR")]
if not rc(qa) or not rc(qb):
    print("  no connected RC QP:", sys.argv[1][:600], sys.argv[2][:600])
    sys.exit(1)
a, b = rc(qa)[0], rc(qb)[0]
keys = ("sr", "sr_resent", "sr_sacks_received", "sr_ooo_placed", "sr_sacks_sent", "retransmits")
ok = eval(sys.argv[3])
if not ok:
    print("  A:", {k: a.get(k) for k in keys}, " B:", {k: b.get(k) for k in keys})
sys.exit(0 if ok else 1)
EOF
}
check "qps on B (requester, lists A): sr negotiated, selective resends and SACKs taken" \
  "b['sr'] == 'negotiated' and b['sr_resent'] > 0 and b['sr_sacks_received'] > 0 and b['retransmits'] >= b['sr_resent']"
check "qps on A (learned from B's marks): sr negotiated, packets placed out of order, SACKs sent" \
  "a['sr'] == 'negotiated' and a['sr_ooo_placed'] > 0 and a['sr_sacks_sent'] > 0 and a['sr_resent'] == 0"
check "qps: a QP without it (UD, GSI) shows sr off with zero counters" \
  "all(r['sr'] == 'off' and r['sr_resent'] == 0 for r in qa + qb if r['type'] != 'RC') and any(r['type'] != 'RC' for r in qa)"
if head -n 1 <<<"$tab" | grep -qiE "paced +sr +sr_resent +sr_sacks_received +sr_ooo_placed +sr_sacks_sent"; then
  ok "droce-ctl qps table: SR and its counters after the DCQCN columns"
else
  bad "droce-ctl qps table header"
  head -n 3 <<<"$tab"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

#!/usr/bin/env bash
# rdma-core's own verbs test suite (Debian's python3-pyverbs, rdma-core 44:
# /usr/share/doc/rdma-core/tests, gunzipped into a copy) through droce's
# drop-in libibverbs/librdmacm against one droced node (af_packet on a veth in
# a namespace of its own, one core). Prints each test's outcome and a table
# (ok / fail / error / skipped). Exit 0 when the suite ran (the table is the
# result; lib/shim/README.md records it).
#   pyverbs_suite.sh DROCED FRONT_DIR [unittest args, e.g. -k test_qp]
set -uo pipefail
DROCED=$(realpath "$1")
FRONT=$(realpath "$2")
shift 2
SRC=/usr/share/doc/rdma-core/tests
[ -d "$SRC" ] || { echo "SKIP: python3-pyverbs is not installed"; exit 77; }
ns=droce-pv-$$
T=$(mktemp -d /tmp/droce-pv-XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  ip netns del "$ns" 2>/dev/null || true
  [ -n "${PYVERBS_KEEP:-}" ] && echo "logs kept in $T" || rm -rf "$T"
}
trap cleanup EXIT INT TERM
if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
ip -n "$ns" link set lo up
ip -n "$ns" link add vk type veth peer name vd
ip netns exec "$ns" sysctl -qw net.ipv6.conf.vd.disable_ipv6=1
ip -n "$ns" link set vd up
ip -n "$ns" link set vk up
cp -r "$SRC" "$T/tests"
gunzip -f "$T"/tests/*.gz
cat >"$T/node.toml" <<EOF
[eal]
args = ["--in-memory", "--no-pci", "--log-level=lib.eal:error", "--log-level=pmd.net.af_packet:error"]
lcores = "0,1"
main_lcore = 0

[[port]]
name = "vd"
device = "net_af_packet0,iface=vd,framecnt=4096"
mac = "02:00:0a:20:00:02"
ipv4 = ["10.32.0.2/24"]

[[core]]
lcore = 1
queues = [{ port = "vd", rx = 0 }]

[roce]
mr_memory_mb = 16

[control]
socket = "$T/ctl.sock"
mode = "0600"

[shim]
socket = "$T/verbs.sock"
mode = "0600"

[log]
level = "warn"
EOF
ip netns exec "$ns" timeout -k 5 "${PYVERBS_TIMEOUT:-1500}" "$DROCED" --config "$T/node.toml" >"$T/droced.log" 2>&1 &
pid=$!
for _ in $(seq 1 150); do
  [ -S "$T/verbs.sock" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
[ -S "$T/verbs.sock" ] || { echo "FAIL droced did not start"; cat "$T/droced.log"; exit 1; }
# Each test module on its own, bounded (a test that hangs costs its module, not the run).
(
  cd "$T/tests" || exit 1
  for m in test_*.py; do
    m=${m%.py}
    ip netns exec "$ns" env DROCE_SOCKET="$T/verbs.sock" LD_LIBRARY_PATH="$FRONT" \
      timeout -k 5 "${PYVERBS_MODULE_TIMEOUT:-60}" /usr/bin/python3 run_tests.py -v "$m" "$@" >"$T/$m.log" 2>&1
    rc=$?
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "$m ... TIMEOUT" >>"$T/$m.log"
    grep -E '^test\w* \(.*\) \.\.\. |\.\.\. (ok|FAIL|ERROR|skipped|TIMEOUT)' "$T/$m.log" | sed "s/^/$m: /"
  done
) >"$T/results.txt"
python3 - "$T/results.txt" <<'EOF'
import re, sys, collections
res = collections.OrderedDict()
cur = None
for line in open(sys.argv[1]):
    m = re.match(r'^(\S+): (test\w*) \((\S+)\)', line)
    if m:
        cur = m.group(3) + '.' + m.group(2)
    o = re.search(r'\.\.\. (ok|FAIL|ERROR|skipped|TIMEOUT)', line)
    if o and cur:
        res[cur] = o.group(1)
        cur = None
    elif o and 'TIMEOUT' in line:
        res[line.split(':')[0] + ' (module)'] = 'TIMEOUT'
for k, v in res.items():
    print(f'{v:8} {k}')
c = collections.Counter(res.values())
print()
print('| ok | fail | error | skipped | timeout |')
print('|---|---|---|---|---|')
print(f"| {c['ok']} | {c['FAIL']} | {c['ERROR']} | {c['skipped']} | {c['TIMEOUT']} |")
EOF
kill -TERM "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
pid=

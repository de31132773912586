#!/usr/bin/env bash
# rdma-core's own verbs test suite (Debian's python3-pyverbs, rdma-core 44:
# /usr/share/doc/rdma-core/tests, gunzipped into a copy) through droce's
# drop-in libibverbs/librdmacm against one droced node (af_packet on a veth in
# a namespace of its own; test/lib/droced_start.sh), next to Linux rxe's
# results (pyverbs_rxe_results.txt, made by pyverbs_rxe_reference.sh).
#
# Each test module runs on its own, bounded (PYVERBS_MODULE_TIMEOUT, 60 s: a
# test that hangs costs its module, whose unfinished tests count as
# "timeout"). Prints each test's outcome on droce and rxe, and the table.
# Fails (pyverbs_results.py compare) when a test ends in error/failure on
# droce, or passes on rxe but not on droce, unless pyverbs_not_supported.txt
# lists it (with the reason); then checks `ibv_devinfo -v` against the limits
# droced enforces (devinfo_limits.py).
#   pyverbs_suite.sh DROCED FRONT_DIR [unittest args, e.g. -k test_qp]
#   PYVERBS_KEEP=1: keep the logs (path printed).
set -uo pipefail
DROCED=$(realpath "$1")
FRONT=$(realpath "$2")
shift 2
here=$(cd "$(dirname "$0")" && pwd)
SRC=/usr/share/doc/rdma-core/tests
PY=/usr/bin/python3  # Debian's: python3-pyverbs is installed for it
[ -d "$SRC" ] || { echo "SKIP: python3-pyverbs is not installed"; exit 77; }
# shellcheck source=../lib/droced_start.sh
source "$here/../lib/droced_start.sh"
ns=droce-pv-$$
T=$(mktemp -d /tmp/droce-pv-XXXXXX)
cleanup() {
  [ -n "$DN_PID" ] && droced_node_stop "$DN_PID"
  ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  ip netns del "$ns" 2>/dev/null || true
  if [ -n "${PYVERBS_KEEP:-}" ]; then echo "logs kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
ip -n "$ns" link set lo up
ip -n "$ns" link add vk type veth peer name vd
ip netns exec "$ns" sysctl -qw net.ipv6.conf.vd.disable_ipv6=1
ip -n "$ns" link set vd up
ip -n "$ns" link set vk up
cp -r "$SRC" "$T/tests"
gunzip -f "$T"/tests/*.gz
DN_TIMEOUT=${PYVERBS_TIMEOUT:-1500} droced_node a "$ns" vd 10.32.0.2 02:00:0a:20:00:02 "0,1" "$T" "$DROCED" ||
  { echo "FAIL droced did not start"; exit 1; }
cd "$T/tests" || exit 1
if ! "$PY" run_tests.py --list-tests "$@" >"$T/list.txt" 2>"$T/list.err"; then
  cat "$T/list.err"
  echo "FAIL cannot list the suite's tests"
  exit 1
fi
mods=$(sed -n 's/^tests\.\(test_[a-z0-9_]*\)\..*/\1/p' "$T/list.txt" | sort -u)
start=$(date +%s)
for m in $mods; do
  ip netns exec "$ns" env DROCE_SOCKET="$T/a-verbs.sock" LD_LIBRARY_PATH="$FRONT" \
    timeout -k 5 "${PYVERBS_MODULE_TIMEOUT:-60}" "$PY" run_tests.py -v "$m" "$@" >"$T/$m.log" 2>&1
  rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "PYVERBS-TIMEOUT $m" >>"$T/$m.log"; fi
done
echo "suite ran in $(($(date +%s) - start)) s"
"$PY" "$here/pyverbs_results.py" parse "$T/list.txt" "$T"/test_*.log >"$T/droce.txt" || exit 1
subset=
[ $# -gt 0 ] && subset=subset
"$PY" "$here/pyverbs_results.py" compare "$T/droce.txt" "$here/pyverbs_rxe_results.txt" \
  "$here/pyverbs_not_supported.txt" $subset
rc=$?
# ibv_devinfo -v against the limits droced enforces (devinfo_limits.py).
echo
echo "== ibv_devinfo -v against what droced enforces"
in_drop_in() { ip netns exec "$ns" env DROCE_SOCKET="$T/a-verbs.sock" LD_LIBRARY_PATH="$FRONT" "$@"; }
if in_drop_in timeout 20 ibv_devinfo -v >"$T/devinfo.txt" 2>&1; then
  cat "$T/devinfo.txt"
  in_drop_in timeout 60 "$PY" "$here/devinfo_limits.py" "$T/devinfo.txt" || rc=1
else
  cat "$T/devinfo.txt"
  echo "FAIL ibv_devinfo -v"
  rc=1
fi
exit $rc

#!/usr/bin/env bash
# Makes pyverbs_rxe_results.txt: rdma-core's pyverbs suite (Debian 12's
# python3-pyverbs, rdma-core 44) on Linux Soft-RoCE (kernel 6.1 rdma_rxe on
# eth0 of an rxe-peer guest: test/interop/rxe-peer), run as
# test/shim/pyverbs_suite.sh runs it on droce (each module on its own,
# run_tests.py -v), then read with pyverbs_results.py parse. By hand (a TCG
# guest runs the 273 tests in ~15 minutes):
#   export RXEPEER_NS=me RXEPEER_BRIDGE=mebr
#   test/interop/rxe-peer/rxepeer start me1 --ip 10.79.0.1/24 --mem 1024
#   test/shim/pyverbs_rxe_reference.sh me1 test/shim/pyverbs_rxe_results.txt
#   test/interop/rxe-peer/rxepeer stop me1; ip netns del me
set -euo pipefail
guest=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
rxepeer=$here/../interop/rxe-peer/rxepeer
SRC=/usr/share/doc/rdma-core/tests
T=$(mktemp -d /tmp/droce-pvrxe-XXXXXX)
trap 'rm -rf "$T"' EXIT
cp -r "$SRC" "$T/tests"
gunzip -f "$T"/tests/*.gz
(cd "$T/tests" && /usr/bin/python3 run_tests.py --list-tests >"$T/list.txt")
mods=$(sed -n 's/^tests\.\(test_[a-z0-9_]*\)\..*/\1/p' "$T/list.txt" | sort -u | tr '\n' ' ')
# In the guest (the host's root file system, read only, under a tmpfs overlay).
script='rm -rf /tmp/pv && cp -r '$SRC' /tmp/pv && gunzip -f /tmp/pv/*.gz && cd /tmp/pv || exit 1
for m in '$mods'; do
  timeout -k 5 1200 python3 run_tests.py -v "$m" 2>&1
  rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "PYVERBS-TIMEOUT $m"; fi
done'
job=$("$rxepeer" exec "$guest" --bg --timeout 3600 -- bash -c "$script")
"$rxepeer" wait "$guest" "$job" --timeout 3700 >"$T/rxe.log" 2>&1 || true
kernel=$("$rxepeer" exec "$guest" -- uname -r)
{
  echo "# rdma-core 44's pyverbs suite (Debian 12 python3-pyverbs) on Linux rxe (kernel $kernel, rdma_rxe"
  echo "# on the virtio NIC of a TCG guest), made by test/shim/pyverbs_rxe_reference.sh on $(date -u +%F)."
  echo "# STATUS<TAB>TEST<TAB>skip reason"
  /usr/bin/python3 "$here/pyverbs_results.py" parse "$T/list.txt" "$T/rxe.log"
} >"$out"
cut -f1 "$out" | grep -v '^#' | sort | uniq -c

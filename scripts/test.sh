#!/usr/bin/env bash
# Runs every droce test on this machine (Debian 12, as root): installs what is
# missing, reserves hugepages, builds release and sanitizer (ASan+UBSan) builds,
# runs the unit/protocol/golden suites in both, the parser and engine fuzzers for a bounded
# time, the integration suites, a 2-minute soak (scripts/soak.sh), and the interop CI subset against Linux Soft-RoCE
# in QEMU guests (scripts/interop.sh --ci with the in-tree harness
# test/interop/rxe-peer, whose setup this script runs first: QEMU, guest kernel,
# initramfs). Interop that cannot run counts as failed; only a run without root
# counts as skipped (DROCE_SKIP_INTEROP=1 skips it on purpose). Ends with one
# line: "N passed, N failed".
#   scripts/test.sh [--quick]     --quick: release build only, no fuzzing, no soak
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/setup.sh"
quick=0
[ "${1:-}" = "--quick" ] && quick=1

droce_install_packages
droce_hugepages

PASSED=0
FAILED=0
SKIPPED=0
FAILED_NAMES=()
FAILED_LOGS=()  # testlog.json of each suite with a failure: their tails are printed last
SKIPPED_NAMES=()
add() {  # add NAME PASSED FAILED
  PASSED=$((PASSED + $2))
  FAILED=$((FAILED + $3))
  if [ "$3" -gt 0 ]; then FAILED_NAMES+=("$1"); fi
  echo "== $1: $2 passed, $3 failed"
}

# run_meson_tests NAME BUILDDIR [meson setup options]
run_meson_tests() {
  local name=$1 dir=$2
  shift 2
  echo "== building $name ($dir)"
  if ! droce_build "$dir" "$@"; then
    add "$name build" 0 1
    return
  fi
  meson test -C "$DROCE_ROOT/$dir" --print-errorlogs --num-processes 2 >"$DROCE_ROOT/$dir/test-run.log" 2>&1
  tail -n 25 "$DROCE_ROOT/$dir/test-run.log"
  local log="$DROCE_ROOT/$dir/meson-logs/testlog.json" names
  read -r p f names < <(python3 "$here/count-tests.py" "$log")
  add "$name" "$p" "$f"
  if [ "$f" -gt 0 ]; then
    FAILED_NAMES[-1]="$name ($names)"
    FAILED_LOGS+=("$log")
  fi
  no_leftovers "$name" "$DROCE_ROOT/$dir"
}

# A test that leaves a process of the build running (a busy-polling daemon)
# skews every test after it: count it as a failure, name it, and kill it.
no_leftovers() {  # no_leftovers NAME BUILDDIR
  local p exe left=()
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case $exe in "$2"/*) left+=("${p#/proc/}:${exe#"$2"/}") ;; esac
  done
  if ((${#left[@]})); then
    echo "== $1: processes left running by the tests: ${left[*]} (killed)"
    for p in "${left[@]}"; do kill -9 "${p%%:*}" 2>/dev/null || true; done
    add "$1 (no processes left behind)" 0 1
  fi
}

run_meson_tests "release" build --buildtype=release
# rdma-core's pyverbs suite on droce next to Linux rxe (the release run's
# pyverbs_suite test, test/shim/pyverbs_suite.sh): its table.
python3 -c 'import json, sys
for l in open(sys.argv[1]):
    t = json.loads(l)
    if t.get("name", "").endswith("pyverbs_suite"): print(t.get("stdout") or "")' \
  "$DROCE_ROOT/build/meson-logs/testlog.json" 2>/dev/null | sed -n '/^rdma-core pyverbs suite/,/^ok on rxe/p'
if [ $quick -eq 0 ]; then
  # A UBSan report fails its test (UBSan recovers by default, and meson 1.0
  # sets no UBSAN_OPTIONS): the sanitizer run is clean and must stay so.
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  run_meson_tests "sanitizers" build-san --buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false
  echo "== fuzzing"
  if bash "$here/fuzz.sh" "${DROCE_FUZZ_SECONDS:-60}"; then add "fuzz (parser, engine, cm)" 1 0; else add "fuzz (parser, engine, cm)" 0 1; fi
  # Two droced nodes under mixed traffic, loss and SIGKILLed clients: RSS,
  # hugepages and fds must stay flat (scripts/soak.sh; 30 minutes by hand).
  echo "== soak (${DROCE_SOAK_MINUTES:-2} min)"
  if bash "$here/soak.sh" --minutes "${DROCE_SOAK_MINUTES:-2}" --build "$DROCE_ROOT/build" >"$DROCE_ROOT/build/soak-run.log" 2>&1; then
    tail -n 12 "$DROCE_ROOT/build/soak-run.log"
    add "soak" 1 0
  else
    tail -n 30 "$DROCE_ROOT/build/soak-run.log"
    add "soak" 0 1
  fi
fi

# Interoperability with Linux Soft-RoCE in QEMU guests (CI subset, scripts/interop.sh):
# the harness's setup first (installs QEMU and what the guests need, fetches the guest
# kernel, builds the initramfs; cached). Exit 77 = not root, counted as skipped (never
# as passed); a harness that cannot be set up or a guest that cannot boot is a failure.
echo "== interop (rxe guest, CI subset)"
if [ "${DROCE_SKIP_INTEROP:-0}" = 1 ]; then
  irc=77
  echo "== interop: SKIPPED (DROCE_SKIP_INTEROP=1)"
else
  if [ "$(id -u)" -eq 0 ]; then
    echo "== interop: setting up the harness (test/interop/rxe-peer/rxepeer setup)"
    # A failed setup shows in interop.sh's own checks (counted as failed there).
    timeout -k 30 1200 bash -c "source '$here/setup.sh' && droce_install_interop" ||
      echo "== interop: harness setup failed (see above)"
  fi
  timeout -k 30 1500 bash "$here/interop.sh" --ci
  irc=$?
fi
case $irc in
  0) add "interop (rxe)" 1 0 ;;
  77) SKIPPED=$((SKIPPED + 1)); SKIPPED_NAMES+=("interop (rxe)"); echo "== interop (rxe): SKIPPED" ;;
  *) add "interop (rxe)" 0 1 ;;
esac

echo
for log in "${FAILED_LOGS[@]}"; do python3 "$here/count-tests.py" "$log" --tails 30; done
if ((${#FAILED_NAMES[@]})); then echo "failed: ${FAILED_NAMES[*]}"; fi
if ((${#SKIPPED_NAMES[@]})); then echo "skipped ($SKIPPED): ${SKIPPED_NAMES[*]}"; fi
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]

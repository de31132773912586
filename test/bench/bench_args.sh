#!/usr/bin/env bash
# Every benchmark's command line (test/bench/bench_args.h, scripts/bench.sh):
# --help prints the usage and exits 0; a word, 0, a negative number or one
# argument too many prints it on stderr and exits 2, without running a case.
#   bench_args.sh SCRIPTS_DIR BENCH...   (each BENCH: path:max-arguments)
set -u
scripts=$1
shift
fail=0
expect() {  # expect RC DESCRIPTION CMD...: runs CMD (10 s at most), checks its status and that it printed a usage
  local want=$1 what=$2
  shift 2
  local out rc
  out=$(timeout 10 "$@" 2>&1)
  rc=$?
  if [ "$rc" != "$want" ] || ! grep -qi 'usage\|^  scripts/bench.sh' <<<"$out"; then
    echo "FAIL: $what: exit $rc (want $want); output: $(head -c 300 <<<"$out")"
    fail=1
  else
    echo "ok: $what: exit $rc"
  fi
}
for spec in "$@"; do
  bin=${spec%:*}
  max=${spec##*:}
  name=$(basename "$bin")
  expect 0 "$name --help" "$bin" --help
  expect 2 "$name abc" "$bin" abc
  expect 2 "$name 0" "$bin" 0
  expect 2 "$name -1" "$bin" -1
  extra=()
  for ((i = 0; i <= max; ++i)); do extra+=(0.01); done
  expect 2 "$name with $((max + 1)) arguments" "$bin" "${extra[@]}"
done
# scripts/bench.sh checks its arguments before it installs or builds anything.
expect 0 "bench.sh --help" bash "$scripts/bench.sh" --help
expect 2 "bench.sh abc" bash "$scripts/bench.sh" abc
expect 2 "bench.sh 0" bash "$scripts/bench.sh" 0
expect 2 "bench.sh 0.5" bash "$scripts/bench.sh" 0.5
exit $fail

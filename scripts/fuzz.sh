#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a
# bounded time (default 60 s each):
#   fuzz_parse   the frame parser, its corpus seeded from the rxe captures;
#   fuzz_engine  a whole transport engine (QPs in RTS, MRs, timers) driven by
#                frame sequences, its corpus from test/fuzz/corpus/fuzz_engine
#                and test/fuzz/seeds_engine.py (see test/fuzz/README.md);
#   fuzz_cm      the CM state machine of a port (MADs, time, program calls).
#   scripts/fuzz.sh [SECONDS]
# On a failure the target's report is printed and its crash input kept in
# build-fuzz/artifacts/ (rerun: build-fuzz/test/fuzz/<target> <input>).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/setup.sh"
secs=${1:-60}
dir=build-fuzz
if [ ! -f "$DROCE_ROOT/$dir/build.ninja" ]; then
  CXX=clang++ meson setup "$DROCE_ROOT/$dir" "$DROCE_ROOT" --buildtype=debugoptimized -Dfuzz=true -Dtests=disabled >/dev/null
fi
ninja -C "$DROCE_ROOT/$dir" test/fuzz/fuzz_parse test/fuzz/fuzz_engine test/fuzz/fuzz_cm
mkdir -p "$DROCE_ROOT/$dir/artifacts"
# UBSan reports count as failures (they are recoverable by default).
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=quarantine_size_mb=64

# run_target NAME CORPUS_DIR [libFuzzer options...]: one bounded run; 0 if clean.
run_target() {
  local name=$1 corpus=$2
  shift 2
  local log="$DROCE_ROOT/$dir/$name.log" rc=0
  timeout -k 10 $((secs + 60)) "$DROCE_ROOT/$dir/test/fuzz/$name" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$DROCE_ROOT/$dir/artifacts/$name-" "$@" "$corpus" 2>"$log" || rc=$?
  echo "$name: $(grep -E 'stat::number_of_executed_units' "$log" | awk '{print $2}') executions," \
    "$(grep -E 'stat::new_units_added' "$log" | awk '{print $2}') new units, exit $rc"
  if [ "$rc" -ne 0 ]; then
    echo "$name failed (exit $rc):"
    # From the first report line on: the error, its stack, the input (no shadow-memory dump).
    grep -v -E '^#[0-9]+|^ *0x[0-9a-f]+: |^=>0x' "$log" |
      awk '/ERROR|invariant|runtime error|does not parse|written by/ {p = 1} p' | head -n 80
    ls -1 "$DROCE_ROOT/$dir/artifacts/$name-"* 2>/dev/null | sed 's/^/crash input kept: /' || true
  fi
  return $rc
}

rc=0
corpus="$DROCE_ROOT/$dir/corpus-parse"
mkdir -p "$corpus"
python3 "$here/pcap-to-corpus.py" "$corpus" "$DROCE_ROOT"/test/data/*.pcap >/dev/null
cp -n "$DROCE_ROOT"/test/fuzz/corpus/fuzz_parse/* "$corpus"/ 2>/dev/null || true  # inputs that once failed
run_target fuzz_parse "$corpus" -max_len=9100 || rc=1

# The engine fuzzer works on a copy of the corpus kept in the tree (new units
# stay in build-fuzz/; test/fuzz/README.md says how to fold them back in).
corpus="$DROCE_ROOT/$dir/corpus-engine"
mkdir -p "$corpus"
cp -n "$DROCE_ROOT"/test/fuzz/corpus/fuzz_engine/* "$corpus"/ 2>/dev/null || true
python3 "$DROCE_ROOT/test/fuzz/seeds_engine.py" "$corpus"
run_target fuzz_engine "$corpus" -max_len=512 || rc=1

corpus="$DROCE_ROOT/$dir/corpus-cm"
mkdir -p "$corpus"
run_target fuzz_cm "$corpus" -max_len=4096 || rc=1
exit $rc

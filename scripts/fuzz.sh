#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs the parser fuzzer for a
# bounded time (default 60 s), its corpus seeded from the rxe captures.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/setup.sh"
secs=${1:-60}
dir=build-fuzz
if [ ! -f "$DROCE_ROOT/$dir/build.ninja" ]; then
  CXX=clang++ meson setup "$DROCE_ROOT/$dir" "$DROCE_ROOT" --buildtype=debugoptimized -Dfuzz=true -Dtests=disabled >/dev/null
fi
ninja -C "$DROCE_ROOT/$dir" test/fuzz/fuzz_parse
corpus="$DROCE_ROOT/$dir/corpus-parse"
mkdir -p "$corpus"
python3 "$here/pcap-to-corpus.py" "$corpus" "$DROCE_ROOT"/test/data/*.pcap >/dev/null
# A crash input is written to build-fuzz/artifacts/ and its report printed.
mkdir -p "$DROCE_ROOT/$dir/artifacts"
rc=0
timeout -k 10 $((secs + 60)) "$DROCE_ROOT/$dir/test/fuzz/fuzz_parse" -max_total_time="$secs" -max_len=9100 \
  -print_final_stats=1 -artifact_prefix="$DROCE_ROOT/$dir/artifacts/" "$corpus" 2>"$DROCE_ROOT/$dir/fuzz.log" || rc=$?
grep -E 'stat::number_of_executed_units|stat::new_units_added' "$DROCE_ROOT/$dir/fuzz.log" || true
if [ "$rc" -ne 0 ]; then
  echo "fuzz_parse failed (exit $rc):"
  grep -v -E '^#[0-9]+' "$DROCE_ROOT/$dir/fuzz.log" | tail -n 40
fi
exit $rc

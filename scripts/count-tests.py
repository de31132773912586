#!/usr/bin/env python3
"""Totals of a `meson test` run, read from its testlog.json: Catch2 test cases
where a test printed Catch2's summary, otherwise one per meson test.
  count-tests.py TESTLOG             prints "PASSED FAILED NAMES" (NAMES: the
                                     failed meson tests, comma-separated, or -)
  count-tests.py TESTLOG --tails N   prints the last N lines of each failed
                                     test's output"""
import json
import re
import sys

passed = failed = 0
failed_tests = []
with open(sys.argv[1]) as f:
    for line in f:
        t = json.loads(line)
        out = t.get("stdout", "") or ""
        ok = t.get("result") in ("OK", "EXPECTEDFAIL")
        m = re.search(r"test cases:\s+(\d+)\s+\|\s+(\d+) passed\s+\|\s+(\d+) failed", out)
        a = re.search(r"All tests passed \(\d+ assertions? in (\d+) test cases?\)", out)
        if m and ok and int(m.group(3)) == 0:
            passed += int(m.group(2))
        elif m:
            passed += int(m.group(2))
            failed += max(int(m.group(3)), 1)
            failed_tests.append(t)
        elif a and ok:
            passed += int(a.group(1))
        elif ok:
            passed += 1
        else:
            failed += 1
            failed_tests.append(t)

if len(sys.argv) > 3 and sys.argv[2] == "--tails":
    n = int(sys.argv[3])
    for t in failed_tests:
        out = ((t.get("stdout") or "") + (t.get("stderr") or "")).rstrip().splitlines()
        print(f"--- {t.get('name')} ({t.get('result')}, {t.get('duration', 0):.0f} s): last {n} lines")
        print("\n".join(out[-n:]))
else:
    print(passed, failed, ",".join(t.get("name", "?") for t in failed_tests) or "-")

#!/usr/bin/env python3
"""Totals of a `meson test` run, read from its testlog.json: Catch2 test cases
where a test printed Catch2's summary, otherwise one per meson test.
Prints "PASSED FAILED"."""
import json
import re
import sys

passed = failed = 0
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
        elif a and ok:
            passed += int(a.group(1))
        elif ok:
            passed += 1
        else:
            failed += 1
print(passed, failed)

#!/usr/bin/env python3
"""Per-test results of rdma-core's pyverbs suite (run_tests.py -v), and the
comparison of droce's run with Linux rxe's (test/shim/pyverbs_suite.sh).

  pyverbs_results.py parse LIST LOG...
      LIST: the suite's test ids (run_tests.py --list-tests). LOG: unittest's
      verbose output of one or more modules. Prints one line per test of LIST:
      "STATUS<TAB>ID<TAB>REASON", STATUS one of ok, skipped, fail, error,
      timeout (a LOG line "PYVERBS-TIMEOUT <module>": its module was stopped
      before the test reported), missing (no result found).
  pyverbs_results.py compare DROCE RXE EXPECTED [subset]
      DROCE, RXE: files printed by `parse`; EXPECTED: the tests droce does not
      pass yet, "ID-or-prefix<TAB or spaces>reason" per line (# comments).
      Prints each test's droce and rxe status (the vendor-only tests when
      something is wrong with them), the table, and exits 1 when a test that
      is not in EXPECTED ends in fail/error/timeout/missing on droce or passes
      on rxe but not on droce, or when an EXPECTED line names no test of the
      suite. An EXPECTED line whose tests all passed gets a NOTE (not a
      failure: some tests draw random attributes, and pass or skip by them);
      with `subset` (a run of part of the suite) the lines are not checked.

Results are read from the per-test lines, not from unittest's summary: a
test's line is "name (id)", optionally its docstring's first line, then
" ... " and the outcome, which a test's own output can push onto a later line;
the "ERROR: name (id)" / "FAIL: name (id)" blocks unittest prints at the end
are authoritative for those two. A class or module whose setup fails or skips
("setUpClass (tests.mod.Class) ... skipped 'why'") gives its outcome to each
of its tests.
"""
import collections
import re
import sys

HEADER = re.compile(r'^(\w+) \(([\w.]+)\)(?: \.\.\. |$)', re.M)
OUTCOME = re.compile(
    r"(?:\.\.\. |^)(ok|FAIL|ERROR|skipped (?:'.*'|\".*\")|expected failure|unexpected success)\s*$", re.M)
BLOCK = re.compile(r'^(ERROR|FAIL): (\w+) \(([\w.]+)\)', re.M)
TIMEOUT = re.compile(r'^PYVERBS-TIMEOUT (\S+)', re.M)
STATUS = {'ok': 'ok', 'FAIL': 'fail', 'ERROR': 'error', 'expected failure': 'ok',
          'unexpected success': 'fail'}
BAD = ('fail', 'error', 'timeout', 'missing')


def test_id(name, paren):
    # Python >= 3.11 prints "name (pkg.mod.Class.name)", older ones "name (pkg.mod.Class)".
    return paren if paren.endswith('.' + name) else paren + '.' + name


def parse(list_file, logs):
    ids = [l.strip() for l in open(list_file) if l.strip().startswith('tests.')]
    res = {}
    group = {}  # class/module id -> (status, reason) from setUpClass etc.
    timed_out = set()
    for log in logs:
        text = open(log, errors='replace').read()
        timed_out.update(m.group(1) for m in TIMEOUT.finditer(text))
        events = [(m.start(), 'h', m) for m in HEADER.finditer(text)]
        events += [(m.start(), 'o', m) for m in OUTCOME.finditer(text)]
        events.sort(key=lambda e: e[0])
        cur = None
        for pos, kind, m in events:
            if kind == 'h':
                cur = (m.group(1), m.group(2))
                continue
            if cur is None:
                continue
            out = m.group(1)
            status, reason = (('skipped', out[9:-1]) if out.startswith('skipped')
                              else (STATUS[out], ''))
            name, paren = cur
            if name in ('setUpClass', 'tearDownClass', 'setUpModule', 'tearDownModule'):
                group[paren] = (status, reason)
            else:
                res[test_id(name, paren)] = (status, reason)
            cur = None
        for m in BLOCK.finditer(text):
            name, paren = m.group(2), m.group(3)
            st = STATUS[m.group(1)]
            if name in ('setUpClass', 'tearDownClass', 'setUpModule', 'tearDownModule'):
                group[paren] = (st, name)
            else:
                res[test_id(name, paren)] = (st, res.get(test_id(name, paren), ('', ''))[1])
    out = []
    for i in ids:
        r = res.get(i)
        if r is None:
            for g, v in group.items():
                if i.startswith(g + '.'):
                    r = v
                    break
        if r is None:
            mod = '.'.join(i.split('.')[:2])
            r = ('timeout', '') if mod in timed_out or mod[len('tests.'):] in timed_out else ('missing', '')
        out.append((r[0], i, r[1]))
    return out


def load(path):
    res = collections.OrderedDict()
    for line in open(path):
        if line.startswith('#') or not line.strip():
            continue
        f = line.rstrip('\n').split('\t')
        res[f[1]] = (f[0], f[2] if len(f) > 2 else '')
    return res


def load_expected(path):
    exp = []
    for line in open(path):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        f = line.split(None, 1)
        exp.append((f[0], f[1] if len(f) > 1 else ''))
    return exp


def vendor(i):
    return re.match(r'tests\.test_(mlx5|efa|cuda)', i) is not None


def compare(droce_file, rxe_file, exp_file, subset=''):
    droce, rxe, exp = load(droce_file), load(rxe_file), load_expected(exp_file)

    def expected(i):
        for p, why in exp:
            if i == p or i.startswith(p + '.'):
                return p, why
        return None

    problems = []
    stale = []
    print(f'{"droce":8} {"rxe":8} test')
    for i, (st, reason) in droce.items():
        r = rxe.get(i, ('absent', ''))[0]
        e = expected(i)
        note = ''
        if st in BAD or (r == 'ok' and st != 'ok'):
            if e:
                note = f'  [expected: {e[1]}]'
            else:
                problems.append(f'{i}: {st} on droce' + (', ok on rxe' if r == 'ok' else ''))
                note = '  <== NOT EXPECTED'
        elif st == 'skipped' and reason:
            note = f'  ({reason})'
        if note or not vendor(i):  # the vendor-only tests: counted below
            print(f'{st:8} {r:8} {i}{note}')
    for p, why in ([] if subset else exp):
        hit = [i for i in droce if i == p or i.startswith(p + '.')]
        if not hit:
            problems.append(f'expected-list line "{p}" names no test of the suite')
        elif all(droce[i][0] == 'ok' or (droce[i][0] == 'skipped' and rxe.get(i, ('',))[0] != 'ok')
                 for i in hit):
            stale.append(f'expected-list line "{p}" ({why}): its tests passed on droce this time, '
                         'remove the line if they always do')

    def counts(res, ids):
        c = collections.Counter(res.get(i, ('absent',))[0] for i in ids)
        return c['ok'], sum(c[b] for b in BAD) + c['absent'], c['skipped']

    ids = list(droce)
    nonv = [i for i in ids if not vendor(i)]
    print()
    print(f'rdma-core pyverbs suite: {len(ids)} tests, {len(ids) - len(nonv)} of them for mlx5/EFA/CUDA only')
    print()
    print('| | ok | error/fail | skipped |')
    print('|---|---|---|---|')
    for name, res in (('Linux rxe', rxe), ('droce', droce)):
        print('| %s | %d | %d | %d |' % ((name,) + counts(res, ids)))
    print()
    both_ok = sum(1 for i in ids if droce[i][0] == 'ok' and rxe.get(i, ('',))[0] == 'ok')
    rxe_ok = sum(1 for i in ids if rxe.get(i, ('',))[0] == 'ok')
    only_droce = sum(1 for i in ids if droce[i][0] == 'ok' and rxe.get(i, ('',))[0] != 'ok')
    listed = sum(1 for i in ids if expected(i) and (droce[i][0] in BAD or
                                                    (rxe.get(i, ('',))[0] == 'ok' and droce[i][0] != 'ok')))
    print(f'ok on rxe: {rxe_ok}, of them ok on droce: {both_ok}; ok on droce only: {only_droce}; '
          f'not passing on droce and listed as not supported yet: {listed}')
    skips = collections.Counter(droce[i][1] for i in nonv if droce[i][0] == 'skipped')
    print('droce skips outside the vendor tests, by reason:')
    for why, n in skips.most_common():
        print(f'  {n:3}  {why}')
    for p in stale:
        print('NOTE', p)
    if problems:
        print()
        for p in problems:
            print('FAIL', p)
        return 1
    return 0


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == 'parse':
        for st, i, why in parse(sys.argv[2], sys.argv[3:]):
            print(f'{st}\t{i}\t{why}')
        return 0
    if len(sys.argv) in (5, 6) and sys.argv[1] == 'compare':
        return compare(*sys.argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main())

#!/bin/bash
# The drop-in librdmacm.so.1 against Debian's:
#  1. it exports every symbol of Debian's librdmacm.so.1 with the same version
#     node (RDMACM_1.0 .. 1.3), and nothing Debian's does not;
#  2. every Debian binary that links librdmacm (rdmacm-utils, perftest,
#     qperf, fio) loads against it with all relocations done (ldd -r, then
#     a run with LD_BIND_NOW=1): no undefined symbol, no missing version, and
#     librdmacm.so.1 / libibverbs.so.1 come from the front directory.
# usage: rdmacm_abi_test.sh FRONT_DIR
set -u
front=$1
ours=$front/librdmacm.so.1
debian=${DROCE_DEBIAN_RDMACM:-/usr/lib/x86_64-linux-gnu/librdmacm.so.1}
pass=0
fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }

[ -e "$debian" ] || { echo "no $debian (librdmacm1 not installed)"; exit 77; }
[ -e "$ours" ] || { echo "FAIL no $ours"; exit 1; }

# "VERSION name" of every defined dynamic symbol (version nodes included).
syms() { objdump -T "$1" | awk '$2 == "g" && $0 !~ /\*UND\*/ { print $(NF-1), $NF }' | sort -u; }
want=$(syms "$debian")
have=$(syms "$ours")
missing=$(comm -23 <(echo "$want") <(echo "$have"))
extra=$(comm -13 <(echo "$want") <(echo "$have"))
n=$(echo "$want" | wc -l)
if [ -z "$missing" ]; then ok "all $n versioned symbols of $debian exported"; else
  bad "missing from the drop-in:"; echo "$missing" | sed 's/^/       /'; fi
if [ -z "$extra" ]; then ok "no symbol beyond Debian's"; else
  bad "exported beyond Debian's:"; echo "$extra" | sed 's/^/       /'; fi
soname=$(readelf -d "$ours" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = librdmacm.so.1 ] && ok "SONAME librdmacm.so.1" || bad "SONAME is '$soname'"

# Every installed binary that links librdmacm.
bins=()
for pkg in rdmacm-utils perftest qperf fio; do
  for b in $(dpkg -L "$pkg" 2>/dev/null | grep -E '^/usr/s?bin/'); do
    [ -x "$b" ] && ldd "$b" 2>/dev/null | grep -q 'librdmacm\.so\.1' && bins+=("$b")
  done
done
[ "${#bins[@]}" -ge 10 ] && ok "${#bins[@]} binaries link librdmacm" || bad "only ${#bins[@]} binaries link librdmacm (rdmacm-utils, perftest, qperf, fio installed?)"

# No daemon: nothing these runs do may reach a real droced.
export DROCE_SOCKET=/nonexistent/droce-rdmacm-abi.sock
# Under the sanitizers the front is instrumented, the binaries are not: the
# ASan runtime is preloaded (DROCE_TEST_PRELOAD), as verbs_tools_test.sh does.
if [ -n "${DROCE_TEST_PRELOAD:-}" ]; then
  export LD_PRELOAD=$DROCE_TEST_PRELOAD ASAN_OPTIONS=detect_leaks=0
fi
for b in "${bins[@]}"; do
  out=$(LD_LIBRARY_PATH=$front ldd -r "$b" 2>&1)
  where=$(echo "$out" | sed -n 's/.*librdmacm\.so\.1 => \([^ ]*\) .*/\1/p')
  vwhere=$(echo "$out" | sed -n 's/.*libibverbs\.so\.1 => \([^ ]*\) .*/\1/p')
  errs=$(echo "$out" | grep -E 'undefined symbol|not found' || true)
  if [ -n "$errs" ]; then
    bad "$b: $(echo "$errs" | head -n 3 | tr '\n' ' ')"
  elif [ "$(readlink -f "$where")" != "$(readlink -f "$ours")" ] || [ "$(dirname "$(readlink -f "$vwhere")")" != "$(readlink -f "$front")" ]; then
    bad "$b: librdmacm from '$where', libibverbs from '$vwhere'"
  else
    # Run it (usage output: an unknown option), every symbol bound at start.
    run=$(LD_BIND_NOW=1 LD_LIBRARY_PATH=$front timeout 10 "$b" --droce-no-such-option </dev/null 2>&1)
    if echo "$run" | grep -qE 'symbol lookup error|error while loading shared libraries|version .* not found'; then
      bad "$b at run time: $(echo "$run" | grep -E 'symbol lookup|error while|not found' | head -n 1)"
    else
      ok "$b loads and binds against the drop-in"
    fi
  fi
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

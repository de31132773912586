# Sourced by the namespace tests and benchmarks (bash).
# AFP_RUN: scripts/afpacket-run, to put after `ip netns exec NS [timeout ...]`
# in front of every process that opens a net_af_packet port: two such processes
# in one namespace can otherwise draw the same PACKET_FANOUT group id (DPDK
# 22.11 uses pid ^ ifindex) and the second one fails to start (see that script).
AFP_RUN=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../scripts" && pwd)/afpacket-run
# droce_veth_ns NS: a network namespace NS with its loopback up and a veth pair
# va <-> vb, both up, IPv6 off on them (no router solicitations or DAD frames on
# the ports DPDK owns). Returns 1 when the namespace cannot be created.
droce_veth_ns() {
  ip netns add "$1" 2>/dev/null || return 1
  ip -n "$1" link set lo up
  ip -n "$1" link add va type veth peer name vb
  local d
  for d in va vb; do
    ip netns exec "$1" sysctl -qw "net.ipv6.conf.$d.disable_ipv6=1"
    ip -n "$1" link set "$d" up
  done
}

# droce_perf_run OUTFILE QUEUES ARGS...: one droce-perf test between two
# embedded nodes on the veth pair of droce_veth_ns: the server on vb (CPU 1),
# the client on va (CPU 0), the client's output in OUTFILE. Uses the caller's
# ns, perf (droce-perf), secs, tmp, EAL (array) and port (incremented). With
# MEMIF_SOCK set, the two nodes are joined by net_memif on that socket instead
# (MEMIF_ARGS: more devargs for both ends, such as ,bsize=8192).
droce_perf_run() {
  local out=$1 q=$2; shift 2
  port=$((port + 1))
  local qp="" sdev cdev srun=("$AFP_RUN" vb) crun=("$AFP_RUN" va)
  [ "$q" -gt 1 ] && qp=",qpairs=$q"
  sdev="net_af_packet0,iface=vb$qp"
  cdev="net_af_packet1,iface=va$qp"
  if [ -n "${MEMIF_SOCK:-}" ]; then
    sdev="net_memif0,role=server,socket=$MEMIF_SOCK,id=5,mac=02:00:0a:32:00:02${MEMIF_ARGS:-}"
    cdev="net_memif1,role=client,socket=$MEMIF_SOCK,id=5,mac=02:00:0a:32:00:01${MEMIF_ARGS:-}"
    srun=()
    crun=()
  fi
  : >"$tmp/s.log"  # emptied before the background start: the wait below must not see the last run's log
  ip netns exec "$ns" timeout -k 5 $((secs + 30)) "${srun[@]}" "$perf" "$@" -p "$port" --device "$sdev" \
    --ip 10.50.0.2 --queues "$q" -- --lcores=0@1 "${EAL[@]}" >"$tmp/s.log" 2>&1 &
  local sp=$!
  for _ in $(seq 1 100); do grep -q 'waiting for the client' "$tmp/s.log" 2>/dev/null && break; sleep 0.1; done
  ip netns exec "$ns" timeout -k 5 $((secs + 30)) "${crun[@]}" "$perf" "$@" 127.0.0.1 -p "$port" --device "$cdev" \
    --ip 10.50.0.1 --queues "$q" --report_gbits -- --lcores=0@0 "${EAL[@]}" >"$out" 2>&1 || true
  wait "$sp" || true
}

# droce_memif_ns NAME: the setting of two processes joined by net_memif inside
# a network namespace of their own (its loopback carries their TCP exchange).
# Sets ns (NAME-PID, created, lo up), sock (a memif socket path), tmp (a
# scratch folder), spid (empty: the caller's background server, killed at exit)
# and EAL (the EAL options both processes take), and removes them all at exit.
# Exits 77 (skip) when namespaces cannot be created.
droce_memif_ns() {
  ns=$1-$$
  sock=/tmp/$1-$$.sock
  tmp=$(mktemp -d)
  spid=
  trap droce_memif_cleanup EXIT INT TERM
  if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
  ip -n "$ns" link set lo up
  EAL=(--in-memory --no-pci --log-level=lib.eal:error --log-level=pmd.net.memif:error)
}
droce_memif_cleanup() {
  if [ -n "$spid" ]; then kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; fi
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$tmp" "$sock"
}

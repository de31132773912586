#!/usr/bin/env bash
# droce's demo: two droce nodes talking RoCEv2 over a veth pair.
#   scripts/demo.sh [--capture FILE]
# 1. a network namespace with a veth pair (all traffic stays inside it);
# 2. droced with its dataplane on one end answers ping/ARP from the kernel;
# 3. two droce nodes (droce-perf, each an embedded droce dataplane on
#    net_af_packet at one veth end) run write, read, send and atomic
#    workloads with the data verified, and print the perftest-style results;
#    then the same on the fast path (net_memif) next to testpmd and memcpy
#    (test/bench/bench_dataplane.sh memif, one round);
# 4. with --capture FILE, the RoCEv2 traffic is captured on the veth (dumpcap /
#    tcpdump) and every packet is decoded and its ICRC checked with droce-dump;
# 5. two droced nodes run Debian's unmodified ibv_rc_pingpong and perftest
#    through the verbs shim (test/engine/shim_pair.sh demo);
# 6. cleanup; then the bundled Linux Soft-RoCE captures are decoded.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
capture=
while [ $# -gt 0 ]; do
  case $1 in
    --capture) capture=$(realpath -m "$2"); shift 2 ;;
    -h|--help) sed -n 2,15p "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument $1 (see --help)"; exit 2 ;;
  esac
done
source "$here/setup.sh"
droce_install_packages
droce_hugepages
droce_build build --buildtype=release >/dev/null
cd "$DROCE_ROOT"
B=$DROCE_ROOT/build

ns=droce-demo-$$
tmp=$(mktemp -d /tmp/droce-demo-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

echo "== network namespace $ns: veth pair va <-> vb, plus vk <-> vd for droced"
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" link add va type veth peer name vb
ip -n "$ns" link add vk type veth peer name vd
for d in va vb vd; do
  ip netns exec "$ns" sysctl -qw "net.ipv6.conf.$d.disable_ipv6=1"
  ip -n "$ns" link set "$d" up
done
ip -n "$ns" addr add 10.30.0.1/24 dev vk
ip -n "$ns" link set vk up
EAL=(--in-memory --no-pci --log-level=lib.eal:error --log-level=pmd.net.af_packet:error)

echo "== droced (dataplane on net_af_packet, vd = 10.30.0.2) answers the kernel on vk"
cat >"$tmp/node.toml" <<EOF2
[eal]
args = ["--in-memory", "--no-pci", "--log-level=lib.eal:error"]
lcores = "0,1"
[[port]]
name = "vd"
device = "net_af_packet0,iface=vd"
mac = "02:00:0a:1e:00:02"
ipv4 = ["10.30.0.2/24"]
[[core]]
lcore = 1
queues = [{ port = "vd", rx = 0 }]
[control]
socket = "$tmp/droced.sock"

[shim]
socket = "$tmp/verbs.sock"
EOF2
# afpacket-run: a process id whose af_packet fanout group id no other node here uses (see it).
AFP_RUN=$here/afpacket-run
ip netns exec "$ns" timeout -k 5 120 "$AFP_RUN" vd "$B/app/droced/droced" --config "$tmp/node.toml" >"$tmp/droced.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [ -S "$tmp/droced.sock" ] && break; sleep 0.1; done
ip netns exec "$ns" ping -c 3 -i 0.2 -W 2 10.30.0.2 | sed 's/^/   /'
"$B/app/droce-ctl/droce-ctl" -s "$tmp/droced.sock" arp | sed 's/^/   /'
"$B/app/droce-ctl/droce-ctl" -s "$tmp/droced.sock" counters -g port -n | sed 's/^/   /' | head -20
"$B/app/droce-ctl/droce-ctl" -s "$tmp/droced.sock" shutdown >/dev/null

cap_pid=
if [ -n "$capture" ]; then
  # net_af_packet transmits past the kernel's capture taps (PACKET_QDISC_BYPASS),
  # so each veth end shows only what it receives: capture both ends, merge.
  if command -v dumpcap >/dev/null; then
    ip netns exec "$ns" dumpcap -q -i va -i vb -f "udp port 4791" -w "$tmp/cap.pcapng" >"$tmp/cap.log" 2>&1 &
  else
    echo "--capture needs dumpcap (tshark, package tshark)"; exit 1
  fi
  cap_pid=$!
  pids+=("$cap_pid")
  sleep 1
  echo "== capturing RoCEv2 on va and vb into $capture"
fi

port=18515
perf() {  # perf TEST ARGS...: server on vb, client on va, both in the namespace
  port=$((port + 1))
  : >"$tmp/server.log"  # emptied before the background start: the wait below must not see the last run's log
  ip netns exec "$ns" timeout -k 5 90 "$AFP_RUN" vb "$B/app/droce-perf/droce-perf" "$@" -p "$port" \
    --device net_af_packet0,iface=vb --ip 10.20.0.2 --mac 02:00:0a:14:00:02 --qp-timeout 12 \
    -- --lcores=0@1 "${EAL[@]}" >"$tmp/server.log" 2>&1 &
  local spid=$!
  for _ in $(seq 1 100); do grep -q 'waiting for the client' "$tmp/server.log" 2>/dev/null && break; sleep 0.1; done
  echo
  echo "== droce-perf $*"
  ip netns exec "$ns" timeout -k 5 90 "$AFP_RUN" va "$B/app/droce-perf/droce-perf" "$@" 127.0.0.1 -p "$port" \
    --device net_af_packet1,iface=va --ip 10.20.0.1 --mac 02:00:0a:14:00:01 --qp-timeout 12 --report_gbits \
    -- --lcores=0@0 "${EAL[@]}" 2>&1 | grep -v TELEMETRY | sed 's/^/   /'
  wait "$spid"
}
perf write_bw -s 65536 -n 200
perf write_bw -s 64 -n 20000
perf read_bw -s 4096 -n 2000
perf send_bw -s 1024 -n 5000
perf atomic_bw -n 5000
perf write_lat -s 64 -n 1000
perf read_lat -s 64 -n 1000
perf send_lat -s 64 -n 1000
perf atomic_lat -n 1000
perf write_bw -s 4096 -n 1000 -q 2 --fault-drop 0.01 --fault-reorder 0.01 --fault-dup 0.01
echo
echo "   The figures above are kernel-bound: net_af_packet moves every frame through a sendto/recv on"
echo "   a veth, which caps droce and dpdk-testpmd alike (well under 1 Mpps on this kind of machine)."
echo "   The fast path is net_memif (shared memory between the two processes): droce there, next to"
echo "   dpdk-testpmd's raw rate and memcpy measured in the same run:"
BENCH_SWEEP=0 bash test/bench/bench_dataplane.sh "$B" 3 memif 1 | sed 's/^/   /'

if [ -n "$cap_pid" ]; then
  sleep 1
  kill -INT "$cap_pid" 2>/dev/null || true
  wait "$cap_pid" 2>/dev/null || true
  editcap -F pcap "$tmp/cap.pcapng" "$capture"
  echo
  echo "== $capture: every RoCEv2 packet decoded and its ICRC verified by droce-dump"
  "$B/app/droce-dump/droce-dump" -q "$capture" | sed 's/^/   /'
fi

echo
echo "== two droced nodes (af_packet on a veth pair of their own namespace), Debian's unmodified"
echo "   ibverbs-utils and perftest through the verbs shim (LD_LIBRARY_PATH=build/lib/shim/front)"
bash test/engine/shim_pair.sh "$B/app/droced/droced" "$B/app/droce-ctl/droce-ctl" "$B/lib/shim/front" \
  "$B/test/engine/shim_engine_check" demo | sed 's/^/   /'

echo
echo "== droce-dump test/data/rxe-imm-inv.pcap (SEND/WRITE with immediate, SEND with invalidate, a NAK)"
"$B/app/droce-dump/droce-dump" test/data/rxe-imm-inv.pcap
echo
echo "== every bundled rxe capture"
"$B/app/droce-dump/droce-dump" -q test/data/*.pcap

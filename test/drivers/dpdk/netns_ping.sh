#!/usr/bin/env bash
# droce-netd on a net_af_packet port bound to one end of a veth pair, inside a
# network namespace of its own; the kernel on the other end pings it (IPv4
# and IPv6, jumbo), arpings it, and is resolved by it; then the same with
# --vlan 100, and on a net_tap port. All traffic stays inside the namespace;
# the namespace is removed on every exit path.
#   netns_ping.sh PATH/TO/droce-netd
set -euo pipefail
netd=$1
ns=droce-t-$$
tmp=$(mktemp -d)
pid=
fails=0
passes=0

cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
in_ns() { ip netns exec "$ns" "$@"; }
ip -n "$ns" link add vk type veth peer name vd
# Jumbo frames: MTU 9000 on the veth, af_packet frames of 9216 bytes.
ip -n "$ns" link set vk mtu 9000
ip -n "$ns" link set vd mtu 9000
ip -n "$ns" link set lo up
# The DPDK end (vd) has no kernel addresses: droce-netd is that host.
in_ns sysctl -qw net.ipv6.conf.vd.disable_ipv6=1
ip -n "$ns" link set vd up
ip -n "$ns" addr add 10.99.0.1/24 dev vk
ip -n "$ns" addr add fd00:99::1/64 dev vk nodad
ip -n "$ns" link set vk up
vk_mac=$(ip -n "$ns" -br link show vk | awk '{print $3}')
vd_mac=$(ip -n "$ns" -br link show vd | awk '{print $3}')

# Started directly (not through a shell function) so $pid is timeout's pid
# ("ip netns exec" execs it) and SIGTERM reaches droce-netd through it.
ip netns exec "$ns" timeout -k 5 60 "$netd" --device net_af_packet0,iface=vd,framesz=9216,blocksz=36864 --ip 10.99.0.2 --ip6 fd00:99::2 \
  --resolve 10.99.0.1 --resolve fd00:99::1 --duration 40 -- --log-level=lib.eal:error >"$tmp/netd.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  grep -q '^ready' "$tmp/netd.log" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if ! grep -q '^ready' "$tmp/netd.log"; then cat "$tmp/netd.log"; echo "FAIL: droce-netd did not start"; exit 1; fi

check() {  # check NAME COMMAND...
  if "${@:2}" >"$tmp/out" 2>&1; then echo "ok: $1"; passes=$((passes + 1)); else echo "FAIL: $1"; cat "$tmp/out"; fails=$((fails + 1)); fi
}
# Flush the kernel's neighbour entries first (droce-netd's own ARP/NS may have
# taught it our MAC), so its pings must resolve us through our ARP/NA answers.
ip -n "$ns" neigh flush dev vk
check "ping 10.99.0.2" in_ns ping -c 3 -i 0.2 -W 2 10.99.0.2
check "arping 10.99.0.2" in_ns arping -c 2 -w 5 -I vk 10.99.0.2
cp "$tmp/out" "$tmp/arping.out"
check "arping answer comes from the DPDK port's MAC" grep -qi "$vd_mac" "$tmp/arping.out"
check "kernel ARP entry holds the DPDK port's MAC" bash -c "ip -n $ns neigh show 10.99.0.2 | grep -qi $vd_mac"
ip -n "$ns" -6 neigh flush dev vk
check "ping -6 fd00:99::2" in_ns ping -6 -c 3 -i 0.2 -W 2 fd00:99::2
check "kernel ND entry holds the DPDK port's MAC" bash -c "ip -n $ns -6 neigh show fd00:99::2 | grep -qi $vd_mac"
check "large ping (1400 B)" in_ns ping -c 2 -i 0.2 -W 2 -s 1400 10.99.0.2
check "jumbo ping (8000 B)" in_ns ping -c 2 -i 0.2 -W 2 -s 8000 -M do 10.99.0.2
check "jumbo ping -6 (8000 B)" in_ns ping -6 -c 2 -i 0.2 -W 2 -s 8000 -M do fd00:99::2
check "no answer for an address that is not ours" bash -c "! ip netns exec $ns ping -c 1 -W 1 10.99.0.3"
# droce-netd resolved the kernel side by ARP and by ND.
for _ in $(seq 1 50); do
  [ "$(grep -c '^resolved' "$tmp/netd.log")" -ge 2 ] && break
  sleep 0.1
done
check "droce-netd resolved 10.99.0.1 by ARP" grep -qi "^resolved 10.99.0.1 at $vk_mac" "$tmp/netd.log"
check "droce-netd resolved fd00:99::1 by ND" grep -qi "^resolved fd00:99::1 at $vk_mac" "$tmp/netd.log"

kill -TERM "$pid" 2>/dev/null || true
wait "$pid" && rc=0 || rc=$?
pid=
check "droce-netd exits cleanly on SIGTERM" test "$rc" -eq 0
stat() { awk -v k="$1" '$1 == "stat" && $2 == k {print $3}' "$tmp/netd.log"; }
check "echo replies counted (>= 7)" test "$(stat echo_replies_sent)" -ge 7
check "ICMPv6 echo replies counted (>= 5)" test "$(stat echo6_replies_sent)" -ge 5
check "ARP replies counted (>= 2)" test "$(stat arp_replies_sent)" -ge 2
check "neighbour advertisements counted (>= 1)" test "$(stat na_sent)" -ge 1
check "frame to 10.99.0.3 dropped as not ours" grep -q "^drop arp_not_for_us" "$tmp/netd.log"
grep -E '^(stat|drop|queue|port|neigh)' "$tmp/netd.log" | sed 's/^/  /'

# VLAN 100: droce-netd with --vlan 100 answers tagged frames only. This
# kernel has no 8021q module (no VLAN interfaces), so vlan_probe.py speaks
# tagged frames through a packet socket on vk.
ip netns exec "$ns" timeout -k 5 30 "$netd" --device net_af_packet0,iface=vd --ip 10.99.100.2 --vlan 100 \
  --duration 20 -- --log-level=lib.eal:error >"$tmp/vlan.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  grep -q '^ready' "$tmp/vlan.log" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
check "VLAN 100: tagged ARP and ping answered tagged, untagged ignored" \
  in_ns timeout 20 python3 "$(dirname "$0")/vlan_probe.py" vk 100 10.99.100.1 10.99.100.2
cat "$tmp/out"
kill -TERM "$pid" 2>/dev/null || true
wait "$pid" && rc=0 || rc=$?
pid=
check "VLAN 100: droce-netd exits cleanly" test "$rc" -eq 0
check "VLAN 100: echo reply counted" \
  test "$(awk '$1 == "stat" && $2 == "echo_replies_sent" {print $3}' "$tmp/vlan.log")" -ge 1
check "VLAN 100: untagged frames dropped as vlan_mismatch" grep -q "^drop vlan_mismatch" "$tmp/vlan.log"
# 4 queue pairs on af_packet (qpairs=4: a PACKET_FANOUT group spreading flows
# by hash); pings from 4 source addresses must all be answered, whichever
# queue each flow lands on (answers leave by the queue the request came in on).
for i in 11 12 13 14; do ip -n "$ns" addr add 10.99.0.$i/24 dev vk; done
ip netns exec "$ns" timeout -k 5 30 "$netd" --device net_af_packet0,iface=vd,qpairs=4 --queues 4 --ip 10.99.0.2 \
  --duration 20 -- --log-level=lib.eal:error >"$tmp/mq.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  grep -q '^ready' "$tmp/mq.log" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
for i in 11 12 13 14; do
  check "4 queues: ping from 10.99.0.$i" in_ns ping -c 2 -i 0.2 -W 2 -I 10.99.0.$i 10.99.0.2
done
kill -TERM "$pid" 2>/dev/null || true
wait "$pid" && rc=0 || rc=$?
pid=
check "4 queues: droce-netd exits cleanly" test "$rc" -eq 0
check "4 queues: all 4 queues polled" test "$(grep -c '^queue ' "$tmp/mq.log")" -eq 4
grep '^queue ' "$tmp/mq.log" | sed 's/^/  /'

# net_tap: the PMD creates the kernel interface dtap0 in this namespace; the
# kernel pings droce-netd through it. The port gets its own MAC (the tap PMD
# would otherwise share the kernel interface's, and so its link-local), an MTU
# and promiscuous mode, which the tap PMD applies to the kernel interface.
ip netns exec "$ns" timeout -k 5 30 "$netd" --device net_tap0,iface=dtap0 --mac 02:00:00:00:02:02 --mtu 1400 --promiscuous \
  --ip 10.99.2.2 --duration 20 -- --log-level=lib.eal:error >"$tmp/tap.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  grep -q '^ready' "$tmp/tap.log" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
ip -n "$ns" addr add 10.99.2.1/24 dev dtap0 2>/dev/null || true
ip -n "$ns" link set dtap0 up 2>/dev/null || true
check "net_tap: ping 10.99.2.2" in_ns ping -c 3 -i 0.2 -W 2 10.99.2.2
check "net_tap: the port's MTU reached the kernel interface (1400)" bash -c "ip -n $ns link show dtap0 | grep -q 'mtu 1400'"
check "net_tap: promiscuous mode reached the kernel interface" bash -c "ip -n $ns link show dtap0 | grep -q PROMISC"
check "net_tap: 1372-byte ping (fits MTU 1400)" in_ns ping -c 2 -i 0.2 -W 2 -s 1372 -M do 10.99.2.2
check "net_tap: kernel ARP entry holds the port's MAC" bash -c "ip -n $ns neigh show 10.99.2.2 | grep -qi 02:00:00:00:02:02"
kill -TERM "$pid" 2>/dev/null || true
wait "$pid" && rc=0 || rc=$?
pid=
check "net_tap: droce-netd exits cleanly" test "$rc" -eq 0

# In Catch2's summary form, which scripts/count-tests.py reads.
echo "test cases: $((passes + fails)) | $passes passed | $fails failed"
if [ "$fails" -ne 0 ]; then cat "$tmp"/*.log; exit 1; fi

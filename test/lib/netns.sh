# Sourced by the namespace tests and benchmarks (bash).
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

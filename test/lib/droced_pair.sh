# Sourced by test/engine/hostile_net.sh and scripts/soak.sh (bash): two droced
# nodes, each in a network namespace of its own (two af_packet ports in one
# namespace can collide on their PACKET_FANOUT group id), bridged with a third
# namespace for the kernel side:
#   $DP_A: va (node a, NET.1)        $DP_B: vb (node b, NET.2)
#   $DP_K: bridge br0 (kernel, NET.9) with the veth peers pa (of va) and pb
#          (of vb); verbs programs run here (their TCP exchange on K's
#          loopback, the nodes' shim sockets by path), as do ping and sniffers.
#
# droced_pair_up TAG NET DIR DROCED: namespaces droce-TAG{k,a,b}-$$, configs,
#   logs and sockets in DIR ($DIR/{a,b}-{ctl,verbs}.sock, $DIR/{a,b}.log); sets
#   DP_K DP_A DP_B, DP_PIDS (the two droced, through `timeout`), DP_GIDX (the
#   GID index of the nodes' IPv4 addresses). Returns 77 when namespaces cannot
#   be created, 1 when a node does not start. DROCED_PAIR_TIMEOUT: seconds
#   before the nodes are stopped (default 600).
# droced_pair_down: stops the nodes (TERM, then KILL after 5 s), deletes the
#   namespaces.
# droced_pair_node_pid NAME: the droced process of node a or b.

DP_PIDS=()
DP_K=
DP_A=
DP_B=

# shellcheck source=droced_start.sh
source "$(dirname "${BASH_SOURCE[0]}")/droced_start.sh"

_dp_node() {  # _dp_node NAME NS IFACE IP MAC LCORES DIR DROCED
  DN_TIMEOUT=${DROCED_PAIR_TIMEOUT:-600} DN_DEVARGS=,framecnt=4096 droced_node "$@"
  local rc=$?
  DP_PIDS+=("$DN_PID")
  return $rc
}

droced_pair_up() {  # droced_pair_up TAG NET DIR DROCED
  local tag=$1 net=$2 dir=$3 droced=$4 n p
  DP_K=droce-${tag}k-$$
  DP_A=droce-${tag}a-$$
  DP_B=droce-${tag}b-$$
  for n in "$DP_K" "$DP_A" "$DP_B"; do
    ip netns add "$n" 2>/dev/null || return 77
    ip -n "$n" link set lo up
  done
  ip -n "$DP_K" link add br0 type bridge
  ip netns exec "$DP_K" sysctl -qw net.ipv6.conf.br0.disable_ipv6=1
  ip -n "$DP_K" link add pa type veth peer name va netns "$DP_A"
  ip -n "$DP_K" link add pb type veth peer name vb netns "$DP_B"
  for p in pa pb; do
    ip netns exec "$DP_K" sysctl -qw "net.ipv6.conf.$p.disable_ipv6=1"
    ip -n "$DP_K" link set "$p" master br0
    ip -n "$DP_K" link set "$p" up
  done
  ip -n "$DP_K" addr add "$net.9/24" dev br0
  ip -n "$DP_K" link set br0 up
  ip netns exec "$DP_A" sysctl -qw net.ipv6.conf.va.disable_ipv6=1
  ip netns exec "$DP_B" sysctl -qw net.ipv6.conf.vb.disable_ipv6=1
  ip -n "$DP_A" link set va up
  ip -n "$DP_B" link set vb up
  # Two loops on a 2-CPU machine: A's core on CPU 1, B's on CPU 0.
  _dp_node a "$DP_A" va "$net.1" 02:00:0a:2c:00:01 "0@0,1@1" "$dir" "$droced" || return 1
  _dp_node b "$DP_B" vb "$net.2" 02:00:0a:2c:00:02 "0@1,1@0" "$dir" "$droced" || return 1
  local out
  out=$(DROCE_SOCKET=$dir/a-verbs.sock ip netns exec "$DP_K" timeout 10 ${DROCE_TEST_PRELOAD:+env LD_PRELOAD="$DROCE_TEST_PRELOAD" ASAN_OPTIONS=detect_leaks=0} ibv_devinfo -v 2>&1)
  DP_GIDX=$(echo "$out" | sed -n "s/.*GID\[ *\([0-9]*\)\]:.*::ffff:$net.1.*/\1/p" | head -n 1)
  [ -n "$DP_GIDX" ] || { echo "$out" | tail -n 20; return 1; }
}

droced_pair_node_pid() {  # the droced child of node $1's timeout
  local i=0
  [ "$1" = b ] && i=1
  pgrep -P "${DP_PIDS[$i]}" -x droced | head -n 1
}

# droced_pair_check_empty CTL DIR: both nodes end with no shim client and no
# verbs object (up to 5 s each); reports through the caller's ok/bad.
droced_pair_check_empty() {
  local ctl=$1 dir=$2 node st left
  for node in a b; do
    left=
    for _ in $(seq 50); do
      st=$("$ctl" --socket "$dir/$node-ctl.sock" call shim 2>&1)
      left=$(echo "$st" | awk '($1 == "clients" || $1 ~ /^objects\./) && $2 != 0 { printf "%s=%s ", $1, $2 }')
      echo "$st" | grep -qE '^clients +0' && [ -z "$left" ] && break
      sleep 0.1
    done
    if echo "$st" | grep -qE '^clients +0' && [ -z "$left" ]; then
      ok "node $node: no shim client or verbs object left"
    else
      bad "node $node: left $left"; echo "$st" | head -n 20 | sed 's/^/       /'
    fi
  done
}

droced_pair_down() {
  local n
  droced_node_stop "${DP_PIDS[@]}"
  DP_PIDS=()
  for n in "$DP_K" "$DP_A" "$DP_B"; do [ -n "$n" ] && ip netns del "$n" 2>/dev/null; done
  return 0
}

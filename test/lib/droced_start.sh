# Sourced by the shell tests that start droced nodes (bash): test/lib/droced_pair.sh,
# test/engine/shim_pair.sh, test/shim/pyverbs_suite.sh.
#
# droced_node NAME NS IFACE IP MAC LCORES DIR DROCED
#   Writes DIR/NAME.toml (one net_af_packet port on IFACE with IP/24 and MAC,
#   one dataplane core on lcore 1, the control socket DIR/NAME-ctl.sock and the
#   shim socket DIR/NAME-verbs.sock) and starts DROCED on it in the network
#   namespace NS, its output in DIR/NAME.log. Returns 0 once the shim socket is
#   there and droced logged "running" (bounded: 15 s), 1 otherwise (the log is
#   printed). Sets DN_PID: the process started (`timeout`, which forwards TERM
#   to droced; stop it with TERM, then KILL).
#   Environment:
#     DN_TIMEOUT  seconds before `timeout` stops the node (default 600)
#     DN_DEVARGS  appended to the af_packet devargs (default ",framecnt=4096")
#     DN_AFP_RUN  scripts/afpacket-run: when set, droced runs through it (two
#                 af_packet processes in one namespace, see that script)
#     DN_PORT_TOML  TOML lines added to the [[port]] table (keys, then its
#                 subtables such as [port.fault.tx]; default none)
#     DN_ROCE_TOML  TOML lines added to the [roce] table (default none)
DN_PID=

droced_node() {
  local n=$1 ns=$2 iface=$3 ip=$4 mac=$5 lcores=$6 dir=$7 droced=$8
  cat >"$dir/$n.toml" <<EOF
[eal]
args = ["--in-memory", "--no-pci", "--log-level=lib.eal:error", "--log-level=pmd.net.af_packet:error"]
lcores = "$lcores"
main_lcore = 0

[[port]]
name = "$iface"
device = "net_af_packet0,iface=$iface${DN_DEVARGS-,framecnt=4096}"
mac = "$mac"
ipv4 = ["$ip/24"]
${DN_PORT_TOML:-}

[[core]]
lcore = 1
queues = [{ port = "$iface", rx = 0 }]

[roce]
mr_memory_mb = 16
${DN_ROCE_TOML:-}

[control]
socket = "$dir/$n-ctl.sock"
mode = "0600"

[shim]
socket = "$dir/$n-verbs.sock"
mode = "0600"

[log]
level = "info"
EOF
  local wrap=()
  [ -n "${DN_AFP_RUN:-}" ] && wrap=("$DN_AFP_RUN" "$iface")
  # Not through a function or subshell: $! must be timeout, which forwards TERM to droced.
  ip netns exec "$ns" timeout -k 5 "${DN_TIMEOUT:-600}" "${wrap[@]}" "$droced" --config "$dir/$n.toml" >"$dir/$n.log" 2>&1 &
  DN_PID=$!
  local _
  for _ in $(seq 150); do
    [ -S "$dir/$n-verbs.sock" ] && grep -q "running" "$dir/$n.log" && return 0
    kill -0 "$DN_PID" 2>/dev/null || break
    sleep 0.1
  done
  cat "$dir/$n.log"
  return 1
}

# droced_node_stop PID...: TERM, then KILL after 5 s; reaps them.
droced_node_stop() {
  local p _
  for p in "$@"; do kill -TERM "$p" 2>/dev/null; done
  for p in "$@"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  return 0
}

#!/usr/bin/env bash
# droced with its dataplane on net_af_packet at one end of a veth pair in a
# namespace of its own; the kernel at the other end pings and arpings it.
# Checks: ping/arping answered, counters and the ARP cache over droce-ctl,
# `fault set` (rx drop 1.0) reaches the cores' injectors at run time, SIGTERM
# stops it cleanly, and a second start right after works. With FRONT_DIR (the
# drop-in librdmacm): rping's listener shows in `droce-ctl cm` and goes with it.
#   droced_node.sh DROCED DROCE_CTL [FRONT_DIR]
set -uo pipefail
DROCED=$1
CTL=$2
ns=droce-d-$$
T=$(mktemp -d /tmp/droced-node-XXXXXX)
pid=
fails=0
passes=0
cleanup() {
  if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT INT TERM
if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
in_ns() { ip netns exec "$ns" "$@"; }
ip -n "$ns" link set lo up
ip -n "$ns" link add vk type veth peer name vd
in_ns sysctl -qw net.ipv6.conf.vd.disable_ipv6=1
ip -n "$ns" link set vd up
ip -n "$ns" addr add 10.30.0.1/24 dev vk
ip -n "$ns" link set vk up
SOCK=$T/ctl.sock
cat >"$T/node.toml" <<EOF2
[eal]
args = ["--in-memory", "--no-pci", "--log-level=lib.eal:error"]
lcores = "0,1"
main_lcore = 0

[[port]]
name = "vd"
device = "net_af_packet0,iface=vd"
mac = "02:00:0a:1e:00:02"
ipv4 = ["10.30.0.2/24"]
dscp = 26
dcqcn = true
[port.dcqcn_params]
ai_rate_mbps = 7

[[core]]
lcore = 1
queues = [{ port = "vd", rx = 0 }]

[roce]
mr_memory_mb = 16

[control]
socket = "$SOCK"
mode = "0600"

[shim]
socket = "$T/verbs.sock"

[log]
level = "info"
EOF2
check() {  # check NAME COMMAND...
  if "${@:2}" >"$T/out" 2>&1; then echo "ok: $1"; passes=$((passes + 1)); else echo "FAIL: $1"; sed 's/^/    /' "$T/out"; fails=$((fails + 1)); fi
}
start() {
  ip netns exec "$ns" timeout -k 5 60 "$DROCED" --config "$T/node.toml" >"$T/droced.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    [ -S "$SOCK" ] && grep -q "running" "$T/droced.log" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$T/droced.log"
  return 1
}
check "droced starts with its dataplane" start
ip -n "$ns" neigh flush dev vk
check "ping 10.30.0.2 answered by droced" in_ns ping -c 3 -i 0.2 -W 2 10.30.0.2
check "arping answered with the port's MAC" bash -c "ip netns exec $ns arping -c 2 -w 5 -I vk 10.30.0.2 | grep -qi 02:00:0a:1e:00:02"
check "droce-ctl arp lists the kernel side" bash -c "'$CTL' -s '$SOCK' arp | grep -q 10.30.0.1"
check "counters: ICMP received and answered" bash -c \
  "'$CTL' -s '$SOCK' --json counters -g port | python3 -c 'import json,sys; d=json.load(sys.stdin); g=d[\"groups\"][0]; v=dict(zip(g[\"names\"], g[\"instances\"][0][\"values\"])); sys.exit(0 if v[\"rx_icmp\"] >= 3 and v[\"tx_icmp\"] >= 3 else 1)'"
check "counters: core loop polling" bash -c "'$CTL' -s '$SOCK' counters -g core | grep -q polls"
check "droce-ctl qps / mrs answer" bash -c "'$CTL' -s '$SOCK' --json qps && '$CTL' -s '$SOCK' --json mrs"
# Congestion control: the config's [port] dcqcn / [port.dcqcn_params], changed at run time.
dcqcn_is() {  # dcqcn_is PYTHON_CONDITION on d (the port's settings)
  "$CTL" -s "$SOCK" --json dcqcn get -p vd | python3 -c "import json,sys; d=json.load(sys.stdin)['vd']; sys.exit(0 if ($1) else 1)"
}
check "dcqcn get shows the config (dcqcn on, ai 7, NVIDIA defaults)" dcqcn_is "d['dcqcn'] and d['ecn'] and d['cnp'] and d['ai_rate_mbps'] == 7 and d['hai_rate_mbps'] == 50 and d['min_time_between_cnps_us'] == 4 and d['cnp_dscp'] == 48 and d['cnp_prio'] == 6 and d['cnp_sent'] == 0"
check "dcqcn set changes a port at run time" "$CTL" -s "$SOCK" dcqcn set -p vd --dcqcn off --ai_rate_mbps 9 --cnp_dscp 40 --clamp_tgt_rate 1
check "dcqcn get shows the new settings" dcqcn_is "not d['dcqcn'] and d['ai_rate_mbps'] == 9 and d['cnp_dscp'] == 40 and d['alpha_g'] == 1019 and d['clamp_tgt_rate'] == 1"
check "dcqcn set refuses a value out of range" bash -c "! '$CTL' -s '$SOCK' dcqcn set -p vd --alpha_g 2000 && '$CTL' -s '$SOCK' dcqcn set -p vd --alpha_g 2000 2>&1 | grep -q 'alpha_g: 2000 is out of range 0..1024'"
check "dcqcn set refuses inconsistent rates" bash -c "'$CTL' -s '$SOCK' dcqcn set -p vd --min_rate_mbps 200000 2>&1 | grep -q 'min_rate_mbps (200000) is above line_rate_mbps (100000)'"
check "dcqcn set refuses an unknown key and port" bash -c "'$CTL' -s '$SOCK' call 'dcqcn set' '{\"port\": \"vd\", \"foo\": 1}' 2>&1 | grep -q 'foo: unknown key' && '$CTL' -s '$SOCK' dcqcn set -p nope --ecn off 2>&1 | grep -q \"no port 'nope'\""
check "dcqcn settings unchanged by refused requests" dcqcn_is "d['ai_rate_mbps'] == 9 and d['alpha_g'] == 1019 and d['min_rate_mbps'] == 1"
if [ -n "${3:-}" ]; then
  # Debian's rping as a server through the drop-in librdmacm: droce-ctl cm
  # lists its listener (the agent's on droce0 and the shim's id); it goes
  # with the program.
  # (An ASan build's front needs the ASan runtime first: DROCE_TEST_PRELOAD.)
  DROCE_SOCKET=$T/verbs.sock LD_LIBRARY_PATH=$3 timeout 30 \
    ${DROCE_TEST_PRELOAD:+env LD_PRELOAD="$DROCE_TEST_PRELOAD" ASAN_OPTIONS=detect_leaks=0} \
    rping -s -a 10.30.0.2 -p 7174 >"$T/rping.log" 2>&1 &
  rp=$!
  cm_has() {  # cm_has PYTHON_CONDITION: polls droce-ctl cm until it holds (15 s at most)
    for _ in $(seq 1 150); do
      "$CTL" -s "$SOCK" --json cm | python3 -c "import json,sys; d=json.load(sys.stdin); c=d['devices']['droce0']['connections']; sys.exit(0 if ($1) else 1)" && return 0
      sleep 0.1
    done
    "$CTL" -s "$SOCK" cm; cat "$T/rping.log"; return 1
  }
  check "droce-ctl cm lists rping's listener" cm_has "d['ids'] == 1 and d['listeners'] == 1 and d['bindings'] == 1 and any(x['state'] == 'listen' and x['service_id'] == '0x1061c06' and x['local'] == '10.30.0.2:7174' for x in c) and 'rx_req' in d['devices']['droce0']['counters']"
  kill -TERM "$rp"; wait "$rp" 2>/dev/null
  check "the listener goes with its program" cm_has "d['ids'] == 0 and d['listeners'] == 0 and d['bindings'] == 0 and c == []"
fi
check "fault set rx drop 1.0" "$CTL" -s "$SOCK" fault set -p vd -d rx --drop 1
check "pings are dropped by the injector" bash -c "! ip netns exec $ns ping -c 2 -i 0.2 -W 1 10.30.0.2"
check "fault drops counted" bash -c "'$CTL' -s '$SOCK' counters -g port -n | grep -q fault_rx_drop"
check "fault set rx drop 0" "$CTL" -s "$SOCK" fault set -p vd -d rx --drop 0
check "ping works again" in_ns ping -c 2 -i 0.2 -W 2 10.30.0.2
kill -TERM "$pid"
wait "$pid"; rc=$?
pid=
check "SIGTERM: clean exit" test "$rc" -eq 0
check "SIGTERM: socket removed" test ! -e "$SOCK"
check "second start right after" start
check "ping after restart" in_ns ping -c 2 -i 0.2 -W 2 10.30.0.2
check "shutdown over the socket" "$CTL" -s "$SOCK" shutdown
wait "$pid"; rc=$?
pid=
check "shutdown: clean exit" test "$rc" -eq 0
if [ "$fails" -ne 0 ]; then sed 's/^/  droced| /' "$T/droced.log"; fi
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]

#!/usr/bin/env bash
# droced end to end, without DPDK: start with a good config, query it with
# droce-ctl (table and JSON), change fault settings, stop with SIGTERM / SIGINT /
# `droce-ctl shutdown` (exit 0, socket removed), start again right after, recover
# from a killed daemon's stale socket, refuse a second daemon on the same
# socket, and reject bad configs with a message naming the key.
#   droced_test.sh DROCED DROCE_CTL CONFIG_DIR
set -uo pipefail
DROCED=$1
CTL=$2
CONFIG_DIR=$3
T=$(mktemp -d /tmp/droced-test-XXXXXX)
SOCK=$T/ctl.sock
PASS=0
FAIL=0
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT

ok() { PASS=$((PASS + 1)); echo "ok   - $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $1"; [ -n "${2:-}" ] && sed 's/^/       /' <<<"$2"; }
check() {  # check NAME COMMAND...
  local name=$1; shift
  local out
  if out=$("$@" 2>&1); then ok "$name"; else bad "$name" "$out"; fi
}

write_config() {  # write_config FILE [extra port lines]
  cat >"$1" <<EOF
[eal]
args = ["--in-memory", "--no-pci"]

[[port]]
name = "p0"
device = "net_af_packet0,iface=veth-a"
ipv4 = ["10.10.0.1/24"]
rx_queues = 2
tx_queues = 2
${2:-}
[port.fault]
seed = 7
[port.fault.rx]
drop = 0.01

[control]
socket = "$SOCK"
mode = "0600"

[shim]
socket = "${SOCK%.sock}-verbs.sock"

[log]
level = "info"
EOF
}

# start_daemon CONFIG LOG: starts droced, waits (bounded) for its socket; sets
# DPID (droced's own pid: no wrapper, so signals reach it; the EXIT trap kills
# whatever is left).
start_daemon() {
  "$DROCED" --no-dataplane --config "$1" >"$2" 2>&1 &
  DPID=$!
  PIDS+=("$DPID")
  for _ in $(seq 1 100); do
    [ -S "$SOCK" ] && "$CTL" -s "$SOCK" --timeout 500 help >/dev/null 2>&1 && return 0
    kill -0 "$DPID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# wait_exit PID: waits (bounded, 5 s) for the daemon to exit; sets rc to its
# exit code (or "hung" after killing it).
wait_exit() {
  for _ in $(seq 1 100); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$1" 2>/dev/null; then
    kill -KILL "$1"
    wait "$1" 2>/dev/null
    rc=hung
  else
    wait "$1"
    rc=$?
  fi
}

CFG=$T/good.toml
write_config "$CFG"

# --help, --check
out=$("$DROCED" --help 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q -- "--config" <<<"$out" && grep -q -- "--log-level" <<<"$out" && ok "--help exits 0 and lists the options" || bad "--help" "$out"
out=$("$DROCED" --config "$CFG" --check 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "ok: 1 port(s), 2 core(s)" <<<"$out" && ok "--check accepts a good config" || bad "--check" "$out"

for f in "$CONFIG_DIR"/*.toml; do
  # nvmf*.toml are droce-nvmf's files (an [nvmf] section, no [[port]]): test/nvmf checks them.
  case $(basename "$f") in nvmf*.toml) continue ;; esac
  out=$("$DROCED" --config "$f" --check 2>&1); rc=$?
  [ $rc -eq 0 ] && ok "shipped $(basename "$f") passes --check" || bad "--check $(basename "$f")" "$out"
done

# 1. start, query, SIGTERM
if start_daemon "$CFG" "$T/run1.log"; then ok "droced starts and serves its socket"; else bad "droced start" "$(cat "$T/run1.log")"; fi
out=$("$CTL" -s "$SOCK" status 2>&1)
grep -Eq "^pid +$DPID$" <<<"$out" && grep -q "components *stats,control" <<<"$out" && grep -q "p0:rx1/tx1" <<<"$out" \
  && ok "droce-ctl status (table) shows pid, components, cores" || bad "droce-ctl status" "$out"
out=$("$CTL" -s "$SOCK" --json status 2>&1)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["pid"]==int(sys.argv[2]) and d["ports"][0]["name"]=="p0" and d["ports"][0]["rxq"]==2, d' "$out" "$DPID" \
  && ok "droce-ctl --json status is JSON with the config's ports" || bad "droce-ctl --json status" "$out"
out=$("$CTL" -s "$SOCK" counters 2>&1)
grep -Eq "^port +p0 +rx_packets +0$" <<<"$out" && grep -Eq "^core +1 +ring_occupancy +0$" <<<"$out" \
  && grep -Eq "^control +socket +requests +[0-9]+$" <<<"$out" && ok "droce-ctl counters lists port, core and control groups" || bad "droce-ctl counters" "$out"
out=$("$CTL" -s "$SOCK" --json counters --group control 2>&1)
python3 -c '
import json,sys
d=json.loads(sys.argv[1])["groups"]
assert len(d)==1 and d[0]["group"]=="control", d
v=dict(zip(d[0]["names"], d[0]["instances"][0]["values"]))
assert v["requests"]>=5 and v["connections"]>=5, v' "$out" && ok "counters --json --group control counts our requests" || bad "counters --json" "$out"
out=$("$CTL" -s "$SOCK" counters --get control.socket.connections 2>&1)
[[ "$out" =~ ^[0-9]+$ ]] && [ "$out" -ge 5 ] && ok "counters --get prints one value ($out)" || bad "counters --get" "$out"
out=$("$CTL" -s "$SOCK" counters --get port.p0.no_such 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "no counter port.p0.no_such" <<<"$out" && ok "counters --get of an unknown counter: exit 1" || bad "counters --get unknown" "$out"
out=$("$CTL" -s "$SOCK" counters --per-core --group port 2>&1)
grep -Eq "^port +p0 +all +rx_packets +0$" <<<"$out" && grep -Eq "^port +p0 +1 +rx_packets +0$" <<<"$out" \
  && ok "counters --per-core adds each core's row" || bad "counters --per-core" "$out"
out=$("$CTL" -s "$SOCK" counters --group nosuch 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "no group 'nosuch' (groups: port, core, control)" <<<"$out" && ok "unknown counter group: exit 1, groups listed" || bad "counters --group nosuch" "$out"
out=$("$CTL" -s "$SOCK" --json fault get -p p0 2>&1)
python3 -c 'import json,sys; p=json.loads(sys.argv[1])["ports"][0]; assert p["seed"]==7 and p["rx"]["drop"]==0.01 and p["tx"]["drop"]==0, p' "$out" \
  && ok "fault get shows the config's [port.fault]" || bad "fault get" "$out"
"$CTL" -s "$SOCK" fault set -p p0 -d tx --drop 0.05 --duplicate 0.02 --seed 99 >/dev/null 2>&1
out=$("$CTL" -s "$SOCK" --json fault get 2>&1)
python3 -c 'import json,sys; p=json.loads(sys.argv[1])["ports"][0]; assert p["seed"]==99 and p["tx"]["drop"]==0.05 and p["tx"]["duplicate"]==0.02 and p["rx"]["drop"]==0.01, p' "$out" \
  && ok "fault set changes the run-time settings" || bad "fault set" "$out"
out=$("$CTL" -s "$SOCK" fault set -p p0 -d rx --drop 2 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "fault set: drop: 2.0 is out of range 0..1" <<<"$out" && ok "fault set refuses a bad probability" || bad "fault set --drop 2" "$out"
out=$("$CTL" -s "$SOCK" fault set -p nope -d rx --drop 0 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "no port 'nope'" <<<"$out" && ok "fault set refuses an unknown port" || bad "fault set -p nope" "$out"
out=$("$CTL" -s "$SOCK" qps 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "unknown command 'qps'" <<<"$out" && ok "a command the daemon lacks: exit 1 with the daemon's message" || bad "qps" "$out"
out=$("$CTL" -s "$SOCK" call counters '{"group": 5}' 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "group must be a string" <<<"$out" && ok "droce-ctl call passes raw JSON args" || bad "call" "$out"
out=$(printf 'garbage\n{"cmd":"status"}\n' | timeout 5 python3 -c '
import socket,sys
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(sys.stdin.buffer.read()); s.shutdown(socket.SHUT_WR)
print(s.makefile().read())' "$SOCK" 2>&1)
grep -q '"ok":false,"error":"malformed JSON' <<<"$out" && grep -q '"ok":true' <<<"$out" && ok "raw socket: garbage answered with an error, next request served" || bad "raw socket" "$out"

# A second daemon on the same socket is refused; the first keeps running.
out=$(timeout -k 2 10 "$DROCED" --no-dataplane --config "$CFG" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "is in use by a running server" <<<"$out" && "$CTL" -s "$SOCK" status >/dev/null 2>&1 \
  && ok "a second droced on the same socket exits 1; the first is unaffected" || bad "second daemon" "$out (rc $rc)"

kill -TERM "$DPID"
wait_exit "$DPID"
[ "$rc" = 0 ] && ok "SIGTERM: exit 0" || bad "SIGTERM exit code $rc" "$(cat "$T/run1.log")"
[ ! -e "$SOCK" ] && ok "SIGTERM: socket removed" || bad "socket left behind after SIGTERM"
grep -q "received SIGTERM" "$T/run1.log" && grep -q "droced: stopped" "$T/run1.log" && ok "SIGTERM: logged the reason and the stop" || bad "SIGTERM log" "$(cat "$T/run1.log")"

# 2. starts again right after; stop with `droce-ctl shutdown`
if start_daemon "$CFG" "$T/run2.log"; then ok "starts again right after SIGTERM"; else bad "restart" "$(cat "$T/run2.log")"; fi
out=$("$CTL" -s "$SOCK" shutdown 2>&1)
grep -Eq "stopping +true" <<<"$out" && ok "droce-ctl shutdown answers" || bad "shutdown answer" "$out"
wait_exit "$DPID"
[ "$rc" = 0 ] && [ ! -e "$SOCK" ] && ok "droce-ctl shutdown: exit 0, socket removed" || bad "shutdown exit $rc" "$(cat "$T/run2.log")"

# 3. SIGINT
start_daemon "$CFG" "$T/run3.log" || bad "start 3" "$(cat "$T/run3.log")"
kill -INT "$DPID"
wait_exit "$DPID"
[ "$rc" = 0 ] && [ ! -e "$SOCK" ] && ok "SIGINT: exit 0, socket removed" || bad "SIGINT exit $rc" "$(cat "$T/run3.log")"

# 3b. SIGHUP reopens the log file (logrotate) and keeps running.
sed "s#level = \"info\"#level = \"info\"\nfile = \"$T/droced.log\"#" "$CFG" >"$T/logfile.toml"
start_daemon "$T/logfile.toml" "$T/run3b.log" || bad "start 3b" "$(cat "$T/run3b.log")"
mv "$T/droced.log" "$T/droced.log.1"
kill -HUP "$DPID"
for _ in $(seq 1 100); do [ -s "$T/droced.log" ] && break; sleep 0.05; done
"$CTL" -s "$SOCK" status >/dev/null 2>&1 && grep -q "SIGHUP: log file reopened" "$T/droced.log" \
  && grep -q "running (pid $DPID)" "$T/droced.log.1" && ok "SIGHUP: log file reopened, daemon still serving" \
  || bad "SIGHUP" "$(cat "$T/run3b.log" "$T/droced.log" 2>&1)"
kill -TERM "$DPID"
wait_exit "$DPID"
[ "$rc" = 0 ] && grep -q "droced: stopped" "$T/droced.log" && ok "and stops cleanly, logging to the new file" || bad "stop 3b: $rc"

# 4. A killed daemon leaves a stale socket; the next start removes it.
start_daemon "$CFG" "$T/run4.log" || bad "start 4" "$(cat "$T/run4.log")"
kill -KILL "$DPID"
wait "$DPID" 2>/dev/null
[ -S "$SOCK" ] || bad "expected a stale socket after SIGKILL"
if start_daemon "$CFG" "$T/run5.log"; then ok "starts over a stale socket left by SIGKILL"; else bad "start over stale socket" "$(cat "$T/run5.log")"; fi
kill -TERM "$DPID"
wait_exit "$DPID"
[ "$rc" = 0 ] && ok "and stops cleanly" || bad "stop 5: $rc" "$(cat "$T/run5.log")"

# 5. Bad configs: exit 2, message names the key; nothing left behind.
bad_config() {  # bad_config NAME EXPECTED (config on stdin)
  cat >"$T/bad.toml"
  local out rc
  out=$(timeout -k 2 10 "$DROCED" --config "$T/bad.toml" 2>&1); rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$2" <<<"$out" && [ ! -e "$SOCK" ]; then ok "bad config ($1): exit 2, \"$2\""; else bad "bad config ($1): rc $rc" "$out"; fi
}
write_config "$T/x.toml" "mtu = 70000"
bad_config "mtu out of range" "droced: config: port[0].mtu: 70000 is out of range 256..9000" <"$T/x.toml"
write_config "$T/x.toml" "colour = \"blue\""
bad_config "unknown key" "config: port[0].colour: unknown key" <"$T/x.toml"
write_config "$T/x.toml" "dscp = \"high\""
bad_config "wrong type" "config: port[0].dscp: expected an integer, got a string" <"$T/x.toml"
sed 's/drop = 0.01/drop = 1.5/' "$CFG" | bad_config "fault probability" "config: port[0].fault.rx.drop: 1.5 is out of range 0..1"
sed 's/level = "info"/level = "chatty"/' "$CFG" | bad_config "log level" "config: log.level: \"chatty\" is not a log level"
printf '[[port]]\nname = "p0"\n' | bad_config "missing device" "config: port[0].device: is required"
printf '[[port]\n' | bad_config "TOML syntax" "config: $T/bad.toml:1:"
out=$("$DROCED" --config "$T/none.toml" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "none.toml" <<<"$out" && ok "missing config file: exit 2" || bad "missing config file: rc $rc" "$out"
out=$("$DROCED" --config "$CFG" --log-level loud 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "log-level" <<<"$out" && ok "bad --log-level: exit 2" || bad "bad --log-level: rc $rc" "$out"
out=$("$CTL" -s "$SOCK" status 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "cannot connect to $SOCK: No such file or directory (is droced running?)" <<<"$out" && ok "droce-ctl without a daemon: exit 1, clear message" || bad "ctl without daemon: rc $rc" "$out"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]

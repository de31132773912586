#!/usr/bin/env bash
# Interoperability of droce with Linux Soft-RoCE (rdma_rxe) in QEMU guests,
# through the project's harness in test/interop/rxe-peer (README there).
#
# droce side: droced (config/interop-rxe.toml, -4096 for path MTU 4096) on
# net_af_packet bound to the harness's veth dpdk0 in its namespace; Debian's
# unmodified ibverbs-utils and perftest binaries run on the host through the
# verbs shim (LD_LIBRARY_PATH=build/lib/shim/front, DROCE_SOCKET=droced's
# verbs socket). rxe side: the same binaries in the guest on rxe0. Both use
# GID index 1 (::ffff:IPv4; index 0 is the fe80:: one on both). Both
# directions: d2r = droce client -> rxe server, r2d = rxe client -> droce server.
# Loss: droce side with droced's fault injector (droce-ctl fault set, rx and
# tx), rxe side with netem in the guest.
# A few runs use app/droce-interop (droce's embedding API speaking the
# pingpong exchange) for what the unmodified tools cannot show: RNR NAKs
# (droce reposts its receive late).
# Every run is captured (tshark, in the namespace); every RoCEv2 packet droce
# sent is checked with droce-dump (ICRC, decode), tshark (no malformed or
# error-level expert mark) and its IP TTL / hop limit (64, as rxe sends).
# The captures end up merged in two artifacts, one per direction:
# $OUT/interop-droce-to-rxe.pcap (d2r runs) and $OUT/interop-rxe-to-droce.pcap.
# Prints a table at the end.
#
#   scripts/interop.sh [--ci | --full | --cm | --nvmf-perf] [--keep-guests]
#     --ci    (default) the CI subset, MTU 1024: every tool once per direction, sizes up
#             to 64 KiB, few iterations, one 1% loss run per side, RNR, IPv6; well under
#             15 minutes under TCG
#     --full  the whole matrix: sizes 2 B..8 MiB (-a) where the tool has it, else
#             2 B/4 KiB/64 KiB/1 MiB, UC/UD perftest, loss on both sides, MTU 1024 and 4096
#     --cm    only the RDMA CM runs (issue 10): rdmacm-utils (rping -v -V, ucmatose, udaddy, mckey,
#             rdma_server/rdma_client, cmtime), perftest -R, qperf -cm1 through the drop-in
#             librdmacm.so.1, both directions, 1% loss per side (rping), a REQ nobody listens
#             to (REJ), a killed host program. --ci runs rping, udaddy, mckey, ib_send_bw -R and the
#             REJ both ways (cm_ci, CM_IN_CI); --full all of them once CM_IN_FULL is 1.
#     --nvmf  only the NVMe-oF runs (issue 11): app/droce-nvmf (config/nvmf.toml) as the target,
#             the guest's kernel nvme-rdma host: discover, connect, fio randwrite + read with
#             crc32c verify, ext4 copy + sha256, disconnect, reconnect and read back, a clean
#             kernel log (nvmf io), the same with 1% loss on droce's side (host nvme-rdma with
#             register_always=N: rxe 6.1 bug, lib/nvmf/README.md), and 4 KiB randread
#             IOPS at QD 1 and 32 (nvmf randread), each case failing on an NVMe error in the guest's
#             kernel log; sigterm: droce-nvmf gets SIGTERM with the host connected (nvmf_sigterm).
#             --ci runs the lossless io case (NVMF_IN_CI).
#             The reverse (nvmf_host): droce's initiator app/droce-nvmf-perf (embedded droce on
#             dpdk0) against the guest kernel's nvmet-rdma (a RAM namespace, set up by
#             test/interop/rxe-peer/lib/nvmet-setup.sh): --verify (data written with a per-block
#             tag, read back, compared), --discover, 4 KiB randread/randwrite at QD 1 and 32.
#             --ci runs --verify and two 3 s runs.
#     --nvmf-perf the NVMe-oF comparison of issue 11 (opt-in, ~5 min under TCG): guest 1 is a Linux
#             host (nvme-rdma), guest 2 a Linux target (nvmet-rdma, a RAM namespace, set up with
#             test/interop/rxe-peer/lib/nvmet-setup.sh); the same fio run (4 KiB random read,
#             libaio, direct, 10 s, queue depth 1 and 32) against the kernel target and against
#             droce-nvmf; a table of IOPS, p50/p99 latency and droce/kernel. A droce row below
#             the kernel's IOPS fails; so does an NVMe error in a guest's kernel log.
# Exit status: 0 all passed, 1 a run failed or the suite could not run (harness not set
# up, QEMU missing, the guest does not boot: scripts/test.sh installs and sets up all of
# it first, so on a Debian 12 machine that is a failure), 77 skipped only when this is
# not root (namespaces, QEMU): scripts/test.sh counts 77 as skipped, never as passed.
# Set up by hand with: scripts/setup.sh --interop (or test/interop/rxe-peer/rxepeer setup).
# Environment: RXEPEER (path of the rxepeer CLI, default the in-tree harness), RXEPEER_NS (namespace, default rxepeer),
#   INTEROP_OUT (captures, default build/interop), INTEROP_ONLY (a glob: run only the
#   matching tests, e.g. 'write_*'), INTEROP_MTU (only runs at this MTU), INTEROP_SKIP (a glob
#   on TEST:MTU:LOSS:SIZE, extglob allowed: skip those runs, e.g. '@(*_lat:*:0:all|srq_pingpong:*)').
#   INTEROP_RDMACMLIB (directory of the drop-in librdmacm.so.1, default build/lib/shim/front).
#   INTEROP_GUEST (the guests' name prefix, default iop: guests iop1 and, for --nvmf-perf, iop2;
#   guest names are global to the harness's work dir, so concurrent suites in their own
#   RXEPEER_NS need their own prefix too). INTEROP_NVMF_CONFIG (droce-nvmf's config,
#   default config/nvmf.toml). --nvmf: INTEROP_NVMF_CASES ("TEST LOSS [HOSTOPTS];...", e.g.
#   "io droce-rx:0.01;io droce:0.01 register_always=N": these cases instead of the mode's list),
#   INTEROP_NVMF_TMO (seconds each guest step may take, default 300, 600 with loss).
#   INTEROP_NVMF_ARGS (more droce-nvmf options for --nvmf, e.g. "--tail-timeout-us 50000").
set -uo pipefail
{ # the whole script is read before it runs: editing it meanwhile cannot change a running suite
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
SKIP=77

mode=ci
keep=0
for a in "$@"; do
  case $a in
    --nvmf-perf) mode=nvmf_perf ;;
    --ci) mode=ci ;;
    --full) mode=full ;;
    --cm) mode=cm ;;
    --nvmf) mode=nvmf ;;
    --keep-guests) keep=1 ;;
    -h|--help) sed -n '2,66p' "$0"; exit 0 ;;
    *) echo "interop.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

skip() {
  echo "################################################################" >&2
  echo "## interop: SKIPPED: $*" >&2
  echo "## (no rxe peer available: this is NOT a pass)" >&2
  echo "################################################################" >&2
  exit $SKIP
}
# cannot_run REASON: the suite should run here and cannot: a failure, not a skip.
cannot_run() {
  echo "################################################################" >&2
  echo "## interop: FAILED: cannot run: $*" >&2
  echo "## (scripts/setup.sh --interop installs and sets up what it needs)" >&2
  echo "################################################################" >&2
  exit 1
}

RXEPEER=${RXEPEER:-$root/test/interop/rxe-peer/rxepeer}
NS=${RXEPEER_NS:-rxepeer}
export RXEPEER_NS=$NS
IFACE=dpdk0  # config/interop-rxe*.toml bind it
OUT=${INTEROP_OUT:-$root/build/interop}
TOOL=$root/build/app/droce-interop/droce-interop
DUMPTOOL=$root/build/app/droce-dump/droce-dump
DROCED=$root/build/app/droced/droced
CTL=$root/build/app/droce-ctl/droce-ctl
AFP_RUN=$here/afpacket-run  # a process id whose af_packet fanout group id is free in the namespace
SHIMLIB=$root/build/lib/shim/front
RDMACMLIB=${INTEROP_RDMACMLIB:-$SHIMLIB}  # the drop-in librdmacm.so.1 (built beside libibverbs.so.1)
# The RDMA CM runs that --ci runs (cm_ci: those seen passing against main), and whether --full
# runs all of them (--cm runs all of them whatever these say).
CM_IN_CI=1
CM_IN_FULL=0
NVMF_IN_CI=1  # the lossless NVMe-oF io case joins --ci
NVMF_TOOL=$root/build/app/droce-nvmf/droce-nvmf
NVMF_CFG=${INTEROP_NVMF_CONFIG:-$root/config/nvmf.toml}  # --nvmf-perf connects to its first subsystem
NVMF_NQN=nqn.2026-12.org.droce:ram0  # config/nvmf.toml's subsystem
# The guest sees the host's root file system, but /tmp is its own tmpfs: a tree under /tmp
# (a CI clone) stages the scripts the guest runs where the guest sees them (the harness's work dir).
GUEST_TREE=$root
case $root in
  /tmp|/tmp/*)
    GUEST_TREE=${RXEPEER_WORK:-/var/tmp/rxe-peer}/droce-guest-scripts
    mkdir -p "$GUEST_TREE/scripts" "$GUEST_TREE/test/interop/rxe-peer/lib"
    cp "$root/scripts/interop-nvmf-guest.sh" "$GUEST_TREE/scripts/"
    cp "$root/test/interop/rxe-peer/lib/nvmet-setup.sh" "$GUEST_TREE/test/interop/rxe-peer/lib/"
    ;;
esac
NVMF_GUEST=$GUEST_TREE/scripts/interop-nvmf-guest.sh
NVMF_PERF_TOOL=$root/build/app/droce-nvmf-perf/droce-nvmf-perf  # nvmf_host: droce's initiator
NVMF_HNQN=nqn.2026-12.org.droce:interop-kernel-target        # nvmf_host: the guest kernel's subsystem
CTL_SOCK=/run/droce/interop-ctl.sock      # as in config/interop-rxe*.toml
VERBS_SOCK=/run/droce/interop-verbs.sock
DROCE_MAC=02:00:0a:4d:00:64
DROCE_IP=10.77.0.100
G1=${INTEROP_GUEST:-iop}1
G1_IP=10.77.0.1
G2=${INTEROP_GUEST:-iop}2   # --nvmf-perf: the kernel NVMe-oF target
G2_IP=10.77.0.2
BR_IP=10.77.0.254  # the harness's bridge address: kernel TCP of this namespace for the exchanges

[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, QEMU)"
[ -x "$RXEPEER" ] || cannot_run "the rxe-peer harness is not at $RXEPEER"
command -v qemu-system-x86_64 >/dev/null || cannot_run "qemu-system-x86_64 is not installed"
command -v tshark >/dev/null || cannot_run "tshark is not installed"
[ -f "${RXEPEER_WORK:-/var/tmp/rxe-peer}/setup.env" ] || cannot_run "the harness is not set up (run: $RXEPEER setup)"
command -v ibv_rc_pingpong >/dev/null && command -v ib_write_bw >/dev/null ||
  cannot_run "ibverbs-utils / perftest are not installed on the host"
need=("$TOOL" "$DUMPTOOL" "$DROCED" "$CTL" "$SHIMLIB/libibverbs.so.1")
[ $mode = nvmf ] && need=("$DUMPTOOL")  # and droce-nvmf, below
for b in "${need[@]}"; do
  if [ ! -e "$b" ]; then
    [ -f "$root/build/build.ninja" ] && timeout 1800 ninja -C "$root/build" -j2 app/droce-interop/droce-interop app/droce-dump/droce-dump \
      app/droced/droced app/droce-ctl/droce-ctl \
      "$(ninja -C "$root/build" -t targets all 2>/dev/null | sed -n 's/^\(lib\/shim\/front\/libibverbs\.so\.1\.[0-9.]*\): .*/\1/p' | head -1)" >/dev/null
    [ -e "$b" ] || { echo "interop: $b is not built (and could not be built)" >&2; exit 1; }
  fi
done
if [ $mode = nvmf ] || { [ $mode = ci ] && [ $NVMF_IN_CI = 1 ]; }; then
  command -v nvme >/dev/null || cannot_run "nvme-cli is not installed on the host (the guest runs it)"
  command -v fio >/dev/null || cannot_run "fio is not installed on the host (the guest runs it)"
  for b in "$NVMF_TOOL" "$NVMF_PERF_TOOL"; do
    if [ ! -e "$b" ]; then
      [ -f "$root/build/build.ninja" ] && timeout 1800 ninja -C "$root/build" -j2 app/droce-nvmf/droce-nvmf app/droce-nvmf-perf/droce-nvmf-perf >/dev/null
      [ -e "$b" ] || { echo "interop: $b is not built (and could not be built)" >&2; exit 1; }
    fi
  done
fi
cm_runs=0
{ [ $mode = cm ] || { [ $mode = ci ] && [ $CM_IN_CI = 1 ]; } || { [ $mode = full ] && [ $CM_IN_FULL = 1 ]; }; } && cm_runs=1
if [ $cm_runs = 1 ]; then
  for b in rping ucmatose udaddy rdma_server rdma_client cmtime qperf; do
    command -v "$b" >/dev/null || cannot_run "$b is not installed on the host (rdmacm-utils, qperf)"
  done
  if [ ! -e "$RDMACMLIB/librdmacm.so.1" ]; then
    [ -f "$root/build/build.ninja" ] && timeout 1800 ninja -C "$root/build" -j2 \
      "$(ninja -C "$root/build" -t targets all 2>/dev/null | sed -n 's/^\(lib\/shim\/front\/librdmacm\.so\.1\.[0-9.]*\): .*/\1/p' | head -1)" >/dev/null
    [ -e "$RDMACMLIB/librdmacm.so.1" ] || { echo "interop: $RDMACMLIB/librdmacm.so.1 (the drop-in librdmacm) is not built" >&2; exit 1; }
  fi
fi
if [ $mode = nvmf_perf ]; then
  for b in nvme fio python3; do command -v "$b" >/dev/null || cannot_run "$b is not installed on the host (nvme-cli, fio: the guests run the host's)"; done
  [ -x "$NVMF_TOOL" ] || { [ -f "$root/build/build.ninja" ] && timeout 1800 ninja -C "$root/build" -j2 app/droce-nvmf/droce-nvmf >/dev/null 2>&1; }
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.pcap "$OUT"/*.log "$OUT"/nvmf-perf-*

rx() { timeout -k 5 "$1" "$RXEPEER" "${@:2}"; }  # rx SECONDS ARGS...: every harness call bounded

guests=()
GUEST_BOOTS=0
DROCED_PID=
DROCED_MTU=
cleanup() {
  local g
  [ -n "${TSHARK_PID:-}" ] && kill -INT "$TSHARK_PID" 2>/dev/null
  [ -n "${DROCE_PID:-}" ] && kill -TERM "$DROCE_PID" 2>/dev/null
  [ -n "${HOST_PID:-}" ] && kill -TERM "$HOST_PID" 2>/dev/null
  stop_droced
  stop_nvmf
  if [ $keep -eq 0 ]; then
    for g in "${guests[@]}"; do rx 60 stop "$g" >/dev/null 2>&1; done
    rx 30 detach "$IFACE" >/dev/null 2>&1
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_droced MTU: droced on dpdk0 with config/interop-rxe.toml (1500) or -4096 (9000).
start_droced() {
  local mtu=$1 cfg=$root/config/interop-rxe.toml log=$OUT/droced-$1.log i
  [ "$mtu" -gt 1500 ] && cfg=$root/config/interop-rxe-4096.toml
  stop_droced
  mkdir -p /run/droce
  ip netns exec "$NS" timeout -k 5 14400 "$AFP_RUN" "$IFACE" "$DROCED" --config "$cfg" >>"$log" 2>&1 &
  DROCED_PID=$!
  DROCED_MTU=$mtu
  for i in $(seq 1 200); do
    [ -S "$VERBS_SOCK" ] && [ -S "$CTL_SOCK" ] && grep -q "droced: running" "$log" && return 0
    kill -0 "$DROCED_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "interop: droced did not start ($log):" >&2
  tail -n 20 "$log" >&2
  exit 1
}
stop_droced() {
  [ -n "${DROCED_PID:-}" ] || return 0
  kill -TERM "$DROCED_PID" 2>/dev/null
  local i
  for i in $(seq 1 100); do kill -0 "$DROCED_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$DROCED_PID" 2>/dev/null
  wait "$DROCED_PID" 2>/dev/null
  DROCED_PID=
}
ctl() { timeout -k 2 10 "$CTL" -s "$CTL_SOCK" "$@"; }

# boot_guest NAME IP MTU: boots (or reboots) one guest and attaches the veth with that MTU.
# droced (when it runs) is restarted on the new veth.
boot_guest() {
  local name=$1 ip=$2 mtu=$3 restart=0
  [ -n "$DROCED_PID" ] && restart=1
  stop_droced
  CUR_MTU=$mtu
  rx 60 stop "$name" >/dev/null 2>&1
  rx 30 detach "$IFACE" >/dev/null 2>&1
  echo "== booting guest $name ($ip, MTU $mtu)"
  if ! rx 240 start "$name" --ip "$ip/24" --mtu "$mtu" --timeout 200 >"$OUT/boot-$name.log" 2>&1; then
    tail -n 20 "$OUT/boot-$name.log" >&2
    rx 20 console "$name" 2>/dev/null | tail -n 20 >&2
    rx 60 stop "$name" >/dev/null 2>&1
    if ((${#ROWS[@]})); then  # a reboot in the middle of the matrix: results so far must not turn into a skip
      echo "interop: guest $name could not be rebooted after ${#ROWS[@]} runs (see $OUT/boot-$name.log)" >&2
      exit 1
    fi
    cannot_run "guest $name could not boot (see $OUT/boot-$name.log)"
  fi
  guests+=("$name")
  GUEST_BOOTS=$((GUEST_BOOTS + 1))  # what a guest was given at boot (nvmet_up) is gone after a reboot
  grep -E "RXEPEER_(GID|ACTIVE_MTU|KERNEL|ACCEL|UPTIME)" "$OUT/boot-$name.log" | sed 's/^/   /'
  rx 30 attach "$IFACE" --mtu "$mtu" >"$OUT/attach.log" 2>&1 || { cat "$OUT/attach.log" >&2; exit 1; }
  ip netns exec "$NS" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null
  ip netns exec "$NS" ip link set "$IFACE" mtu "$mtu" 2>/dev/null
  [ $restart -eq 1 ] && start_droced "$mtu"
  return 0
}

# capture_start FILE / capture_stop (a capture stops at 256 MiB: a peer retransmitting into
# QPs that no longer exist once filled 2.2 GB in 3 minutes, finding 13)
capture_start() {
  ip netns exec "$NS" timeout -k 5 1800 tshark -q -i "$IFACE-br" -f "udp port 4791" -a filesize:262144 -F pcap -w "$1" >"$1.tshark.log" 2>&1 &
  TSHARK_PID=$!
  local i
  for i in $(seq 1 300); do
    # Not "Capturing on": tshark prints that before it starts dumpcap. "Capture started" comes
    # once dumpcap has opened the interface and set the filter (under load a client's first
    # frame, a CM REQ, went out in between and the capture held only the peer's REJ).
    grep -q "Capture started" "$1.tshark.log" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "interop: tshark did not start capturing" >&2
}
capture_stop() {
  sleep 0.5
  kill -INT "$TSHARK_PID" 2>/dev/null
  wait "$TSHARK_PID" 2>/dev/null
  TSHARK_PID=
}

# check_capture PCAP MAC: every RoCEv2 frame droce sent: ICRC (droce-dump), the Wireshark
# dissector, and the IP TTL / hop limit (64: what Linux/rxe put on the wire whatever the
# application's AH asked, see app/droce-interop/README.md finding 4).
# Prints "packets/bad_icrc/malformed/bad_ttl".
check_capture() {
  local pcap=$1 mine=${1%.pcap}.droce.pcap mac=$2
  tshark -r "$pcap" -Y "eth.src==$mac" -F pcap -w "$mine" >/dev/null 2>&1
  local n bad mal ttl
  n=$(tshark -r "$mine" 2>/dev/null | wc -l)
  # droce-dump's summary: "summary: F frames, R RoCEv2 packets, B icrc bad, M malformed, N non-RoCE".
  bad=$("$DUMPTOOL" -q "$mine" 2>/dev/null |
        sed -n 's/^summary: .* \([0-9]*\) icrc bad, \([0-9]*\) malformed,.*/\1 \2/p' | { read -r a b && echo $((a + b)); })
  [ -n "$bad" ] || bad=$([ "$n" -eq 0 ] && echo 0 || echo "?")
  # UDP checksum 0 over IPv6 is flagged as an error by Wireshark (RFC 8200 8.1); rxe sends the
  # same (the ICRC covers the packet), so it is reported apart, not as malformed.
  # Wireshark tries heuristic upper-layer dissectors (RPC-over-RDMA, Ethertype/CRTP, SMB Direct, ...)
  # on every SEND payload and marks short or random payloads "Malformed" whoever sends them (a
  # synthetic 1-byte RC SEND of the pingpong's 0x7b bytes is flagged): those say nothing about
  # RoCE, so they are turned off; the InfiniBand/RoCE dissector itself stays fully checked.
  local heur=(rpcrdma_infiniband smb_direct_infiniband smcr_infiniband iser_infiniband lnet_ib sdp_infiniband
              fc_infiniband eth_over_ib) topt=() h out
  for h in "${heur[@]}"; do topt+=(--disable-heuristic "$h"); done
  if out=$(tshark "${topt[@]}" -r "$mine" -Y "_ws.malformed || !infiniband || (_ws.expert.severity >= error && !(ipv6 && udp.checksum == 0))" 2>/dev/null); then
    mal=$(printf '%s' "$out" | grep -c .)
  else
    mal="?"  # this tshark does not know one of the heuristic names: fail loudly rather than pass
  fi
  ttl=$(tshark -r "$mine" -Y "(ip && ip.ttl != 64) || (ipv6 && ipv6.hlim != 64)" 2>/dev/null | grep -c .)
  echo "$n/$bad/$mal/$ttl"
}

# Counters of droced's transport (all QPs, all cores): snapshot "name value" lines.
tcounters() {
  ctl counters -g transport 2>/dev/null | awk 'NR > 1 && NF >= 4 { v[$3] += $4 } END { for (k in v) print k, v[k] }'
}
# tdelta BEFORE AFTER: the retransmission-related deltas, short names.
tdelta() {
  awk 'NR == FNR { b[$1] = $2; next } { d = $2 - b[$1]; if (d > 0) a[$1] = d }
       END { split("req_retransmits:retx dup_request:dup seq_nak_sent:naks seq_nak_received:nakr rnr_nak_sent:rnrs rnr_nak_received:rnrr ack_timeouts:tmo out_of_seq_request:oos read_replayed:rdrep window_cuts:cuts", m, " ")
             for (i = 1; i <= length(m); i++) { split(m[i], kv, ":"); if (kv[1] in a) printf "%s=%d ", kv[2], a[kv[1]] } }' "$1" "$2"
}

# perftest_fig LOG KIND: the figures of a perftest table (bw: average MB/s and Mpps; lat: t_typical us).
perftest_fig() {
  awk -v kind="$2" '
    $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 5 && $3 ~ /^[0-9.]+$/ {
      n++; sz[n] = $1; v[n] = (kind == "bw") ? $4 " MB/s " $5 : $5 }
    END {
      if (!n) exit
      u = (kind == "bw") ? " Mpps" : " us"
      if (n == 1) printf "%s%s", v[1], u
      else printf "%sB %s%s .. %sB %s%s (%d sizes)", sz[1], v[1], u, sz[n], v[n], u, n
    }' "$1"
}

ROWS=()
FAILS=0
RETRIES=0
PORT=$((20000 + RANDOM % 20000))
row() {  # row TEST VIA DIR MTU LOSS SIZE RESULT FIGURES CHECK
  local dirname
  [ "$3" = d2r ] && dirname="droce->rxe" || dirname="rxe->droce"
  ROWS+=("$(printf '%-27s %-5s %-11s %-5s %-10s %-7s %-5s %s | %s' "$1" "$2" "$dirname" "$4" "$5" "$6" "$7" "$8" "$9")")
  echo "   ${ROWS[-1]}"
}

# wait_listen WHERE PORT: until a TCP server listens (WHERE: host = the namespace, guest = G1).
wait_listen() {
  local i
  for i in $(seq 1 40); do
    if [ "$1" = host ]; then
      [ -n "$(ip netns exec "$NS" ss -Htln "sport = :$2" 2>/dev/null)" ] && return 0
      sleep 0.25
    else
      [ -n "$(rx 20 exec "$G1" --timeout 10 -- ss -Htln "sport = :$2" 2>/dev/null)" ] && return 0
      sleep 0.5
    fi
  done
  return 1
}

# loss_on LOSS / loss_off LOSS: droce:P = droced's injector drops P of the frames it receives
# and of those it sends; rxe:P = netem in the guest drops P percent of what rxe sends.
loss_on() {
  case $1 in
    droce:*) ctl fault set -p "$IFACE" -d rx --drop "${1#droce:}" >/dev/null && ctl fault set -p "$IFACE" -d tx --drop "${1#droce:}" >/dev/null ;;
    rxe:*) rx 30 exec "$G1" --timeout 20 -- tc qdisc replace dev eth0 root netem loss "${1#rxe:}%" >/dev/null ;;
  esac
}
loss_off() {
  case $1 in
    droce:*) ctl fault set -p "$IFACE" -d rx --drop 0 >/dev/null; ctl fault set -p "$IFACE" -d tx --drop 0 >/dev/null ;;
    rxe:*) rx 30 exec "$G1" --timeout 20 -- tc qdisc del dev eth0 root >/dev/null 2>&1 ;;
  esac
}

# run_shim TEST DIR MTU LOSS SIZE ITERS [MORE TOOL ARGS...]
#   TEST: rc_pingpong uc_pingpong ud_pingpong srq_pingpong (ibverbs-utils, -c: data checked)
#         write_bw send_bw read_bw atomic_bw write_lat send_lat read_lat atomic_lat (perftest)
#   DIR: d2r (droce client -> rxe server) | r2d (rxe client -> droce server)
#   LOSS: 0 | droce:P | rxe:P | ipv6 (no loss, GID index 0 on both sides: RoCEv2 over IPv6 link-local)
#   SIZE: bytes, or "all" (perftest -a: 2 B .. 8 MiB); ignored by the atomic tools (8 B)
# Host side: droced's shim; guest side: rxe0. Unmodified Debian binaries on both.
run_shim() {
  local test=$1 dir=$2 mtu=$3 loss=$4 size=$5 iters=$6
  shift 6
  local extra=("$@")
  [ -n "$DROCED_PID" ] && [ "$DROCED_MTU" = "$CUR_MTU" ] || start_droced "$CUR_MTU"
  local tag="shim-$test-$dir-$mtu-${loss//[:.]/_}-$size"
  [ ${#extra[@]} -gt 0 ] && tag="$tag-$(printf '%s' "${extra[*]}" | tr -c 'A-Za-z0-9' _ | cut -c1-40)"
  local pcap="$OUT/$tag.pcap" hlog="$OUT/$tag.host.log" glog="$OUT/$tag.guest.log"
  local bin kind gidx=1 args=()
  [ "$loss" = ipv6 ] && gidx=0
  case $test in
    *_pingpong) bin=ibv_$test kind=pp ;;
    *_bw) bin=ib_$test kind=bw ;;
    *_lat) bin=ib_$test kind=lat ;;
  esac
  PORT=$((PORT + 1))
  if [ $kind = pp ]; then
    args=(-g "$gidx" -n "$iters" -s "$size" -c -p "$PORT")
    [ "$test" = ud_pingpong ] || args+=(-m "$mtu")
  else
    args=(-x "$gidx" -n "$iters" -m "$mtu" -F -p "$PORT")
    if [ "$size" = all ]; then args+=(-a); elif [[ $test != atomic_* ]]; then args+=(-s "$size"); fi
  fi
  args+=("${extra[@]}")
  # Packets each way, about: TCG rxe manages ~5,000/s; allow ~500/s plus the exchanges.
  local bytes pkts tmo
  if [ "$size" = all ]; then bytes=$((16 * 1024 * 1024)); else bytes=$size; fi
  [[ $test == atomic_* ]] && bytes=8
  pkts=$(( iters * (bytes / mtu + 1) ))
  [ $kind = pp ] && pkts=$((pkts * 2))
  [ "$test" = srq_pingpong ] && pkts=$((pkts * 16))  # 16 QPs
  tmo=$((60 + pkts / 500))
  case $loss in droce:*|rxe:*) tmo=$((tmo * 3)) ;; esac
  echo "== $bin $dir MTU $mtu loss $loss size $size iters $iters ${extra[*]}"
  local before after
  before=$(mktemp); after=$(mktemp)
  tcounters >"$before"
  loss_on "$loss"
  capture_start "$pcap"
  local hrc grc
  local host=(ip netns exec "$NS" env LD_LIBRARY_PATH="$SHIMLIB" DROCE_SOCKET="$VERBS_SOCK" timeout -k 5 "$tmo" "$bin" "${args[@]}")
  if [ "$dir" = d2r ]; then
    local job
    job=$(rx 30 exec "$G1" --bg --timeout "$tmo" -- "$bin" -d rxe0 "${args[@]}")
    if wait_listen guest "$PORT"; then
      "${host[@]}" "$G1_IP" >"$hlog" 2>&1
      hrc=$?
    else
      echo "the rxe server did not listen on $PORT" >"$hlog"
      hrc=99
    fi
    [ "$hrc" -eq 0 ] || rx 30 kill "$G1" "$job" >/dev/null 2>&1
    rx $((tmo + 30)) wait "$G1" "$job" --timeout "$((tmo + 10))" >"$glog" 2>&1
    grc=$?
  else
    "${host[@]}" >"$hlog" 2>&1 &
    HOST_PID=$!
    if wait_listen host "$PORT"; then
      rx $((tmo + 30)) exec "$G1" --timeout "$tmo" -- "$bin" -d rxe0 "${args[@]}" "$BR_IP" >"$glog" 2>&1
      grc=$?
    else
      echo "the droce server did not listen on $PORT" >>"$glog"
      grc=99
    fi
    [ "$grc" -eq 0 ] || { sleep 2; kill -TERM "$HOST_PID" 2>/dev/null; }
    wait "$HOST_PID"
    hrc=$?
    HOST_PID=
  fi
  capture_stop
  loss_off "$loss"
  tcounters >"$after"
  local retx
  retx=$(tdelta "$before" "$after")
  rm -f "$before" "$after"
  local n bad mal ttl
  IFS=/ read -r n bad mal ttl <<<"$(check_capture "$pcap" "$DROCE_MAC")"
  local fig
  if [ $kind = pp ]; then
    fig="$(sed -n 's/.*iters in .* = \([0-9.]*\) usec\/iter.*/\1/p' "$hlog" | tail -1) us/iter"
  else
    local clog=$hlog
    [ "$dir" = r2d ] && clog=$glog  # the client's table
    fig=$(perftest_fig "$clog" $kind)
    [ -n "$fig" ] || fig=$(perftest_fig "$([ "$clog" = "$hlog" ] && echo "$glog" || echo "$hlog")" $kind)
  fi
  # droce sends nothing when it only receives UC/UD traffic (a bw server: no ACKs on UC/UD).
  local silent=0
  [ $kind = bw ] && [ "$dir" = r2d ] && [[ " ${extra[*]} " == *" -c U"[CD]" "* ]] && silent=1
  local res=PASS
  if [ "$hrc" -ne 0 ] || [ "$grc" -ne 0 ] || grep -qiE "couldn't|failed|error|mismatch|invalid" "$hlog" "$glog" ||
     [ "$bad" != 0 ] || [ "$mal" != 0 ] || [ "$ttl" != 0 ] || { [ "$n" -eq 0 ] && [ $silent -eq 0 ]; }; then
    res=FAIL
    FAILS=$((FAILS + 1))
    echo "   FAILED (host rc $hrc, guest rc $grc, droce frames $n, bad ICRC $bad, malformed $mal, TTL not 64 $ttl)"
    grep -v "^ *GID\|^---" "$hlog" | tail -n 8 | sed 's/^/   droce: /'
    grep -v "^ *GID\|^---" "$glog" | tail -n 8 | sed 's/^/   rxe:   /'
  fi
  local t=$test
  if [ ${#extra[@]} -gt 0 ]; then
    t="$test ${extra[*]}"
    t=${t/ --rate_limit_type=SW --rate_limit=/ paced }
    t=${t/ --rate_units=p/pps}
  fi
  row "$t" shim "$dir" "$mtu" "$loss" "$size" "$res" "${fig:-?} ${retx}" "droce frames $n icrc-bad $bad malformed $mal ttl!=64 $ttl"
  [ $res = PASS ]
}

# run_embed TEST DIRECTION MTU LOSS SIZE ITERS: app/droce-interop (the embedding API) against
# ibv_*_pingpong in the guest. droced is stopped meanwhile (both would own dpdk0 and 10.77.0.100).
#   LOSS: 0 | droce:P | rxe:P | rnr:MS (droce keeps one receive posted and reposts it MS ms late:
#         the peer meets RNR NAKs) | ipv6
run_embed() {
  local test=$1 dir=$2 mtu=$3 loss=$4 size=$5 iters=$6
  stop_droced
  local tag="embed-$test-$dir-$mtu-${loss//[:.]/_}-$size"
  local pcap="$OUT/$tag.pcap" dlog="$OUT/$tag.droce.log" glog="$OUT/$tag.guest.log"
  local bin=ibv_$test gargs=(-d rxe0 -g 1 -n "$iters" -s "$size") dargs=(-n "$iters" -s "$size" -m "$mtu")
  [ "$test" = ud_pingpong ] || gargs+=(-m "$mtu" -c)
  [ "$test" = ud_pingpong ] && gargs+=(-c)
  local dev="net_af_packet0,iface=$IFACE"
  [ "$mtu" -gt 1024 ] && dev="$dev,framesz=8192,blocksz=8192"
  local tmo=$((60 + iters / 5))
  [ "$loss" = 0 ] || tmo=$((tmo * 3))
  case $loss in
    droce:*) dargs+=(--fault-drop "${loss#droce:}" --fault-tx-drop "${loss#droce:}") ;;
    rnr:*) dargs+=(--lazy-recv "${loss#rnr:}") ;;
    ipv6) gargs[3]=0; dargs+=(-g 0) ;;  # GID index 0 on both sides: fe80:: link-local, RoCEv2 over IPv6
    rxe:*) loss_on "$loss" ;;
  esac
  echo "== droce-interop $test $dir MTU $mtu loss $loss size $size iters $iters"
  capture_start "$pcap"
  local drc grc
  if [ "$dir" = d2r ]; then
    local job
    job=$(rx 30 exec "$G1" --bg --timeout "$tmo" -- "$bin" "${gargs[@]}")
    sleep 1
    ip netns exec "$NS" timeout -k 5 "$tmo" "$AFP_RUN" "$IFACE" "$TOOL" "$test" "$G1_IP" --device "$dev" --ip "$DROCE_IP" \
      --timeout "$((tmo - 5))" "${dargs[@]}" >"$dlog" 2>&1
    drc=$?
    rx $((tmo + 30)) wait "$G1" "$job" --timeout "$((tmo + 10))" >"$glog" 2>&1
    grc=$?
  else
    ip netns exec "$NS" timeout -k 5 "$tmo" "$AFP_RUN" "$IFACE" "$TOOL" "$test" --device "$dev" --ip "$DROCE_IP" \
      --timeout "$((tmo - 5))" "${dargs[@]}" >"$dlog" 2>&1 &
    DROCE_PID=$!
    local i
    for i in $(seq 1 300); do grep -q "waiting for the client" "$dlog" 2>/dev/null && break; sleep 0.1; done
    rx $((tmo + 30)) exec "$G1" --timeout "$tmo" -- "$bin" "${gargs[@]}" "$BR_IP" >"$glog" 2>&1
    grc=$?
    wait "$DROCE_PID"
    drc=$?
    DROCE_PID=
  fi
  capture_stop
  case $loss in rxe:*) loss_off "$loss" ;; esac
  local n bad mal ttl mac
  mac=$(sed -n 's/^ device .* mac \([0-9a-f:]*\) gid.*/\1/p' "$dlog" | head -1)
  IFS=/ read -r n bad mal ttl <<<"$(check_capture "$pcap" "${mac:-00:00:00:00:00:00}")"
  local dfig retx
  dfig=$(sed -n 's/.*usec_per_iter=\([0-9.]*\) mbit=\([0-9.]*\).*/\1 us\/iter/p' "$dlog" | tail -1)
  retx=$(grep -o "req_retransmits=[0-9]*\|dup_request=[0-9]*\|seq_nak_sent=[0-9]*\|seq_nak_received=[0-9]*\|rnr_nak_sent=[0-9]*\|rnr_nak_received=[0-9]*" "$dlog" |
         sed 's/req_retransmits/retx/;s/dup_request/dup/;s/seq_nak_sent/naks/;s/seq_nak_received/nakr/;s/rnr_nak_sent/rnrs/;s/rnr_nak_received/rnrr/' | grep -v "=0$" | tr '\n' ' ')
  local res=PASS
  if [ "$drc" -ne 0 ] || [ "$grc" -ne 0 ] || ! grep -q "result=PASS" "$dlog" || [ "$bad" != 0 ] || [ "$mal" != 0 ] || [ "$ttl" != 0 ] || [ "$n" -eq 0 ]; then
    res=FAIL
    FAILS=$((FAILS + 1))
    echo "   FAILED (droce rc $drc, guest rc $grc, droce frames $n, bad ICRC $bad, malformed $mal, TTL not 64 $ttl)"
    grep -v "^EAL\|^TELEMETRY" "$dlog" | tail -n 8 | sed 's/^/   droce: /'
    tail -n 8 "$glog" | sed 's/^/   guest: /'
  fi
  row "$test" embed "$dir" "$mtu" "$loss" "$size" "$res" "${dfig:-?} ${retx}" "droce frames $n icrc-bad $bad malformed $mal ttl!=64 $ttl"
  [ $res = PASS ]
}

# ---- RDMA CM (issue 10): Debian's rdmacm-utils, perftest -R and qperf -cm1 ----
# Host side: the unmodified tools through the drop-in librdmacm.so.1 + libibverbs.so.1
# (LD_LIBRARY_PATH=$RDMACMLIB:$SHIMLIB), connection work done by droced on QP1; guest side:
# the kernel's rdma_cm over rxe0. Addresses are the RDMA ones on both sides (no TCP
# exchange): the guest's 10.77.0.1 and droce's 10.77.0.100 (qperf alone keeps its TCP
# control connection, so it only runs droce->rxe: its server must be at the address the
# client also reaches with rdma_cm, which the namespace's kernel TCP is not).

# cm_cmd TEST ROLE SIDE SRV PORT ITERS: sets CMD (the tool and its arguments).
#   ROLE server|client, SIDE host|guest, SRV the server's RDMA address.
cm_cmd() {
  local test=$1 role=$2 side=$3 srv=$4 port=$5 n=$6 dev=()
  [ "$side" = guest ] && dev=(-d rxe0)
  local srvarg=()
  [ "$role" = client ] && srvarg=("$srv")
  case $test in
    rping|rping_kill)
      if [ "$role" = server ]; then CMD=(rping -s -a "$srv" -p "$port" -C "$n" -v -V)
      else CMD=(rping -c -a "$srv" -p "$port" -C "$n" -v -V); fi ;;
    rej) CMD=(rping -c -a "$srv" -p "$port" -C 1 -v -V) ;;
    ucmatose)
      if [ "$role" = server ]; then CMD=(ucmatose -b "$srv" -p "$port" -c 1 -C "$n")
      else CMD=(ucmatose -s "$srv" -p "$port" -c 1 -C "$n"); fi ;;
    udaddy)  # udaddy's port is always 7174 (its -p is the port space)
      if [ "$role" = server ]; then CMD=(udaddy -b "$srv" -c 1 -C "$n")
      else CMD=(udaddy -s "$srv" -c 1 -C "$n"); fi ;;
    rdma_server) if [ "$role" = server ]; then CMD=(rdma_server -s "$srv" -p "$port"); else CMD=(rdma_client -s "$srv" -p "$port"); fi ;;
    cmtime)  # n connections set up and torn down; the server runs until killed
      if [ "$role" = server ]; then CMD=(cmtime -b "$srv" -p "$port" -c "$n")
      else CMD=(cmtime -s "$srv" -p "$port" -c "$n"); fi ;;
    write_bw) CMD=(ib_write_bw "${dev[@]}" -R -F -n "$n" -s 65536 -p "$port" "${srvarg[@]}") ;;
    send_bw) CMD=(ib_send_bw "${dev[@]}" -R -F -n "$n" -s 65536 -p "$port" "${srvarg[@]}") ;;
    send_bw_ud) CMD=(ib_send_bw "${dev[@]}" -R -F -c UD -n "$n" -s 512 -p "$port" "${srvarg[@]}") ;;
    read_lat) CMD=(ib_read_lat "${dev[@]}" -R -F -n "$n" -s 2 -p "$port" "${srvarg[@]}") ;;
    fio_send|fio_write|fio_read)  # fio's rdma engine: the server job reads, the client job writes
      local verb=${test#fio_} ver=()   # with verb=send the server checks the client's verify headers
      [ "$verb" = send ] && ver=(--verify=crc32c --verify_state_save=0)
      # fio connects with rnr_retry_count 0: the server's 64 receives for the client's 4 in
      # flight are its slack (see test/engine/cm_pair.sh)
      if [ "$role" = server ]; then CMD=(fio --thread --ioengine=rdma --bs=64k --size=8m --iodepth=64 --name=s --port="$port" --rw=read "${ver[@]}")
      else CMD=(fio --thread --ioengine=rdma --bs=64k --size=8m --iodepth=4 --name=c --port="$port" --hostname="$srv" --rw=write --verb="$verb" "${ver[@]}"); fi ;;
    qperf_rc_bw|qperf_rc_lat)
      if [ "$role" = server ]; then CMD=(qperf -lp "$port")
      else CMD=(qperf -lp "$port" "$srv" -cm1 -t 2 "${test#qperf_}"); fi ;;
    *) echo "interop: unknown CM test $test" >&2; exit 2 ;;
  esac
}

# droced's CM connections and listeners: droce-ctl's `cm` command (JSON, -j). cm_ctl_scan
# MODE [PORT]: MODE listening = is there a listener on PORT (exit 0/1); MODE conns = prints how
# many connections (any state but listen/closed) droced still has, "?" if droce-ctl cannot say.
# The JSON is walked for objects with a "state" (cm::state_name: listen, req_sent, ...,
# established, timewait), whatever the layout around them.
cm_ctl_scan() {
  local j
  j=$(ctl -j cm 2>/dev/null) || { [ "$1" = conns ] && echo "?"; return 1; }
  printf '%s' "$j" | python3 -c '
import json, sys
mode, port = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
try:
    doc = json.load(sys.stdin)
except ValueError:
    print("?") if mode == "conns" else None
    sys.exit(1)
found = []
def walk(x):
    if isinstance(x, dict):
        if isinstance(x.get("state"), str):
            found.append(x)
        for v in x.values():
            walk(v)
    elif isinstance(x, list):
        for v in x:
            walk(v)
walk(doc)
def has_port(d):
    def vals(x):
        if isinstance(x, dict):
            for v in x.values(): yield from vals(v)
        elif isinstance(x, list):
            for v in x: yield from vals(v)
        else:
            yield x
    for v in vals(d):
        if str(v) == port or str(v).endswith(":" + port) or str(v) == hex(int(port)):
            return True
    return False
if mode == "listening":
    sys.exit(0 if any(d["state"] == "listen" and has_port(d) for d in found) else 1)
print(sum(1 for d in found if d["state"] not in ("listen", "closed")))
' "$@"
}
cm_host_listening() { cm_ctl_scan listening "$1"; }
cm_host_conns() { cm_ctl_scan conns; }
# cm_wait_listen WHERE PORT: until the server's rdma_cm id listens (WHERE: host = droced,
# guest = G1's kernel rdma_cm: `rdma res show cm_id`). qperf: its TCP port.
cm_wait_listen() {
  local i
  for i in $(seq 1 40); do
    if [ "$1" = host ]; then
      cm_host_listening "$2" && return 0
      sleep 0.25
    else
      rx 20 exec "$G1" --timeout 10 -- rdma res show cm_id 2>/dev/null | grep -q "LISTEN.*:$2 " && return 0
      sleep 0.5
    fi
  done
  return 1
}

# qperf's control connection is kernel TCP to its server name, the address it also gives
# rdma_cm. For rxe->droce that is droce's address, which only droced answers (ARP with
# droce's MAC; the namespace's kernel drops frames to that MAC). qperf_kernel_share on|off
# lets the kernel of $NS take TCP at droce's address too: $IFACE (droced's af_packet port)
# gets droce's MAC and address, a blackhole rule drops RoCEv2 (UDP 4791, droced's) in the
# kernel without an ICMP answer, and no reverse path check (its route to the guests is the
# bridge); af_packet still hands droced every frame, so the RDMA CM and the data go to
# droced and qperf's TCP to the host's qperf.
QPERF_IFACE_MAC=
qperf_kernel_share() {
  if [ "$1" = on ]; then
    QPERF_IFACE_MAC=$(ip netns exec "$NS" cat "/sys/class/net/$IFACE/address")
    ip -n "$NS" link set "$IFACE" address "$DROCE_MAC" &&
      ip -n "$NS" addr add "$DROCE_IP/32" dev "$IFACE" &&
      ip netns exec "$NS" sysctl -qw "net.ipv4.conf.$IFACE.rp_filter=0" net.ipv4.conf.all.rp_filter=0 &&
      ip -n "$NS" rule add pref 100 iif "$IFACE" ipproto udp dport 4791 blackhole
  else
    ip -n "$NS" rule del pref 100 2>/dev/null
    ip -n "$NS" addr del "$DROCE_IP/32" dev "$IFACE" 2>/dev/null
    [ -n "$QPERF_IFACE_MAC" ] && ip -n "$NS" link set "$IFACE" address "$QPERF_IFACE_MAC"
    QPERF_IFACE_MAC=
  fi
}

# run_cm TEST DIR MTU LOSS ITERS (MTU: the path MTU the CM negotiates, for the table and filters)
#   TEST: rping (-v -V: data checked) ucmatose udaddy rdma_server (with rdma_client) cmtime
#         write_bw send_bw send_bw_ud read_lat (perftest -R) qperf_rc_bw qperf_rc_lat (-cm1)
#         fio_send fio_write fio_read (fio --ioengine=rdma, 8 MiB; send: verify=crc32c checked
#         by the server)
#         rej: a REQ to a port nobody listens on (the client must see REJECTED, the capture a REJ)
#         rping_kill: the host's rping is killed (SIGKILL) mid-run: the guest's rping must end
#         (DISCONNECTED or an error), and droced must keep no CM connection (droce-ctl cm)
#   DIR: d2r (droce client -> rxe server) | r2d (rxe client -> droce server)
#   LOSS: 0 | droce:P | rxe:P
run_cm() {
  local test=$1 dir=$2 mtu=$3 loss=$4 iters=$5 fig_extra=""
  [ -n "$DROCED_PID" ] && [ "$DROCED_MTU" = "$CUR_MTU" ] || start_droced "$CUR_MTU"
  local tag="cm-$test-$dir-${loss//[:.]/_}"
  local pcap="$OUT/$tag.pcap" hlog="$OUT/$tag.host.log" glog="$OUT/$tag.guest.log"
  PORT=$((PORT + 1))
  local port=$PORT srv hrole grole
  [ "$test" = udaddy ] && port=7174
  if [ "$dir" = d2r ]; then srv=$G1_IP hrole=client grole=server; else srv=$DROCE_IP hrole=server grole=client; fi
  local tmo=$((90 + iters / 5))
  [ "$test" = rej ] && tmo=40  # a REJ comes at once; without one the client would retry for a minute
  case $loss in droce:*|rxe:*) tmo=$((tmo * 3)) ;; esac
  local hcmd gcmd
  cm_cmd "$test" "$hrole" host "$srv" "$port" "$iters"; hcmd=("${CMD[@]}")
  cm_cmd "$test" "$grole" guest "$srv" "$port" "$iters"; gcmd=("${CMD[@]}")
  [ "$test" = rej ] && { hcmd=(rping -c -a "$G1_IP" -p "$port" -C 1 -v -V); gcmd=(rping -c -a "$DROCE_IP" -p "$port" -C 1 -v -V); }
  echo "== CM $test $dir loss $loss iters $iters: host: ${hcmd[*]} / guest: ${gcmd[*]}"
  local before after
  before=$(mktemp); after=$(mktemp)
  tcounters >"$before"
  loss_on "$loss"
  [[ $test == qperf_* && $dir == r2d ]] && { qperf_kernel_share on || note="cannot give the kernel droce's address for qperf's TCP"; }
  capture_start "$pcap"
  local host=(ip netns exec "$NS" env LD_LIBRARY_PATH="$RDMACMLIB:$SHIMLIB" DROCE_SOCKET="$VERBS_SOCK")
  local hrc=0 grc=0 job note=""
  if [ "$test" = rej ]; then
    # Nobody listens on $port on the other side: the client gets RDMA_CM_EVENT_REJECTED.
    if [ "$dir" = d2r ]; then
      "${host[@]}" timeout -k 5 "$tmo" "${hcmd[@]}" >"$hlog" 2>&1; hrc=$?
      : >"$glog"
    else
      rx $((tmo + 30)) exec "$G1" --timeout "$tmo" -- "${gcmd[@]}" >"$glog" 2>&1; grc=$?
      : >"$hlog"
    fi
  elif [ "$test" = rping_kill ]; then
    local big=100000 i
    if [ "$dir" = d2r ]; then
      job=$(rx 30 exec "$G1" --bg --timeout "$tmo" -- rping -s -a "$G1_IP" -p "$port" -C $big -v)
      cm_wait_listen guest "$port" || note="the rxe server did not listen on $port"
      "${host[@]}" rping -c -a "$G1_IP" -p "$port" -C $big -v >"$hlog" 2>&1 &  # ip netns exec and env exec: $! is rping
    else
      "${host[@]}" rping -s -a "$DROCE_IP" -p "$port" -C $big -v >"$hlog" 2>&1 &
    fi
    HOST_PID=$!
    if [ "$dir" = r2d ]; then
      cm_wait_listen host "$port" || note="the droce server did not listen on $port"
      job=$(rx 30 exec "$G1" --bg --timeout "$tmo" -- rping -c -a "$DROCE_IP" -p "$port" -C $big -v)
    fi
    for i in $(seq 1 200); do [ "$(grep -c "ping data" "$hlog")" -ge 5 ] && break; kill -0 "$HOST_PID" 2>/dev/null || break; sleep 0.25; done
    [ "$(grep -c "ping data" "$hlog")" -ge 5 ] || note="${note:-the host rping did not get going}"
    kill -KILL "$HOST_PID" 2>/dev/null
    wait "$HOST_PID" 2>/dev/null
    HOST_PID=
    # The guest's rping must end by itself (DISCONNECTED from droced's DREQ, or its QP's
    # error), well before its own timeout.
    rx $((tmo + 30)) wait "$G1" "$job" --timeout 60 >"$glog" 2>&1
    grc=$?
    if grep -q "^rxepeer: .*timed out\|still running" "$glog"; then
      note="${note:-the guest rping did not end within 60 s}"
      rx 30 kill "$G1" "$job" >/dev/null 2>&1
    fi
    # droced keeps nothing: no CM connection left (TimeWait is bounded).
    local left
    for i in $(seq 1 120); do left=$(cm_host_conns); [ "$left" = 0 ] && break; sleep 0.5; done
    [ "$left" = 0 ] || note="${note:-droce-ctl cm: $left CM connection(s) left in droced}"
    hrc=0 grc=0  # judged by the note alone: the killed program and its peer exit non-zero
    grep -q "DISCONNECT" "$glog" && fig_extra="guest saw DISCONNECTED" || fig_extra="guest ended without DISCONNECTED"
  elif [ "$dir" = d2r ]; then
    job=$(rx 30 exec "$G1" --bg --timeout "$tmo" -- "${gcmd[@]}")
    if [[ $test == qperf_* ]]; then wait_listen guest "$port"; else cm_wait_listen guest "$port"; fi ||
      note="the rxe server did not listen on $port"
    "${host[@]}" timeout -k 5 "$tmo" "${hcmd[@]}" >"$hlog" 2>&1
    hrc=$?
    # qperf 0.4.11's server sends its RDMA CM port over TCP before it calls rdma_listen, so a
    # quick client's REQ can meet no listener (REJ reason 8 from the guest's rdma_cm): the
    # client is run again (its server forks a new child per control connection), twice at most.
    local again
    for again in 1 2; do
      [[ $test == qperf_* ]] && [ "$hrc" -ne 0 ] && grep -q "Event rejected" "$hlog" || break
      fig_extra="client rerun $again after qperf's listen race"
      "${host[@]}" timeout -k 5 "$tmo" "${hcmd[@]}" >"$hlog" 2>&1
      hrc=$?
    done
    if [[ $test == qperf_* || $test == cmtime ]]; then  # servers that run until killed
      rx 30 kill "$G1" "$job" >/dev/null 2>&1
      rx 60 wait "$G1" "$job" --timeout 30 >"$glog" 2>&1
    else
      [ "$hrc" -eq 0 ] || rx 30 kill "$G1" "$job" >/dev/null 2>&1
      rx $((tmo + 30)) wait "$G1" "$job" --timeout "$((tmo + 10))" >"$glog" 2>&1
      grc=$?
    fi
  else
    "${host[@]}" timeout -k 5 "$tmo" "${hcmd[@]}" >"$hlog" 2>&1 &
    HOST_PID=$!
    if if [[ $test == qperf_* ]]; then wait_listen host "$port"; else cm_wait_listen host "$port"; fi; then
      rx $((tmo + 30)) exec "$G1" --timeout "$tmo" -- "${gcmd[@]}" >"$glog" 2>&1
      grc=$?
    else
      note="the droce server did not listen on $port"
      echo "$note" >"$glog"
      grc=99
    fi
    if [[ $test == cmtime || $test == qperf_* ]]; then  # servers that run until killed
      kill -TERM "$HOST_PID" 2>/dev/null
    else
      [ "$grc" -eq 0 ] || { sleep 2; kill -TERM "$HOST_PID" 2>/dev/null; }
    fi
    wait "$HOST_PID"
    hrc=$?
    [[ $test == cmtime || $test == qperf_* ]] && hrc=0
    HOST_PID=
  fi
  capture_stop
  loss_off "$loss"
  [[ $test == qperf_* && $dir == r2d ]] && qperf_kernel_share off
  tcounters >"$after"
  local retx
  retx=$(tdelta "$before" "$after")
  rm -f "$before" "$after"
  local n bad mal ttl
  IFS=/ read -r n bad mal ttl <<<"$(check_capture "$pcap" "$DROCE_MAC")"
  # CM MADs droce sent, and the REJs on the wire.
  local cm_sent rejs
  cm_sent=$(tshark -r "$pcap" -Y "eth.src==$DROCE_MAC && infiniband.bth.destqp == 1" 2>/dev/null | grep -c .)
  rejs=$(tshark -r "$pcap" -Y "infiniband.mad.attributeid == 0x0012" -T fields -e eth.src 2>/dev/null)
  local fig="" clog=$hlog slog=$glog
  [ "$dir" = r2d ] && { clog=$glog; slog=$hlog; }
  case $test in
    rping) fig="$(grep -c "ping data" "$clog") pings" ;;
    write_bw|send_bw|send_bw_ud) fig=$(perftest_fig "$clog" bw) ;;
    read_lat) fig=$(perftest_fig "$clog" lat) ;;
    qperf_*) fig="$(grep -E "bw  =|latency  =" "$clog" | sed 's/^ *//' | head -1)${fig_extra:+ ($fig_extra)}" ;;
    cmtime) fig="connect $(awk '$1 == "connect" {print $NF}' "$clog") us/conn" ;;
    fio_*) fig="$(sed -n 's/^ *WRITE: bw=\([^ ]*\) .*/\1/p' "$clog" | head -n 1)" ;;
    rping_kill) fig=$fig_extra ;;
  esac
  local res=PASS
  if [ "$test" = rej ]; then
    # The client was refused (REJ from the side nobody listens on), nothing else went wrong.
    local want_mac rlog=$hlog rrc=$hrc
    [ "$dir" = r2d ] && { rlog=$glog; rrc=$grc; }
    if [ "$dir" = d2r ]; then want_mac=$(rx 20 info "$G1" 2>/dev/null | sed -n 's/^RXEPEER_MAC=//p'); else want_mac=$DROCE_MAC; fi
    fig="REJ from $([ "$dir" = d2r ] && echo rxe || echo droce): $(printf '%s\n' "$rejs" | grep -ci "${want_mac:-none}")"
    if [ "$rrc" -eq 0 ] || ! grep -q "REJECTED" "$rlog" || ! printf '%s\n' "$rejs" | grep -qi "${want_mac:-none}" ||
       [ "$bad" != 0 ] || [ "$mal" != 0 ] || [ "$ttl" != 0 ] || [ "$cm_sent" -eq 0 ]; then
      res=FAIL
    fi
  elif [ -n "$note" ] || [ "$hrc" -ne 0 ] || [ "$grc" -ne 0 ] ||
       grep -qiE "couldn't|failed|error|mismatch|invalid|unable" "$hlog" "$glog" ||
       [ "$bad" != 0 ] || [ "$mal" != 0 ] || [ "$ttl" != 0 ] || [ "$cm_sent" -eq 0 ] ||
       { [ "$test" = rping ] && [ "$(grep -c "ping data" "$clog")" -ne "$iters" ]; } ||
       { [[ $test == ucmatose || $test == udaddy ]] && ! grep -q "return status 0" "$hlog"; } ||
       { [[ $test == ucmatose || $test == udaddy ]] && ! grep -q "return status 0" "$glog"; } ||
       { [[ $test == fio_* ]] && { ! grep -q "io=8192KiB" "$clog" || ! grep -q "err= 0" "$slog" || grep -q "verify:" "$slog"; }; }; then
    [ "$test" = rping_kill ] && [ -z "$note" ] && grep -qiE "error|failed" "$glog" && [ "$bad" = 0 ] && [ "$mal" = 0 ] &&
      [ "$ttl" = 0 ] && [ "$cm_sent" -ne 0 ] || res=FAIL  # the guest's rping may report the dead peer as an error
  fi
  if [ $res = FAIL ]; then
    FAILS=$((FAILS + 1))
    echo "   FAILED (host rc $hrc, guest rc $grc, droce frames $n, CM MADs $cm_sent, bad ICRC $bad, malformed $mal, TTL not 64 $ttl${note:+; $note})"
    tail -n 8 "$hlog" | sed 's/^/   droce: /'
    tail -n 8 "$glog" | sed 's/^/   rxe:   /'
  fi
  row "$test" cm "$dir" "$mtu" "$loss" "-" "$res" "${fig:-?} ${retx}" "droce frames $n cm-mads $cm_sent icrc-bad $bad malformed $mal ttl!=64 $ttl"
  [ $res = PASS ]
}

# run_mckey mckey DIR MTU LOSS ITERS: Debian's mckey (UD multicast through rdma_join_multicast_ex,
# MULTICAST_JOIN and ibv_attach_mcast, SENDs to QPN 0xFFFFFF with Q_Key RDMA_UDP_QKEY) between
# droced (drop-in librdmacm) and the guest's kernel rdma_cm over rxe0. The receiver joins a
# 239.77.0.x group and waits for ITERS messages (mckey's own wait has no timeout: `timeout`
# bounds it); the sender on the other side starts once the receiver has joined (droce: its
# "mckey: joined" line, line-buffered with stdbuf -oL; rxe: the guest kernel lists the group on its interface, the IGMP join
# cma makes for RoCEv2) and sends ITERS. PASS: both exit 0 with "data transfers complete",
# the receiver got the group's MGID (::ffff:239.77.0.x), droce's frames pass the capture
# checks, and for d2r the capture holds ITERS droce frames to the group's MAC and QPN 0xFFFFFF.
run_mckey() {
  local dir=$2 mtu=$3 loss=$4 iters=$5
  [ -n "$DROCED_PID" ] && [ "$DROCED_MTU" = "$CUR_MTU" ] || start_droced "$CUR_MTU"
  PORT=$((PORT + 1))
  local group=239.77.0.$((PORT % 200 + 20))
  local tag="cm-mckey-$dir-${loss//[:.]/_}"
  local pcap="$OUT/$tag.pcap" hlog="$OUT/$tag.host.log" glog="$OUT/$tag.guest.log"
  local host=(ip netns exec "$NS" env LD_LIBRARY_PATH="$RDMACMLIB:$SHIMLIB" DROCE_SOCKET="$VERBS_SOCK")
  local tmo=90 hrc=0 grc=0 note="" job i before after
  echo "== CM mckey $dir group $group iters $iters"
  before=$(mktemp); after=$(mktemp)
  tcounters >"$before"
  loss_on "$loss"
  capture_start "$pcap"
  if [ "$dir" = d2r ]; then
    job=$(rx 30 exec "$G1" --bg --timeout "$tmo" -- mckey -m "$group" -b "$G1_IP" -C "$iters")
    for i in $(seq 1 60); do
      rx 20 exec "$G1" --timeout 10 -- ip maddr show 2>/dev/null | grep -qw "inet *${group//./\\.}" && break
      sleep 0.5
    done
    [ "$i" -lt 60 ] || note="the rxe receiver did not join $group"
    "${host[@]}" timeout -k 5 "$tmo" mckey -m "$group" -b "$DROCE_IP" -s -C "$iters" >"$hlog" 2>&1
    hrc=$?
    [ "$hrc" -eq 0 ] || rx 30 kill "$G1" "$job" >/dev/null 2>&1
    rx $((tmo + 30)) wait "$G1" "$job" --timeout "$((tmo + 10))" >"$glog" 2>&1
    grc=$?
  else
    "${host[@]}" timeout -k 5 "$tmo" stdbuf -oL mckey -m "$group" -b "$DROCE_IP" -C "$iters" >"$hlog" 2>&1 &
    HOST_PID=$!
    for i in $(seq 1 300); do
      grep -q '^mckey: joined' "$hlog" && break
      kill -0 "$HOST_PID" 2>/dev/null || break
      sleep 0.1
    done
    grep -q '^mckey: joined' "$hlog" || note="the droce receiver did not join $group"
    rx $((tmo + 30)) exec "$G1" --timeout "$tmo" -- mckey -m "$group" -b "$G1_IP" -s -C "$iters" >"$glog" 2>&1
    grc=$?
    wait "$HOST_PID"  # ends by itself with all ITERS messages, else its timeout
    hrc=$?
    HOST_PID=
  fi
  capture_stop
  loss_off "$loss"
  tcounters >"$after"
  local retx
  retx=$(tdelta "$before" "$after")
  rm -f "$before" "$after"
  local n bad mal ttl gmac to_group
  IFS=/ read -r n bad mal ttl <<<"$(check_capture "$pcap" "$DROCE_MAC")"
  local o1 o2 o3 o4
  IFS=. read -r o1 o2 o3 o4 <<<"$group"
  gmac=$(printf '01:00:5e:%02x:%02x:%02x' $((o2 & 127)) "$o3" "$o4")  # RFC 1112: the low 23 bits
  to_group=$(tshark -r "$pcap" -Y "eth.src==$DROCE_MAC && eth.dst==$gmac && infiniband.bth.destqp == 0xffffff" 2>/dev/null | grep -c .)
  local rlog=$glog slog=$hlog
  [ "$dir" = r2d ] && { rlog=$hlog; slog=$glog; }
  local res=PASS
  if [ -n "$note" ] || [ "$hrc" -ne 0 ] || [ "$grc" -ne 0 ] ||
     ! grep -q "data transfers complete" "$rlog" || ! grep -q "data transfers complete" "$slog" ||
     ! grep -q "joined dgid: ::ffff:$group" "$rlog" ||
     grep -qiE "failed|failure|error|unable" "$hlog" "$glog" ||
     [ "$bad" != 0 ] || [ "$mal" != 0 ] || [ "$ttl" != 0 ] ||
     { [ "$dir" = d2r ] && [ "$to_group" -lt "$iters" ]; }; then
    res=FAIL
    FAILS=$((FAILS + 1))
    echo "   FAILED (host rc $hrc, guest rc $grc, droce frames $n, to the group $to_group, bad ICRC $bad, malformed $mal, TTL not 64 $ttl${note:+; $note})"
    tail -n 8 "$hlog" | sed 's/^/   droce: /'
    tail -n 8 "$glog" | sed 's/^/   rxe:   /'
  fi
  row mckey cm "$dir" "$mtu" "$loss" "-" "$res" "$iters msgs to $group ${retx}" "droce frames $n to-group $to_group icrc-bad $bad malformed $mal ttl!=64 $ttl"
  [ $res = PASS ]
}

# ---- NVMe over Fabrics (issue 11): the guest's kernel nvme-rdma host against app/droce-nvmf ----
# droce side: droce-nvmf (config/nvmf.toml: one 128 MiB RAM namespace, any host) on dpdk0 at
# $DROCE_IP; droced is stopped meanwhile (both would own dpdk0 and the address). Guest side:
# scripts/interop-nvmf-guest.sh (nvme-cli, fio, mkfs.ext4 of the host's root), one step per call.
NVMF_PID=
# start_nvmf LOSS LOG: droce-nvmf (loss droce:P: its injector drops P of received and sent frames;
# droce-rx:P only received ones, droce-tx:P only sent ones).
start_nvmf() {
  local loss=$1 log=$2 args=() i
  stop_droced
  stop_nvmf
  case $loss in
    droce:*) args+=(--fault-drop "${loss#droce:}" --fault-tx-drop "${loss#droce:}") ;;
    droce-rx:*) args+=(--fault-drop "${loss#droce-rx:}") ;;
    droce-tx:*) args+=(--fault-tx-drop "${loss#droce-tx:}") ;;
  esac
  ip netns exec "$NS" timeout -k 5 3600 "$AFP_RUN" "$IFACE" "$NVMF_TOOL" --device "net_af_packet0,iface=$IFACE" \
    --ip "$DROCE_IP" --mac "$DROCE_MAC" -c "$NVMF_CFG" "${args[@]}" ${INTEROP_NVMF_ARGS:-} -- --no-pci >"$log" 2>&1 &
  NVMF_PID=$!
  for i in $(seq 1 200); do
    grep -q "^droce-nvmf: listening on" "$log" && return 0
    kill -0 "$NVMF_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "interop: droce-nvmf did not start ($log):" >&2
  tail -n 20 "$log" >&2
  return 1
}
# stop_nvmf: SIGTERM to droce-nvmf (it disconnects the hosts, prints its counters, exits 0).
# Returns its exit status (0 when none ran).
stop_nvmf() {
  [ -n "${NVMF_PID:-}" ] || return 0
  local child i rc
  child=$(pgrep -P "$NVMF_PID" | head -1)  # timeout's child: afpacket-run exec'd droce-nvmf
  kill -TERM "${child:-$NVMF_PID}" 2>/dev/null
  for i in $(seq 1 150); do kill -0 "$NVMF_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$NVMF_PID" 2>/dev/null
  wait "$NVMF_PID" 2>/dev/null
  rc=$?
  NVMF_PID=
  return $rc
}
# nvmf_guest SECONDS STEP [ARGS]: one step of interop-nvmf-guest.sh in the guest, its output
# appended to $NVMF_GLOG.
nvmf_guest() {
  local t=$1
  shift
  echo "-- $*" >>"$NVMF_GLOG"
  rx $((t + 30)) exec "$G1" --timeout "$t" -- sh "$NVMF_GUEST" "$1" "$DROCE_IP" "$NVMF_NQN" "${@:2}" >>"$NVMF_GLOG" 2>&1
}
# run_nvmf TEST DIR MTU LOSS (DIR is r2d: the guest is the host; MTU: the veth's, as CUR_MTU)
#   TEST io: discover + connect, fio randwrite 32 MiB (4 KiB, QD 16) with crc32c verify, a read
#            verify pass, mkfs.ext4 + mount + copy + sha256, nvme disconnect, reconnect, read
#            back and compare, disconnect; the kernel log must have no NVMe error.
#        randread: connect, fio 4 KiB randread 10 s at QD 1 and QD 32 (one row each), disconnect.
#   LOSS: 0 | droce:P | droce-rx:P | droce-tx:P
#   HOSTOPTS (optional): nvme-rdma module parameters for the guest's host, e.g. register_always=N
# Captured: the connect/discover and the file system phases (every frame droce sent checked as
# elsewhere); the fio phases are left out (hundreds of MB: the checks would outlast the run).
run_nvmf() {
  local test=$1 loss=$4 hostopts=${5:-} mtu
  mtu=$([ "$CUR_MTU" -gt 1500 ] && echo 4096 || echo 1024)
  local tag="nvmf-$test-r2d-${loss//[:.]/_}${hostopts:+-${hostopts//[ =]/_}}"
  local dlog="$OUT/$tag.droce.log"
  NVMF_GLOG="$OUT/$tag.guest.log"
  : >"$NVMF_GLOG"
  local tmo=300
  [ "$loss" = 0 ] || tmo=600
  tmo=${INTEROP_NVMF_TMO:-$tmo}
  echo "== NVMe-oF $test loss $loss: guest nvme-rdma${hostopts:+ ($hostopts)} -> droce-nvmf $DROCE_IP:4420 ($NVMF_NQN)"
  local note="" step n=0 bad=0 mal=0 ttl=0 fig=""
  nvmf_dmesg_clear "$G1"  # the kernel log checked after the case is this case's
  start_nvmf "$loss" "$dlog" || note="droce-nvmf did not start"
  # phase PCAPSUFFIX STEP...: runs guest steps under one capture, stops at the first failure
  phase() {
    local pc=$1 a b c d
    shift
    [ -z "$note" ] || return 1
    [ "$pc" = - ] || capture_start "$OUT/$tag-$pc.pcap"
    for step in "$@"; do
      # shellcheck disable=SC2086
      nvmf_guest "$tmo" $step || { note="guest step '$step' failed"; break; }
    done
    if [ "$pc" != - ]; then
      capture_stop
      IFS=/ read -r a b c d <<<"$(check_capture "$OUT/$tag-$pc.pcap" "$DROCE_MAC")"
      n=$((n + ${a:-0})); [ "$b" = 0 ] || bad=$b; [ "$c" = 0 ] || mal=$c; [ "$d" = 0 ] || ttl=$d
    fi
    [ -z "$note" ]
  }
  if [ "$test" = io ]; then
    phase connect "connect $hostopts"
    phase - io
    phase fs fs reread disconnect dmesg
    local wr rd
    wr=$(sed -n 's/^fio randwrite-verify: .* write \([0-9]*\) IOPS.*/\1/p' "$NVMF_GLOG" | tail -1)
    rd=$(sed -n 's/^fio read-verify: .* read \([0-9]*\) IOPS.*/\1/p' "$NVMF_GLOG" | tail -1)
    fig="${hostopts:+[host $hostopts] }fio randwrite ${wr:-?} IOPS, verify read ${rd:-?} IOPS; ext4 sha256 $(grep -q 'reconnected: sha256' "$NVMF_GLOG" && echo "ok after reconnect" || echo "?")"
  else
    phase connect "connect $hostopts"
    phase - "randread 1 10" "randread 32 10"
    phase - disconnect
  fi
  [ -z "$note" ] || nvmf_guest 60 disconnect >/dev/null 2>&1
  stop_nvmf || note="${note:-droce-nvmf did not exit 0 on SIGTERM}"
  grep -q "^droce-nvmf: connect requests" "$dlog" || note="${note:-droce-nvmf printed no counters}"
  local qerr
  qerr=$(awk '/^droce-nvmf: queue/ { for (i = 1; i <= NF; i++) if ($i ~ /^(short|overflow|bad_completions|recv_errors|post_errors|wc_errors)$/ && $(i + 1) != 0) print $i "=" $(i + 1) }' "$dlog" | sort | uniq -c | tr -s ' \n' ' ')
  [ -z "$qerr" ] || [ "$loss" != 0 ] || note="${note:-droce-nvmf queue counters: $qerr}"
  local kerr
  kerr=$(nvmf_dmesg_errors "$G1")
  if [ -n "$kerr" ]; then
    printf '%s\n' "$kerr" >"$OUT/$tag.dmesg-errors"
    note="${note:-NVMe errors in the kernel log of $G1: $(printf '%s' "$kerr" | head -n 1)}"
  fi
  # A failed case keeps the guest's whole kernel log (the error filter above leaves out lines
  # such as nvme-rdma's "got bad command_id" or rxe's "not free"), its rxe counters and its
  # NIC's packet counts next to what its tap on the host received (a virtio-net TX stall:
  # the guest counts frames sent that the tap never got), before run_case may reboot the
  # guest: $tag.dmesg, through the harness's 9p channel (no network needed).
  if [ -n "$note" ]; then
    rx 40 exec "$G1" --timeout 30 -- sh -c 'dmesg; echo "-- rxe0 counters";
      grep -H . /sys/class/infiniband/rxe0/ports/1/hw_counters/* 2>/dev/null; echo "-- guest eth0";
      ip -s link show eth0; tc -s qdisc show dev eth0; ip neigh show dev eth0' >"$OUT/$tag.dmesg" 2>&1
    { echo "-- host side: the guest's tap (its RX = frames the guest sent)"; ip -n "$NS" -s link show "rxt-$G1"; } >>"$OUT/$tag.dmesg" 2>&1
  fi
  local res=PASS
  if [ -n "$note" ] || [ "$bad" != 0 ] || [ "$mal" != 0 ] || [ "$ttl" != 0 ] || [ "$n" -eq 0 ]; then
    res=FAIL
    FAILS=$((FAILS + 1))
    echo "   FAILED (${note:-capture check}; droce frames $n, bad ICRC $bad, malformed $mal, TTL not 64 $ttl)"
    grep -v "^EAL\|^TELEMETRY" "$dlog" | tail -n 8 | sed 's/^/   droce: /'
    tail -n 12 "$NVMF_GLOG" | sed 's/^/   guest: /'
  fi
  local check="droce frames $n icrc-bad $bad malformed $mal ttl!=64 $ttl${qerr:+ ($qerr)}"
  if [ "$test" = io ]; then
    row nvme_io nvmf r2d "$mtu" "$loss" 32M "$res" "$fig" "$check"
  else
    local qd iops
    for qd in 1 32; do
      iops=$(sed -n "s/^fio randread-qd$qd: .* read \\([0-9]*\\) IOPS.*/\\1/p" "$NVMF_GLOG" | tail -1)
      row "randread_4k_qd$qd" nvmf r2d "$mtu" "$loss" 4096 "$res" "${iops:-?} IOPS (fio 10 s, droce-nvmf RAM)" "$check"
    done
  fi
  [ $res = PASS ]
}

# The guest's virtio-net TX can stall for good under TCG after long bursts (seen at 64 KiB
# pingpongs: the guest's qdisc counts packets its tap never receives; ping gets no answer).
guest_ok() {
  local i
  for i in 1 2 3; do ip netns exec "$NS" ping -c 1 -W 2 "$G1_IP" >/dev/null 2>&1 && return 0; done
  return 1
}
# run_case FUNC TEST DIR MTU ...: FUNC (run_shim or run_embed); if it failed and the guest
# stopped answering, reboot it and run again once; the row says so. A failure with a healthy
# guest stays a failure.
run_case() {
  local f=$1
  shift
  [[ -z "${INTEROP_ONLY:-}" || "$1" == $INTEROP_ONLY ]] || return 0
  [[ -z "${INTEROP_MTU:-}" || "$3" == "$INTEROP_MTU" ]] || return 0
  [[ -z "${INTEROP_SKIP:-}" || "$1:$3:$4:${5:-}" != $INTEROP_SKIP ]] || return 0
  if ! guest_ok; then
    echo "== guest $G1 does not answer ping: rebooting it"
    boot_guest "$G1" "$G1_IP" "$CUR_MTU"
  fi
  $f "$@" && return 0
  guest_ok && return 1
  echo "   guest $G1 stopped answering (virtio-net TX stall under TCG): reboot, run again once"
  unset 'ROWS[-1]'
  FAILS=$((FAILS - 1))
  RETRIES=$((RETRIES + 1))
  boot_guest "$G1" "$G1_IP" "$CUR_MTU"
  $f "$@"
  local rc=$?
  ROWS[-1]="${ROWS[-1]} [retried after a guest reboot]"
  return $rc
}
shim() { run_case run_shim "$@"; }
cm() { run_case run_cm "$1" "$2" "$([ "$CUR_MTU" -gt 1500 ] && echo 4096 || echo 1024)" "${@:3}"; }  # cm TEST DIR LOSS ITERS
cm_both() { cm "$1" d2r "${@:2}"; cm "$1" r2d "${@:2}"; }
mckey_both() {  # mckey_both LOSS ITERS
  local m
  m=$([ "$CUR_MTU" -gt 1500 ] && echo 4096 || echo 1024)
  run_case run_mckey mckey d2r "$m" "$@"
  run_case run_mckey mckey r2d "$m" "$@"
}
embed() { run_case run_embed "$@"; }
nvmf() { run_case run_nvmf "$1" r2d "$CUR_MTU" "$2" "${3:-}"; }  # nvmf TEST LOSS [HOSTOPTS]
both() { shim "$1" d2r "${@:2}"; shim "$1" r2d "${@:2}"; }  # both TEST MTU LOSS SIZE ITERS [ARGS]

# ---- NVMe over Fabrics, the reverse: droce's initiator against the guest kernel's target ----
# nvmet_up: the kernel's NVMe-oF target in G1 (nvmet-rdma on rxe0 at $G1_IP:4420, one
# memory-backed null_blk namespace, any host; lib/nvmet-setup.sh), once per guest boot.
NVMET_UP=
nvmet_up() {
  [ "$NVMET_UP" = "$G1:$GUEST_BOOTS" ] && return 0
  rx 90 exec "$G1" --timeout 80 -- bash "$NVMETSETUP" up "$NVMF_HNQN" "$G1_IP" 4420 >"$OUT/nvmet-setup.log" 2>&1 || {
    echo "interop: nvmet-setup.sh failed in $G1:" >&2
    sed 's/^/   /' "$OUT/nvmet-setup.log" >&2
    return 1
  }
  NVMET_UP="$G1:$GUEST_BOOTS"
}
# run_nvmf_host NAME SECONDS ARGS...: droce-nvmf-perf (embedded droce on dpdk0 in the namespace,
# $DROCE_IP) against nvmet-rdma in G1, droced and droce-nvmf stopped meanwhile (all own dpdk0).
# PASS: exit 0 (no I/O error; with --verify every block read back as written), every RoCEv2
# packet droce sent checks clean, no NVMe error in the guest's kernel log.
run_nvmf_host() {
  local name=$1 secs=$2
  shift 2
  stop_droced
  stop_nvmf
  local tag="nvmfhost-$name-d2r" res=PASS note=
  local pcap="$OUT/$tag.pcap" dlog="$OUT/$tag.droce.log"
  echo "== droce-nvmf-perf $name -> guest kernel nvmet-rdma $G1_IP:4420 ($*)"
  nvmet_up || note="nvmet-setup.sh failed"
  rx 30 exec "$G1" --timeout 20 -- dmesg -C >/dev/null 2>&1
  local drc=1 n=0 bad=0 mal=0 ttl=0 fig=
  if [ -z "$note" ]; then
    capture_start "$pcap"
    ip netns exec "$NS" timeout -k 5 $((secs + 120)) "$AFP_RUN" "$IFACE" "$NVMF_PERF_TOOL" --device "net_af_packet0,iface=$IFACE" \
      --ip "$DROCE_IP" --mac "$DROCE_MAC" -a "$G1_IP" -n "$NVMF_HNQN" -t "$secs" --timeout 30000 "$@" >"$dlog" 2>&1
    drc=$?
    capture_stop
    IFS=/ read -r n bad mal ttl <<<"$(check_capture "$pcap" "$DROCE_MAC")"
    fig=$(sed -n 's/^  IOPS \([0-9.]*\) .*p50 \([0-9.]*\) p99 \([0-9.]*\) p99.9 \([0-9.]*\) .*/\1 IOPS p50 \2 p99 \3 p99.9 \4 us/p' "$dlog" | tail -1)
    grep -q "^verify: " "$dlog" && fig="$(sed -n 's/^verify: \([0-9]*\) blocks checked, \([0-9]*\) mismatches/\1 blocks verified, \2 bad/p' "$dlog"); $fig"
    grep -q "^discovery log" "$dlog" && fig=$(sed -n 's/^\(discovery log\) of .*: \([0-9]*\) entries/\1: \2 entries/p' "$dlog")
    [ "$drc" -eq 0 ] || note="droce-nvmf-perf exit $drc"
    [ "$bad" = 0 ] && [ "$mal" = 0 ] && [ "$ttl" = 0 ] && [ "$n" -gt 0 ] || note="${note:-capture check}"
    local kerr
    kerr=$(rx 30 exec "$G1" --timeout 20 -- bash -c 'dmesg | grep -iE "nvmet.*(error|fail|timeout)" | head -n 3' 2>/dev/null)
    [ -z "$kerr" ] || note="${note:-guest kernel log: $kerr}"
  fi
  if [ -n "$note" ]; then
    res=FAIL
    FAILS=$((FAILS + 1))
    echo "   FAILED: $note (droce frames $n, bad ICRC $bad, malformed $mal, TTL not 64 $ttl)"
    [ -f "$dlog" ] && grep -v "^EAL\|^TELEMETRY" "$dlog" | tail -n 8 | sed 's/^/   droce: /'
  fi
  row "nvmf_host_$name" perf d2r 1024 0 4096 "$res" "${fig:-?}" "droce frames $n icrc-bad $bad malformed $mal ttl!=64 $ttl"
  [ $res = PASS ]
}
nvmf_host() { run_case run_nvmf_host "$@"; }  # nvmf_host NAME SECONDS ARGS...

# ---- NVMe over Fabrics performance (issue 11, --nvmf-perf) ----
# One Linux host (G1: nvme-rdma over rxe0) runs the same fio job against two targets: the Linux
# kernel's own (G2: nvmet-rdma over rxe0, a memory-backed null_blk namespace, lib/nvmet-setup.sh) and droce-nvmf
# (a RAM namespace, on dpdk0 at $DROCE_IP). Both at queue depth 1 and 32; the table puts them side
# by side with droce/kernel. Each guest's kernel log is checked for NVMe errors after each target.
NVMF_PORT=4420
NVMF_KNQN=nqn.2026-12.org.droce:interop-kernel-ram
NVMETSETUP=$GUEST_TREE/test/interop/rxe-peer/lib/nvmet-setup.sh
NVMF_FIO=(--name=randread --rw=randread --bs=4k --ioengine=libaio --direct=1 --runtime=10 --time_based
          --lat_percentiles=1 --output-format=json)
PERF_ROWS=()
declare -A NVMF_IOPS=()

# nvmf_connect ADDR NQN [NVME CONNECT OPTIONS]: connects G1 (bounded) and prints the namespace's
# block device.
nvmf_connect() {
  rx 90 exec "$G1" --timeout 60 -- bash -c '
    modprobe nvme-rdma || exit 3
    timeout 40 nvme connect -t rdma -a "$1" -s "$3" -n "$2" "${@:4}" >/dev/null || exit 4
    for i in $(seq 1 200); do   # the namespace'"'"'s block device: its subsystem is NQN (multipath head)
      for b in /sys/block/nvme*n*; do
        n=${b##*/}
        [[ $n == nvme*c*n* ]] && continue   # a hidden path of the multipath head
        [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$2" ] && [ -b "/dev/$n" ] && { echo "/dev/$n"; exit 0; }
      done
      sleep 0.1
    done
    echo "no block device of $2 after 20 s" >&2; exit 5' _ "$1" "$2" "$NVMF_PORT" "${@:3}"
}
# nvmf_ctrl_wait NQN STATE|!STATE SECONDS: waits (bounded) in G1 until the controller of NQN is in
# STATE (or, with !, in any other state or gone); prints the state it ended in; 1 on timeout.
nvmf_ctrl_wait() {
  rx $(($3 + 30)) exec "$G1" --timeout $(($3 + 10)) -- bash -c '
    st() { for c in /sys/class/nvme/nvme*; do
             [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] && { cat "$c/state"; return; }; done; echo gone; }
    for i in $(seq 1 $(($3 * 5))); do
      s=$(st "$1")
      if [[ $2 == !* ]]; then [ "$s" != "${2#!}" ] && { echo "$s"; exit 0; }; else [ "$s" = "$2" ] && { echo "$s"; exit 0; }; fi
      sleep 0.2
    done
    echo "$s"; exit 1' _ "$1" "$2" "$3"
}
nvmf_disconnect() {  # nvmf_disconnect NQN
  rx 60 exec "$G1" --timeout 40 -- timeout 30 nvme disconnect -n "$1"
}
# nvmf_dmesg_clear GUEST / nvmf_dmesg_errors GUEST: the NVMe errors in GUEST's kernel log since
# the last clear (I/O timeouts, resets, reconnects, failed commands, block I/O errors).
nvmf_dmesg_clear() { rx 30 exec "$1" --timeout 20 -- dmesg -C >/dev/null 2>&1; }
nvmf_dmesg_errors() {
  rx 30 exec "$1" --timeout 20 -- dmesg 2>/dev/null |
    grep -iE 'nvme.*(error|fail|timeout|timed out|abort|reset|reconnect|invalid|unexpected)|nvmet.*(error|fail)|I/O error|blk_update_request|critical'
}

# nvmf_fio TARGET DEV QD: fio in G1; one PERF_ROWS line (IOPS, p50/p99 of the total latency).
nvmf_fio() {
  local target=$1 dev=$2 qd=$3 json=$OUT/nvmf-perf-$1-qd$3.json fig rc
  echo "== fio 4 KiB randread $target QD $qd 10 s"
  rx 120 exec "$G1" --timeout 90 -- timeout 80 fio "${NVMF_FIO[@]}" --filename="$dev" --iodepth="$qd" >"$json" 2>"$json.err"
  rc=$?
  fig=$(python3 - "$json" <<'PY' 2>/dev/null
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])
r = j["jobs"][0]["read"]
p = (r.get("lat_ns") or {}).get("percentile") or r["clat_ns"]["percentile"]
print("%.0f %.0f %.0f %d" % (r["iops"], p["50.000000"] / 1e3, p["99.000000"] / 1e3, j["jobs"][0]["error"]))
PY
)
  local iops p50 p99 err res=PASS ratio="" kiops
  read -r iops p50 p99 err <<<"$fig"
  if [ "$rc" -ne 0 ] || [ -z "$iops" ] || [ "${err:-1}" != 0 ] || [ "$iops" -le 0 ]; then
    res=FAIL iops=${iops:-?} p50=${p50:-?} p99=${p99:-?}
    echo "   fio failed (rc $rc, see $json and $json.err)"; tail -n 5 "$json.err" | sed 's/^/   fio: /'
  fi
  NVMF_IOPS[$target-$qd]=$iops
  kiops=${NVMF_IOPS[kernel-$qd]:-}
  if [ "$target" != kernel ] && [[ $kiops =~ ^[0-9]+$ && $iops =~ ^[0-9]+$ ]] && [ "$kiops" -gt 0 ]; then
    ratio=$(awk -v a="$iops" -v b="$kiops" 'BEGIN { printf "%.2f", a / b }')
    # The issue's requirement: the same fio run does at least as well against droce-nvmf.
    [ "$iops" -lt "$kiops" ] && { res=FAIL; echo "   droce-nvmf below the kernel target ($iops < $kiops IOPS)"; }
  fi
  [ $res = PASS ] || FAILS=$((FAILS + 1))
  PERF_ROWS+=("$(printf '%-30s %-4s %-8s %-10s %-10s %-12s %s' "$4" "$qd" "$iops" "$p50" "$p99" "${ratio:--}" "$res")")
  echo "   ${PERF_ROWS[-1]}"
}

# nvmf_perf_target TARGET LABEL ADDR NQN: connect G1, fio at QD 1 and 32, disconnect, NVMe errors
# in the guests' logs (G1, and G2 for the kernel target) fail the target's last row.
nvmf_perf_target() {
  local target=$1 label=$2 addr=$3 nqn=$4 dev qd errs g
  nvmf_dmesg_clear "$G1"
  [ "$target" = kernel ] && nvmf_dmesg_clear "$G2"
  echo "== nvme connect -t rdma -a $addr -n $nqn ($label)"
  if ! dev=$(nvmf_connect "$addr" "$nqn" 2>"$OUT/nvmf-perf-$target-connect.log"); then
    cat "$OUT/nvmf-perf-$target-connect.log" >&2
    for qd in 1 32; do
      FAILS=$((FAILS + 1))
      PERF_ROWS+=("$(printf '%-30s %-4s %-8s %-10s %-10s %-12s %s' "$label" "$qd" - - - - "FAIL (nvme connect)")")
    done
    return 1
  fi
  echo "   namespace: $dev"
  for qd in 1 32; do nvmf_fio "$target" "$dev" "$qd" "$label"; done
  nvmf_disconnect "$nqn" >"$OUT/nvmf-perf-$target-disconnect.log" 2>&1 ||
    { echo "   nvme disconnect failed"; PERF_ROWS[-1]="${PERF_ROWS[-1]/PASS/FAIL} (nvme disconnect)"; FAILS=$((FAILS + 1)); }
  for g in "$G1" $([ "$target" = kernel ] && echo "$G2"); do
    errs=$(nvmf_dmesg_errors "$g")
    if [ -n "$errs" ]; then
      echo "   NVMe errors in $g's kernel log:"; printf '%s\n' "$errs" | head -n 10 | sed 's/^/   /'
      printf '%s\n' "$errs" >"$OUT/nvmf-perf-$target-$g.dmesg-errors"
      PERF_ROWS[-1]="${PERF_ROWS[-1]/PASS/FAIL} (NVMe errors in $g's log)"
      FAILS=$((FAILS + 1))
    fi
  done
}

run_nvmf_perf() {
  boot_guest "$G2" "$G2_IP" 1500
  boot_guest "$G1" "$G1_IP" 1500
  echo "== $G2: kernel NVMe-oF target (nvmet-rdma, a memory-backed null_blk namespace)"
  if rx 90 exec "$G2" --timeout 60 -- bash "$NVMETSETUP" up "$NVMF_KNQN" "$G2_IP" "$NVMF_PORT" \
       >"$OUT/nvmf-perf-nvmet-setup.log" 2>&1; then
    sed 's/^/   /' "$OUT/nvmf-perf-nvmet-setup.log"
    nvmf_perf_target kernel "kernel nvmet-rdma ($G2)" "$G2_IP" "$NVMF_KNQN"
  else
    cat "$OUT/nvmf-perf-nvmet-setup.log" >&2
    FAILS=$((FAILS + 1))
    PERF_ROWS+=("kernel nvmet-rdma ($G2): FAIL (nvmet setup, see $OUT/nvmf-perf-nvmet-setup.log)")
  fi
  # G2 stays up (idle) through droce-nvmf's runs: the machine's load stays as it was.
  rx 60 exec "$G2" --timeout 40 -- bash "$NVMETSETUP" down >/dev/null 2>&1
  nvmf_perf_droce
}

# nvmf_perf_droce: droce-nvmf (a RAM namespace); the same fio runs from G1.
nvmf_perf_droce() {
  local label="droce-nvmf ($DROCE_IP)" qd log=$OUT/nvmf-perf-droce-nvmf.log nqn rc
  nqn=$(sed -n 's/^nqn *= *"\(.*\)".*/\1/p' "$NVMF_CFG" 2>/dev/null | head -n 1)
  local why=""
  if [ ! -x "$NVMF_TOOL" ] || [ -z "$nqn" ]; then why="droce-nvmf or $NVMF_CFG missing"
  else
    echo "== droce-nvmf on $IFACE ($DROCE_IP, $NVMF_CFG)"
    start_nvmf 0 "$log" || why="droce-nvmf did not start"
  fi
  if [ -n "$why" ]; then
    for qd in 1 32; do
      FAILS=$((FAILS + 1))
      PERF_ROWS+=("$(printf '%-30s %-4s %-8s %-10s %-10s %-12s %s' "$label" "$qd" - - - - "FAIL ($why)")")
    done
    return 1
  fi
  nvmf_perf_target droce "$label" "$DROCE_IP" "$nqn"
  stop_nvmf
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "   droce-nvmf exited with $rc after SIGTERM (see $log)"
    PERF_ROWS[-1]="${PERF_ROWS[-1]/PASS/FAIL} (droce-nvmf exit $rc)"
    FAILS=$((FAILS + 1))
  fi
  grep "^droce-nvmf: queue\|^droce-nvmf: connect" "$log" | sed 's/^/   /'
}

# nvmf_sigterm (--nvmf): droce-nvmf gets SIGTERM while G1 is connected (idle, --reconnect-delay=2, and a
# keep-alive timeout of 60 s so that only a disconnect from the target can end the connection
# early). droce-nvmf must exit 0 having sent its host a disconnect (its counters: "disconnects
# sent" >= 1, none left after its 5 s wait); the host must leave "live" within 20 s (it saw the
# disconnect: error recovery, reconnect attempts) instead of hanging on a dead target; once droce-nvmf is started
# again the host must be live again by itself within 60 s and read 64 KiB (O_DIRECT); nvme
# disconnect must return; G1's log may show the recovery (error recovery, reconnecting, failed
# attempts while the target is down, reconnected) and nothing else of NVMe's errors.
nvmf_sigterm() {
  local nqn=$NVMF_NQN res=PASS why=() dev st1 st2 rc sent t0 left back log1=$OUT/nvmf-sigterm-1.log log2=$OUT/nvmf-sigterm-2.log errs
  echo "== nvmf_sigterm: droce-nvmf gets SIGTERM while $G1 is connected"
  nvmf_dmesg_clear "$G1"
  if ! start_nvmf 0 "$log1"; then why+=("droce-nvmf did not start")
  elif ! dev=$(nvmf_connect "$DROCE_IP" "$nqn" --reconnect-delay=2 --ctrl-loss-tmo=120 --keep-alive-tmo=60 2>"$OUT/nvmf-sigterm-connect.log"); then
    why+=("nvme connect failed: $(tail -n 1 "$OUT/nvmf-sigterm-connect.log")")
    stop_nvmf
  else
    t0=$(date +%s)
    stop_nvmf
    rc=$?
    sent=$(sed -n 's/.*disconnects sent \([0-9]*\).*/\1/p' "$log1" | tail -n 1)
    [ "$rc" -eq 0 ] || why+=("droce-nvmf exit $rc")
    [ "${sent:-0}" -ge 1 ] || why+=("droce-nvmf sent no disconnect")
    grep -q "not disconnected" "$log1" && why+=("$(grep -m1 "not disconnected" "$log1")")
    st1=$(nvmf_ctrl_wait "$nqn" '!live' 20) || why+=("the host still sees the controller live 20 s after SIGTERM")
    left=$(($(date +%s) - t0))
    t0=$(date +%s)
    if start_nvmf 0 "$log2"; then
      if st2=$(nvmf_ctrl_wait "$nqn" live 60); then
        back=$(($(date +%s) - t0))
        rx 60 exec "$G1" --timeout 40 -- timeout 30 dd if="$dev" of=/dev/null bs=4k count=16 iflag=direct \
          >"$OUT/nvmf-sigterm-dd.log" 2>&1 || why+=("read after the reconnect failed")
      else
        why+=("the host did not reconnect within 60 s (state $st2)")
      fi
    else
      why+=("droce-nvmf did not start again")
    fi
    nvmf_disconnect "$nqn" >"$OUT/nvmf-sigterm-disconnect.log" 2>&1 || why+=("nvme disconnect failed")
    stop_nvmf || why+=("droce-nvmf (second) exit $?")
  fi
  errs=$(nvmf_dmesg_errors "$G1" | grep -vE 'starting error recovery|Reconnecting in [0-9]+ seconds|Successfully reconnected|Failed reconnect attempt|rdma connection establishment failed|rdma_resolve_addr wait failed|address resolved failed|Connect rejected')
  if [ -n "$errs" ]; then
    why+=("NVMe errors in $G1's log")
    printf '%s\n' "$errs" >"$OUT/nvmf-sigterm-$G1.dmesg-errors"
    printf '%s\n' "$errs" | head -n 10 | sed 's/^/   /'
  fi
  if ((${#why[@]})); then res=FAIL; FAILS=$((FAILS + 1)); printf '   FAILED: %s\n' "${why[@]}"; fi
  row nvmf_sigterm nvmf r2d 1024 0 - "$res" "host ${st1:-?} ${left:-?} s after SIGTERM, live again ${back:-?} s after restart" \
    "droce-nvmf exit ${rc:-?}, disconnects sent ${sent:-?}"
  [ $res = PASS ]
}

# print_nvmf_perf: the NVMe-oF table (PERF_ROWS).
print_nvmf_perf() {
  ((${#PERF_ROWS[@]})) || return 0
  echo
  echo "NVMe-oF, the same fio job from host $G1 (Linux nvme-rdma over rxe0) to each target: ${NVMF_FIO[*]:1:4} --time_based --runtime=10;"
  echo "latency: fio's total (submission to completion, lat_percentiles), us; droce/kernel: IOPS ratio"
  printf '%-30s %-4s %-8s %-10s %-10s %-12s %s\n' target QD IOPS "p50 us" "p99 us" droce/kernel result
  for r in "${PERF_ROWS[@]}"; do echo "$r"; done
}
if [ $mode = nvmf_perf ]; then
  t_start=$(date +%s)
  run_nvmf_perf
  echo
  echo "interop results (--nvmf-perf, $(( ($(date +%s) - t_start) / 60 )) min; droce-nvmf $DROCE_IP on $IFACE, kernel target $G2 $G2_IP, host $G1 $G1_IP; logs in $OUT)"
  print_nvmf_perf
  if ((${#ROWS[@]})); then
    printf '%-27s %-5s %-11s %-5s %-10s %-7s %-5s %s\n' test via direction MTU loss/mode size result "figures | checks"
    for r in "${ROWS[@]}"; do echo "$r"; done
  fi
  echo "$((${#PERF_ROWS[@]} + ${#ROWS[@]})) runs, $FAILS failed"
  [ "$FAILS" -eq 0 ]
  exit
fi

t_start=$(date +%s)
boot_guest "$G1" "$G1_IP" 1500
[ $mode = nvmf ] || start_droced 1500
# The RDMA CM runs: cm TEST DIR LOSS ITERS (run_cm). cm_ci: the part --ci runs (RC with data
# checked, UD through SIDR, perftest over the CM, a REJ), both ways.
cm_ci() {
  cm_both rping 0 10
  cm_both udaddy 0 10
  mckey_both 0 10
  # ib_send_bw -R makes a second connection after the exchange; the rxe server (slow under
  # TCG) may not listen again yet: REJ 8, and perftest 4.5's client then retries with the
  # CM ids it freed (SIGBUS, 1 in ~10 CI runs). d2r stays in --cm; CI keeps r2d.
  cm send_bw r2d 0 20
  cm_both fio_send 0 1
  cm_both rej 0 1
}
cm_all() {
  cm_both rping 0 10
  cm_both ucmatose 0 10
  cm_both udaddy 0 10
  mckey_both 0 10
  cm_both rdma_server 0 1
  cm_both cmtime 0 10
  cm_both write_bw 0 20
  cm_both read_lat 0 20
  cm_both send_bw 0 20
  cm_both send_bw_ud 0 20
  cm_both fio_send 0 1
  cm_both fio_write 0 1
  cm_both fio_read 0 1
  cm_both qperf_rc_bw 0 1   # r2d: qperf's TCP to droce's address through qperf_kernel_share
  cm_both qperf_rc_lat 0 1
  cm_both rping droce:0.01 50
  cm_both rping rxe:1 50
  cm_both rej 0 1
  cm_both rping_kill 0 1
}
# The NVMe-oF runs (run_nvmf): nvmf_ci is the part --ci runs.
nvmf_ci() {
  nvmf io 0
  nvmf_host verify 1 --verify --verify-ios 256 -q 8 -o 4096
  nvmf_host randread_qd1 3 -w randread -q 1 -o 4096
  nvmf_host randwrite_qd32 3 -w randwrite -q 32 -o 4096
}
nvmf_all() {
  nvmf io 0
  nvmf io droce:0.01 register_always=N  # rxe 6.1 re-runs done REG_MRs on retry: lib/nvmf/README.md
  nvmf randread 0
  run_case nvmf_sigterm sigterm r2d "$CUR_MTU" 0
  nvmf_host verify 1 --verify --verify-ios 2048 -q 32 -o 4096
  nvmf_host verify_128k 1 --verify --verify-ios 128 -q 4 -o 131072
  nvmf_host discover 1 --discover
  for w in randread randwrite; do
    for q in 1 32; do nvmf_host "${w}_qd$q" 10 -w "$w" -q "$q" -o 4096; done
  done
}
if [ $mode = cm ]; then
  cm_all
elif [ $mode = nvmf ]; then
  if [ -n "${INTEROP_NVMF_CASES:-}" ]; then  # "TEST LOSS [HOSTOPTS];..." instead of nvmf_all
    IFS=';' read -ra nvmf_cases <<<"$INTEROP_NVMF_CASES"
    # shellcheck disable=SC2086
    for c in "${nvmf_cases[@]}"; do nvmf $c; done
  else
    nvmf_all
  fi
elif [ $mode = ci ]; then
  [ $CM_IN_CI = 1 ] && cm_ci
  both rc_pingpong 1024 0 4096 50
  both uc_pingpong 1024 0 4096 50
  both ud_pingpong 1024 0 512 50
  both srq_pingpong 1024 0 4096 5
  both write_bw 1024 0 65536 20
  both send_bw 1024 0 65536 20
  both read_bw 1024 0 65536 20
  both atomic_bw 1024 0 8 50
  both write_lat 1024 0 2 50
  both send_lat 1024 0 4096 50
  both read_lat 1024 0 2 50
  both atomic_lat 1024 0 8 50
  shim write_bw d2r 1024 droce:0.01 65536 20
  shim write_bw r2d 1024 rxe:1 65536 20
  shim rc_pingpong d2r 1024 ipv6 4096 20
  shim rc_pingpong r2d 1024 ipv6 4096 20
  embed rc_pingpong d2r 1024 rnr:5 4096 50
  embed rc_pingpong r2d 1024 rnr:5 4096 50
  [ $NVMF_IN_CI = 1 ] && nvmf_ci
else
  [ $CM_IN_FULL = 1 ] && cm_all
  for mtu in 1024 4096; do
    if [ $mtu = 4096 ]; then
      [[ -z "${INTEROP_MTU:-}" || "$INTEROP_MTU" == 4096 ]] || continue
      boot_guest "$G1" "$G1_IP" 9000
      start_droced 9000
    else
      [[ -z "${INTEROP_MTU:-}" || "$INTEROP_MTU" == 1024 ]] || continue
    fi
    for s in 2 4096 65536 1048576; do
      both rc_pingpong $mtu 0 $s $([ $s -gt 65536 ] && echo 5 || echo 100)
    done
    # srq_pingpong's 16 QPs each send their message at once: at 1 MiB that is 16 MiB towards
    # a TCG rxe taking ~5,000-10,000 packets/s, which drops what overflows its backlog; droce's
    # congestion window (README finding 13) backs off instead of resending whole windows.
    for s in 2 4096 65536 1048576; do both srq_pingpong $mtu 0 $s $([ $s -gt 65536 ] && echo 2 || echo 10); done
    # UC has no recovery: one frame the TCG guest drops loses the message and stalls the pingpong.
    for s in 2 4096 16384; do both uc_pingpong $mtu 0 $s 100; done
    for s in 2 512 $mtu; do both ud_pingpong $mtu 0 $s 100; done
    for t in write_bw send_bw read_bw write_lat send_lat read_lat; do both $t $mtu 0 all 5; done
    both atomic_bw $mtu 0 8 200
    both atomic_lat $mtu 0 8 200
    # UC and UD have no recovery and UD no flow control: the senders are paced (perftest's
    # software rate limiter) below what the TCG guest's rxe takes in, so that nothing is
    # lost to an overrun receive queue (a lost SEND hangs the receiving side).
    local_pace=(--rate_limit_type=SW --rate_limit=300 --rate_units=p)
    both write_bw $mtu 0 65536 20 -c UC "${local_pace[@]}"
    both send_bw $mtu 0 16384 20 -c UC "${local_pace[@]}"
    both send_bw $mtu 0 $mtu 50 -c UD "${local_pace[@]}"
    both send_lat $mtu 0 $mtu 50 -c UD
    for l in droce:0.01 rxe:1; do
      both rc_pingpong $mtu $l 65536 50
      both write_bw $mtu $l 1048576 10
      both read_bw $mtu $l 1048576 10
      both send_bw $mtu $l 65536 50
      both atomic_bw $mtu $l 8 100
    done
    for t in rc_pingpong uc_pingpong ud_pingpong; do both $t $mtu ipv6 512 50; done
    both write_bw $mtu ipv6 65536 20
    embed rc_pingpong d2r $mtu rnr:5 65536 100
    embed rc_pingpong r2d $mtu rnr:20 4096 100
  done
fi
stop_droced

# One capture per direction as the artifact: every run's capture merged.
for d in d2r r2d; do
  name=$([ $d = d2r ] && echo droce-to-rxe || echo rxe-to-droce)
  files=$(ls "$OUT"/*-"$d"-*.pcap 2>/dev/null | grep -v '\.droce\.pcap$')
  [ -n "$files" ] && mergecap -F pcap -w "$OUT/interop-$name.pcap" $files 2>/dev/null
done

echo
echo "interop results ($mode, $(( ($(date +%s) - t_start) / 60 )) min; droce $DROCE_IP on $IFACE (droced + shim, or droce-interop = embed), rxe guest $G1 $G1_IP)"
echo "captures: $OUT/interop-droce-to-rxe.pcap, $OUT/interop-rxe-to-droce.pcap (and one per run)"
printf '%-27s %-5s %-11s %-5s %-10s %-7s %-5s %s\n' test via direction MTU loss/mode size result "figures droce-counters | capture check (droce's packets)"
for r in "${ROWS[@]}"; do echo "$r"; done
echo "${#ROWS[@]} runs, $FAILS failed, $RETRIES retried after a guest reboot"
[ "$FAILS" -eq 0 ]
exit
}

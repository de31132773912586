#!/usr/bin/env bash
# Checks a capture's CM traffic with Wireshark's dissector (tshark): every
# RoCEv2 frame to or from QP 1 must decode as a CM MAD (class 0x07, version 2)
# of a known attribute, and no frame may be malformed or carry an expert
# warning/error. Prints one line per CM attribute with its count.
#   check_cm_pcap.sh [--expect N] PCAP       N: the number of CM frames expected
#   check_cm_pcap.sh --generate CM_PCAP_EXE [--expect N]
#                                            writes cm_pcap's samples to a temporary file and checks them
# Exit status 0 when all is well, 1 on a finding, 2 on usage/tool errors.
set -uo pipefail
expect= pcap= gen=
while [ $# -gt 0 ]; do
  case $1 in
    --expect) expect=$2; shift 2 ;;
    --generate) gen=$2; shift 2 ;;
    -*) echo "usage: $0 [--expect N] PCAP | --generate CM_PCAP_EXE [--expect N]" >&2; exit 2 ;;
    *) pcap=$1; shift ;;
  esac
done
command -v tshark >/dev/null || { echo "check_cm_pcap: tshark is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
if [ -n "$gen" ]; then
  tmp=$(mktemp -d /tmp/droce-cm-check-XXXXXX) || exit 2
  trap 'rm -rf "$tmp"' EXIT
  pcap=$tmp/cm.pcap
  "$gen" "$pcap" || { echo "check_cm_pcap: $gen failed" >&2; exit 2; }
fi
[ -n "$pcap" ] && [ -r "$pcap" ] || { echo "check_cm_pcap: no readable capture" >&2; exit 2; }
ts() { timeout -k 5 300 tshark -r "$pcap" "$@" 2>/dev/null; }

fail=0
# Frames to/from QP 1 that are not CM MADs droce knows (REQ .. SIDR_REP: 0x10..0x18).
qp1="infiniband.bth.destqp == 1 || infiniband.deth.srcqp == 1"
notcm=$(ts -Y "($qp1) && !(infiniband.mad.mgmtclass == 0x07 && infiniband.mad.classversion == 2 && infiniband.mad.attributeid >= 0x10 && infiniband.mad.attributeid <= 0x18)" -T fields -e frame.number) || { echo "check_cm_pcap: tshark failed" >&2; exit 2; }
if [ -n "$notcm" ]; then
  echo "check_cm_pcap: QP1 frames that are not CM MADs: $(echo $notcm)"; fail=1
fi
bad=$(ts -Y "_ws.malformed || _ws.expert.severity >= warning" -T fields -e frame.number) || { echo "check_cm_pcap: tshark failed" >&2; exit 2; }
if [ -n "$bad" ]; then
  echo "check_cm_pcap: malformed or expert warnings in frames: $(echo $bad)"; fail=1
fi
ts -V | grep -q "Malformed" && { echo "check_cm_pcap: 'Malformed' in the verbose decode"; fail=1; }
attrs=$(ts -Y "infiniband.mad.mgmtclass == 0x07" -T fields -e infiniband.mad.attributeid)
n=$(printf '%s' "$attrs" | grep -c .)
printf '%s\n' "$attrs" | grep . | sort | uniq -c | while read -r c a; do
  case $a in
    0x0010) name=REQ ;; 0x0011) name=MRA ;; 0x0012) name=REJ ;; 0x0013) name=REP ;; 0x0014) name=RTU ;;
    0x0015) name=DREQ ;; 0x0016) name=DREP ;; 0x0017) name=SIDR_REQ ;; 0x0018) name=SIDR_REP ;; *) name=other ;;
  esac
  echo "  $name ($a): $c"
done
echo "check_cm_pcap: $n CM frames"
if [ -n "$expect" ] && [ "$n" != "$expect" ]; then
  echo "check_cm_pcap: expected $expect CM frames"; fail=1
fi
exit $fail

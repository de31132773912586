#!/usr/bin/env bash
# app/droce-embed-example across a veth pair in a namespace of its own.
set -euo pipefail
ex=$1
ns=droce-e-$$
cleanup() { ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT INT TERM
if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
ip -n "$ns" link add va type veth peer name vb
for d in va vb; do ip netns exec "$ns" sysctl -qw "net.ipv6.conf.$d.disable_ipv6=1"; ip -n "$ns" link set "$d" up; done
ip netns exec "$ns" timeout -k 5 60 "$ex" --target-device net_af_packet0,iface=vb --target-ip 10.40.0.2 \
  --initiator-device net_af_packet1,iface=va --initiator-ip 10.40.0.1 --blocks 32 --block-size 8192 -- \
  --lcores=0@0 --in-memory --no-pci --log-level=lib.eal:error --log-level=pmd.net.af_packet:error

#!/usr/bin/env bash
# Decodes every capture in test/data with Wireshark's own dissector (tshark) and
# writes the fields test/wire/test_golden.cc compares our parser against, one
# .fields.tsv per capture. Run again only when a capture is added or replaced.
set -euo pipefail
cd "$(dirname "$0")/../test/data"
fields=(frame.number infiniband.bth.opcode infiniband.bth.se infiniband.bth.m infiniband.bth.padcnt
  infiniband.bth.tver infiniband.bth.p_key infiniband.bth.destqp infiniband.bth.a infiniband.bth.psn
  infiniband.deth.q_key infiniband.deth.srcqp infiniband.reth.va infiniband.reth.r_key infiniband.reth.dmalen
  infiniband.atomiceth.swapdt infiniband.atomiceth.cmpdt infiniband.aeth.syndrome infiniband.aeth.msn
  infiniband.atomicacketh.origremdt infiniband.immdt infiniband.ieth udp.srcport)
args=()
for f in "${fields[@]}"; do args+=(-e "$f"); done
for p in *.pcap; do
  { printf '#'; printf '%s\t' "${fields[@]}"; printf '\n'
    tshark -r "$p" -T fields -E separator=/t "${args[@]}"; } > "${p%.pcap}.fields.tsv"
done

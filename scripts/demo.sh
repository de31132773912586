#!/usr/bin/env bash
# droce's demo. Today: builds droce and decodes the bundled captures of Linux
# Soft-RoCE traffic with droce's own parser, verifying every ICRC.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/setup.sh"
droce_install_packages
droce_hugepages
droce_build build --buildtype=release >/dev/null
cd "$DROCE_ROOT"
echo "== droce-pcap test/data/rxe-imm-inv.pcap (SEND/WRITE with immediate, SEND with invalidate, a NAK)"
build/app/droce-pcap test/data/rxe-imm-inv.pcap
echo
echo "== every bundled rxe capture"
build/app/droce-pcap -q test/data/*.pcap

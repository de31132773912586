#!/usr/bin/env bash
# Installs what droce needs on Debian 12 (idempotent), reserves hugepages with
# DPDK's own dpdk-hugepages.py and configures the builds. Sourced by demo.sh and
# test.sh; safe to run by itself. Sourcing it leaves the caller's shell
# options alone: test.sh must go on (and print its totals) after a failing suite.
#   scripts/setup.sh [--interop]   --interop: also what the rxe interop suite needs

DROCE_PACKAGES=(
  meson ninja-build pkg-config g++ clang libclang-rt-14-dev python3
  dpdk dpdk-dev libdpdk-dev libnuma-dev libibverbs-dev librdmacm-dev ibverbs-utils perftest rdmacm-utils qperf
  libspdlog-dev libfmt-dev catch2 libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libpcap-dev zlib1g-dev liburing-dev
  tshark iproute2 procps iputils-ping iputils-arping nvme-cli fio python3-pyverbs ucx-utils python3-matplotlib
)

droce_install_packages() {
  local missing=()
  for p in "${DROCE_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # tshark asks whether non-root users may capture; answer no.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# droce_install_interop: what scripts/interop.sh needs, through the in-tree
# harness's own setup (test/interop/rxe-peer): QEMU (qemu-system-x86), busybox,
# the RDMA user space the guests share, tshark (apt-get, idempotent), Debian's
# guest kernel (apt-get download, unpacked under /var/tmp/rxe-peer, never
# installed) and the guests' initramfs. Cached: a second run takes a second;
# the first ~20 s plus the downloads. Needs root.
droce_install_interop() {
  "$DROCE_ROOT/test/interop/rxe-peer/rxepeer" setup
}

droce_hugepages() {
  # 1 GiB of 2 MiB pages, mounted; DPDK's own tool does both.
  local have
  have=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
  if [ "${have:-0}" -lt 512 ] || ! grep -q hugetlbfs /proc/mounts; then
    mkdir -p /dev/hugepages  # dpdk-hugepages.py mounts here; some containers lack it
    dpdk-hugepages.py -p 2M --setup 1G || echo "setup: warning: could not reserve hugepages" >&2
  fi
}

# droce_build DIR [meson options...]: configure (once) and build.
droce_build() {
  local dir=$1
  shift
  if [ ! -f "$DROCE_ROOT/$dir/build.ninja" ]; then
    meson setup "$DROCE_ROOT/$dir" "$DROCE_ROOT" "$@" >/dev/null
  fi
  ninja -C "$DROCE_ROOT/$dir" ${DROCE_JOBS:+-j "$DROCE_JOBS"}
}

DROCE_ROOT=${DROCE_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  droce_install_packages
  [ "${1:-}" = "--interop" ] && droce_install_interop
  droce_hugepages
  droce_build build --buildtype=release
fi

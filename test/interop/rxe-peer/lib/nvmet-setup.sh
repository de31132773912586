#!/bin/bash
# Run INSIDE an rxe guest: configure the Linux kernel's NVMe-oF target
# (nvmet + nvmet-rdma) through configfs, with one RAM namespace.
#
#   nvmet-setup.sh up   NQN ADDR [PORT] [BACKING]   # BACKING: a block device path,
#                                                   # or "null" (default): null_blk, memory backed, 256 MiB
#   nvmet-setup.sh down [NQN]                       # remove what `up` made (all of it)
#   nvmet-setup.sh show                             # the configfs tree (ports, subsystems, namespaces)
#
# Any host may connect (attr_allow_any_host 1). The port is RDMA, IPv4, the
# given address (the guest's eth0 address, where rxe0 sits) and service id
# PORT (4420). Environment: NVMET_NULLB_MB (size of the null_blk disk, 256),
# NVMET_NULLB_BS (its block size, 512), NVMET_PORTID (1).
# Example from the host:
#   ./rxepeer exec g1 -- bash /path/to/lib/nvmet-setup.sh up nqn.2026-12.org.droce:kern0 10.77.0.1
set -u

die() { echo "nvmet-setup: $*" >&2; exit 1; }
CFS=/sys/kernel/config
NT=$CFS/nvmet
PORTID=${NVMET_PORTID:-1}

ensure_modules() {
	local m
	for m in configfs nvmet nvmet_rdma; do
		[ -d "/sys/module/$m" ] || modprobe "$m" || die "modprobe $m failed"
	done
	if ! mountpoint -q "$CFS"; then
		mount -t configfs none "$CFS" || die "cannot mount configfs on $CFS"
	fi
	[ -d "$NT" ] || die "$NT missing after loading nvmet"
}

# A memory-backed null_blk disk (data is kept: memory_backed=1), created
# through null_blk's configfs so its size and block size are ours.
make_nullb() {
	local d dev i mb=${NVMET_NULLB_MB:-256} bs=${NVMET_NULLB_BS:-512}
	if [ ! -d /sys/module/null_blk ]; then
		modprobe null_blk nr_devices=0 || die "modprobe null_blk failed"
	fi
	d=$CFS/nullb/nvmetnullb
	if [ ! -d "$d" ]; then
		mkdir "$d" || die "mkdir $d"
		echo "$mb" > "$d/size" || die "null_blk size"
		echo "$bs" > "$d/blocksize" || die "null_blk blocksize"
		echo 1 > "$d/memory_backed" || die "null_blk memory_backed"
		echo 1 > "$d/power" || die "null_blk power"
	fi
	# The disk is named after the configfs item (Linux >= 5.x), else nullbINDEX.
	for i in $(seq 50); do
		dev=/dev/nvmetnullb
		[ -b "$dev" ] && break
		dev=/dev/nullb$(cat "$d/index")
		[ -b "$dev" ] && break
		sleep 0.1
	done
	[ -b "$dev" ] || die "null_blk device $dev did not appear"
	echo "$dev"
}

up() {
	local nqn=${1:-} addr=${2:-} port=${3:-4420} back=${4:-null} dev s p
	[ -n "$nqn" ] && [ -n "$addr" ] || die "usage: up NQN ADDR [PORT] [BACKING]"
	ensure_modules
	if [ "$back" = null ]; then
		dev=$(make_nullb) || exit 1
	else
		dev=$back
		[ -b "$dev" ] || die "$dev is not a block device"
	fi
	s=$NT/subsystems/$nqn
	[ -d "$s" ] || mkdir "$s" || die "mkdir subsystem $nqn"
	echo 1 > "$s/attr_allow_any_host" || die "allow_any_host"
	[ -d "$s/namespaces/1" ] || mkdir "$s/namespaces/1" || die "mkdir namespace 1"
	if [ "$(cat "$s/namespaces/1/enable")" != 1 ]; then
		echo -n "$dev" > "$s/namespaces/1/device_path" || die "device_path $dev"
		echo 1 > "$s/namespaces/1/enable" || die "enabling namespace 1 ($dev)"
	fi
	p=$NT/ports/$PORTID
	if [ ! -d "$p" ]; then
		mkdir "$p" || die "mkdir port $PORTID"
		echo rdma > "$p/addr_trtype"
		echo ipv4 > "$p/addr_adrfam"
		echo "$addr" > "$p/addr_traddr"
		echo "$port" > "$p/addr_trsvcid" || die "port attributes"
	fi
	[ -e "$p/subsystems/$nqn" ] || ln -s "$s" "$p/subsystems/$nqn" ||
		die "linking $nqn to port $PORTID (is rxe0 up on $addr?)"
	echo "nvmet-setup: $nqn on rdma $addr:$port, namespace 1 = $dev ($(blockdev --getsize64 "$dev") bytes)"
}

down() {
	local p s n
	[ -d "$NT" ] || return 0
	for p in "$NT"/ports/*; do
		[ -d "$p" ] || continue
		for s in "$p"/subsystems/*; do [ -L "$s" ] && rm -f "$s"; done
		rmdir "$p"
	done
	for s in "$NT"/subsystems/*; do
		[ -d "$s" ] || continue
		for n in "$s"/namespaces/*; do
			[ -d "$n" ] || continue
			echo 0 > "$n/enable" 2> /dev/null
			rmdir "$n"
		done
		rmdir "$s"
	done
	if [ -d "$CFS/nullb/nvmetnullb" ]; then
		echo 0 > "$CFS/nullb/nvmetnullb/power" 2> /dev/null
		rmdir "$CFS/nullb/nvmetnullb"
	fi
	echo "nvmet-setup: removed"
}

show() {
	[ -d "$NT" ] || die "nvmet not loaded"
	find "$NT" -maxdepth 5 \( -name 'addr_*' -o -name device_path -o -name enable \) -print \
		-exec cat {} \; 2> /dev/null
	ls -l "$NT"/ports/*/subsystems/ 2> /dev/null
}

case ${1:-} in
up) shift; up "$@" ;;
down) shift; down ;;
show) show ;;
*) die "usage: $0 up NQN ADDR [PORT] [BACKING] | down | show" ;;
esac

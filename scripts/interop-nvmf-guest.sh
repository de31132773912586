#!/bin/sh
# Guest side of scripts/interop.sh --nvmf: the Linux kernel's nvme-rdma host
# against droce-nvmf. Runs inside an rxe guest (rxepeer exec), POSIX sh.
#   interop-nvmf-guest.sh STEP ADDR NQN
# STEP: connect [MODOPTS] (modprobe nvme-rdma [with MODOPTS, e.g. register_always=N: reloaded
#               when its parameters differ], discover, connect, wait for the namespace)
#       io      (fio randwrite with crc32c verify, then a separate read verify pass)
#       fs      (mkfs.ext4, mount, copy a file, compare sha256, umount)
#       reread  (disconnect, reconnect, mount read only, compare sha256, umount)
#       randread QD SECONDS (fio 4 KiB random read, prints "IOPS=N")
#       disconnect
#       dmesg   (fails when the kernel log has NVMe errors)
# Prints what it does; exit status 0 when the step passed.
set -u
step=$1 addr=$2 nqn=$3
work=/tmp/nvmf-interop
mkdir -p $work
dev() {  # the block device of $nqn (empty when none)
  for c in /sys/class/nvme/nvme*; do
    [ -e "$c/subsysnqn" ] || continue
    [ "$(cat "$c/subsysnqn")" = "$nqn" ] || continue
    for n in "$c"/nvme*n*; do
      [ -e "$n" ] || continue
      n=$(basename "$n")
      # a multipath-capable subsystem (CMIC, e.g. the kernel's nvmet): nvmeXcYnZ is hidden, nvmeXnZ is the disk
      [ -b "/dev/$n" ] || n=$(echo "$n" | sed 's/c[0-9]*n/n/')
      echo "/dev/$n"
      return
    done
  done
}
wait_dev() {  # up to 30 s
  i=0
  while [ $i -lt 60 ]; do d=$(dev); [ -n "$d" ] && [ -b "$d" ] && { echo "$d"; return 0; }; sleep 0.5; i=$((i + 1)); done
  return 1
}
connect() {
  nvme connect -t rdma -n "$nqn" -a "$addr" -s 4420 || return 1
  d=$(wait_dev) || { echo "no namespace of $nqn appeared"; return 1; }
  echo "namespace $d ($(cat /sys/block/$(basename $d)/size) sectors)"
}
fio_terse() {  # fio ARGS...: prints its figures (terse v3 fields); fails on any error
  fio --minimal "$@" >$work/fio.out 2>$work/fio.err
  rc=$?
  tail -n 3 $work/fio.err
  line=$(grep '^3;' $work/fio.out | tail -n 1)
  [ -n "$line" ] || { echo "fio printed no result (rc $rc)"; cat $work/fio.out | tail -n 5; return 1; }
  # 3 jobname, 5 error, 8 read IOPS, 16 read clat mean (us), 24 read clat p50, 49 write IOPS
  echo "$line" | awk -F';' '{ split($24, p, "="); printf "fio %s: error=%s read %s IOPS (clat mean %.0f us, p50 %s us), write %s IOPS\nIOPS=%d\n", $3, $5, $8, $16, p[2], $49, $8 + $49 }'
  err=$(echo "$line" | cut -d';' -f5)
  [ $rc -eq 0 ] && [ "$err" = 0 ]
}
case $step in
  connect)
    dmesg -C  # the dmesg step judges this case alone
    opts=${4:-}
    if [ -d /sys/module/nvme_rdma ]; then  # loaded: keep it unless a parameter asked for differs
      want=Y; case " $opts " in *" register_always=N "*|*" register_always=0 "*) want=N ;; esac
      [ "$(cat /sys/module/nvme_rdma/parameters/register_always)" = $want ] || modprobe -r nvme-rdma || exit 1
    fi
    # shellcheck disable=SC2086
    modprobe nvme-rdma $opts || exit 1
    echo "nvme-rdma register_always=$(cat /sys/module/nvme_rdma/parameters/register_always)"
    nvme discover -t rdma -a "$addr" -s 4420 >$work/discover.txt || { cat $work/discover.txt; exit 1; }
    grep -q "subnqn: *$nqn" $work/discover.txt || { echo "discovery log lacks $nqn:"; cat $work/discover.txt; exit 1; }
    echo "discovery: $(grep -c 'Discovery Log Entry' $work/discover.txt) entries, $nqn among them"
    connect
    ;;
  io)
    d=$(dev); [ -n "$d" ] || { echo "not connected"; exit 1; }
    fio_terse --name=randwrite-verify --filename="$d" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
      --iodepth=16 --size=32M --verify=crc32c --verify_fatal=1 --verify_state_save=0 || exit 1
    # The read verify pass: the same offsets (same seed), read back and checked.
    fio_terse --name=read-verify --filename="$d" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
      --iodepth=16 --size=32M --verify=crc32c --verify_fatal=1 --verify_only --verify_state_save=0
    ;;
  fs)
    d=$(dev); [ -n "$d" ] || { echo "not connected"; exit 1; }
    mkfs.ext4 -q -F "$d" || exit 1
    mkdir -p $work/mnt && mount "$d" $work/mnt || exit 1
    head -c 3000000 /dev/urandom >$work/file && cp $work/file $work/mnt/file && sync || exit 1
    sha256sum $work/file | cut -d' ' -f1 >$work/file.sha
    echo 3 >/proc/sys/vm/drop_caches
    got=$(sha256sum $work/mnt/file | cut -d' ' -f1)
    umount $work/mnt || exit 1
    [ "$got" = "$(cat $work/file.sha)" ] || { echo "sha256 differs: $got"; exit 1; }
    echo "ext4: 3000000-byte file copied, sha256 $got matches"
    ;;
  reread)
    nvme disconnect -n "$nqn" || exit 1
    i=0; while [ -n "$(dev)" ] && [ $i -lt 40 ]; do sleep 0.5; i=$((i + 1)); done
    [ -z "$(dev)" ] || { echo "still connected after nvme disconnect"; exit 1; }
    connect || exit 1
    d=$(dev)
    mount -o ro "$d" $work/mnt || exit 1
    got=$(sha256sum $work/mnt/file | cut -d' ' -f1)
    umount $work/mnt
    [ "$got" = "$(cat $work/file.sha)" ] || { echo "after reconnect, sha256 differs: $got"; exit 1; }
    echo "reconnected: sha256 $got matches"
    ;;
  randread)
    d=$(dev); [ -n "$d" ] || { echo "not connected"; exit 1; }
    fio_terse --name=randread-qd$4 --filename="$d" --ioengine=libaio --direct=1 --rw=randread --bs=4k \
      --iodepth="$4" --time_based --runtime="$5" --size=32M
    ;;
  disconnect)
    nvme disconnect -n "$nqn"
    ;;
  dmesg)
    bad=$(dmesg | grep -iE "nvme" | grep -iE "error|fail|timeout|reset|abort|I/O [0-9]* QID" || true)
    [ -z "$bad" ] || { echo "kernel log has NVMe errors:"; echo "$bad" | tail -n 20; exit 1; }
    echo "kernel log: $(dmesg | grep -c nvme) nvme lines, no errors"
    ;;
  *) echo "unknown step $step"; exit 2 ;;
esac

#!/usr/bin/env bash
# Full-kernel end to end: the whole fleet — node namespaces, API server, configurators, agents and FRR —
# inside Debian's cloud kernel under qemu (TCG), where VRFs, L3 VNIs and VLAN sub-interfaces exist.
#
#   tests/kernel-tier/fleet-vm.sh [--filter SUBSTRING] [--keep] [--demo]
#
#   --filter SUBSTRING   libtest filter for tests/tests/fleet_vm.rs (default: vm_, every scenario)
#   --demo               run `netwave-demo` (the VRF path, with FRR) in the guest instead of the tests
#   --script FILE        run FILE (sh) in the guest instead (exploring FRR or the kernel by hand)
#   --keep               keep the work directory (disk images, guest log) and print its path
#
#   host                                            guest (Debian cloud kernel, qemu TCG, 2 vCPUs)
#   apt: qemu, mmdebstrap ─► rootfs.ext4 (cached) ─► /dev/vda  read-only, under a tmpfs overlay
#   cargo build (debug)    ─► payload.ext4        ─► /dev/vdb  /payload: binaries, test, modules
#   initramfs: busybox /init loads virtio/overlay, chroots into the overlay, runs /payload/guest.sh,
#              prints TEST-EXIT-CODE=<n>, powers off; the host reads the marker (none: a failure).
#
# The root filesystem is Debian bookworm with FRR, iproute2 and ping (mmdebstrap, ~1 min, cached in
# $CACHE for a week); the binaries are the host's ordinary debug build (same glibc). Prints boot time and
# every scenario's own figures. Exit status: 0 passed; 1 failed; 2 the guest gave no verdict (hung and was
# killed, or crashed); 77 SKIPPED (packages could not be installed) — the only case that does not run.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
FILTER=vm_
KEEP=0
DEMO=0
SCRIPT=
while [ $# -gt 0 ]; do
    case $1 in
        --filter) FILTER=${2:?--filter needs a value}; shift 2 ;;
        --filter=*) FILTER=${1#--filter=}; shift ;;
        --keep) KEEP=1; shift ;;
        --demo) DEMO=1; shift ;;
        --script) SCRIPT=$(realpath "${2:?--script needs a file}"); shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "fleet-vm: unknown argument $1" >&2; exit 1 ;;
    esac
done
if [ "$(id -u)" = 0 ]; then
    CACHE=${NETWAVE_KERNEL_TIER_CACHE:-/var/cache/netwave-kernel-tier}
else
    echo "fleet-vm: needs root (mmdebstrap, loop-free ext4 images, qemu)" >&2
    exit 1
fi
# The guest runs under TCG (no KVM backend a stock kernel can use), so its speed follows the host's: the
# run took 330-350 s in earlier sessions, and on 2026-11-28 its third test was still progressing (the
# import-list change alone took 221 s) when 1,200 s ran out. A hang still fails, 30 minutes in.
BOOT_TIMEOUT=${NETWAVE_FLEET_VM_TIMEOUT:-1800}
export VM_MEMORY=${NETWAVE_FLEET_VM_MEMORY:-4096} VM_CPUS=2
# Modules /init loads before the chroot; the rest load on demand through the guest's kmod.
BOOT_MODULES=(virtio_pci virtio_blk overlay)
MODULES=(dummy veth vrf 8021q bridge vxlan macvlan br_netfilter ip_gre ip6_gre sch_ingress cls_flower act_mirred)
ROOTFS_PACKAGES=frr,frr-pythontools,iproute2,iputils-ping,kmod,procps,mount,ca-certificates

T0=$(date +%s.%N)
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "fleet-vm: $*" >&2; }
die() { echo "fleet-vm: ERROR: $*" >&2; exit "${2:-2}"; }
skip() {
    {
        echo "################################################################################"
        echo "## FULL-KERNEL FLEET SKIPPED: $*"
        echo "## The VRF / L3 VNI end-to-end scenarios did NOT run. This is not a pass."
        echo "################################################################################"
    } >&2
    exit 77
}
# shellcheck source=tests/kernel-tier/lib.sh
source "$(dirname "$0")/lib.sh"

# Debian bookworm with FRR as an ext4 image, made once a week (security updates) or when the package list
# changes. Prints its path.
rootfs_image() {
    local img=$CACHE/fleet-rootfs.ext4 tmp size start
    if [ -n "$(find "$img" -mtime -7 2>/dev/null)" ] && [ "$(cat "$img.packages" 2>/dev/null)" = "$ROOTFS_PACKAGES" ]; then
        log "root filesystem $(du -m "$img" | cut -f1) MiB (cached)"
        echo "$img"
        return 0
    fi
    start=$(now)
    tmp=$(mktemp -d "$CACHE/.rootfs.XXXXXX")
    log "making the guest root filesystem: Debian bookworm + $ROOTFS_PACKAGES (mmdebstrap)"
    mmdebstrap --quiet --variant=essential --include="$ROOTFS_PACKAGES" \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        bookworm "$tmp/root" \
        "deb http://deb.debian.org/debian bookworm main" \
        "deb http://deb.debian.org/debian bookworm-updates main" \
        "deb http://deb.debian.org/debian-security bookworm-security main" >&2 ||
        { rm -rf "$tmp"; skip "mmdebstrap could not make the root filesystem"; }
    mkdir -p "$tmp/root/payload"
    size=$(($(du -sm "$tmp/root" | cut -f1) * 13 / 10 + 64))
    mkfs.ext4 -q -F -L netwave-root -d "$tmp/root" "$tmp/root.ext4" "${size}M" >&2
    mv "$tmp/root.ext4" "$img"
    echo "$ROOTFS_PACKAGES" >"$img.packages"
    rm -rf "$tmp"
    log "root filesystem $(du -m "$img" | cut -f1) MiB in $(secs "$start" "$(now)") s"
    echo "$img"
}

# Decompressed modules of <names> and their dependencies under <root>/lib/modules/<kver>, indexed.
install_modules() { # install_modules <kernel dir> <root> <names...>
    local kdir=$1 root=$2 kver f rel busybox
    shift 2
    kver=$(cat "$kdir/kver")
    busybox=$(command -v busybox || echo /bin/busybox)
    mkdir -p "$root/lib/modules/$kver"
    while read -r f; do
        rel=${f#"$kdir/modules/"}
        mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
        case $f in
            *.xz) xz -dc "$f" >"$root/lib/modules/$kver/${rel%.xz}" ;;
            *.zst) zstd -dcq "$f" >"$root/lib/modules/$kver/${rel%.zst}" ;;
            *.gz) gzip -dc "$f" >"$root/lib/modules/$kver/${rel%.gz}" ;;
            *) cp "$f" "$root/lib/modules/$kver/$rel" ;;
        esac
    done < <(module_closure "$kdir/modules" "$@")
    for f in modules.builtin modules.order modules.builtin.modinfo; do
        [ -f "$kdir/modules/$f" ] && cp "$kdir/modules/$f" "$root/lib/modules/$kver/"
    done
    "$busybox" depmod -b "$root" "$kver"
}

# The binaries (ordinary debug build), the scenario test executable and the guest script, as an ext4 image.
payload_image() { # payload_image <kernel dir> <work dir>; prints the image path
    local kdir=$1 work=$2 dir=$work/payload json exe start
    start=$(now)
    mkdir -p "$dir/bin"
    # The workspace's test build, as `make unit` builds it (nothing to do after it): it puts the testbed,
    # configurator, agent and demo binaries in target/debug for the integration tests. Building a few
    # packages instead would compile them again with another feature set (~2 min in CI).
    log "building: cargo test --workspace --no-run (testbed, configurator, agent, demo and the fleet_vm test)"
    json=$work/cargo.json
    cargo test -q --workspace --no-run --message-format=json >"$json" ||
        die "the workspace's tests did not build" 1
    exe=$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "fleet_vm" and m.get("executable"):
        print(m["executable"])' "$json" | head -n1)
    [ -x "$exe" ] || die "no fleet_vm test executable in cargo's output" 1
    for b in netwave-testbed netwave-configurator netwave-agent netwave-demo; do
        cp "$TARGET/debug/$b" "$dir/bin/"
    done
    cp "$exe" "$dir/bin/fleet_vm"
    # The tests find the CRDs and manifests under the workspace path compiled into them.
    mkdir -p "$dir/workspace"
    cp -r "$ROOT/crds" "$ROOT/deploy" "$dir/workspace/"
    install_modules "$kdir" "$dir" "${MODULES[@]}"
    write_guest_script "$dir/guest.sh"
    log "build and payload in $(secs "$start" "$(now)") s"
    mkfs.ext4 -q -F -L netwave-payload -d "$dir" "$work/payload.ext4" "$(($(du -sm "$dir" | cut -f1) * 12 / 10 + 32))M" >&2
    echo "$work/payload.ext4"
}

write_guest_script() {
    local run
    if [ -n "$SCRIPT" ]; then
        cp "$SCRIPT" "$(dirname "$1")/script.sh"
        run="sh /payload/script.sh"
    elif [ "$DEMO" = 1 ]; then
        run="/payload/bin/netwave-demo --frr"
    else
        run="/payload/bin/fleet_vm --test-threads=1 --nocapture '$FILTER'"
    fi
    # Unquoted here-document: \$ escapes what the guest expands, and no backquotes (the host would run them).
    cat >"$1" <<EOF
#!/bin/sh
# Generated by tests/kernel-tier/fleet-vm.sh: runs inside the guest's root filesystem (chroot).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root RUST_BACKTRACE=1 NETWAVE_KERNEL_TIER=1
export NETWAVE_BIN_DIR=/payload/bin TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /run/netns /var/run
# kmod wants its binary indexes: the guest's own depmod writes them (the overlay is writable).
mkdir -p /lib/modules && cp -r /payload/lib/modules/* /lib/modules/ && depmod -a
mkdir -p "$(dirname "$ROOT")" && ln -sfn /payload/workspace "$ROOT"
echo /sbin/modprobe >/proc/sys/kernel/modprobe
for m in ${MODULES[*]}; do
    case \$m in dummy) args=numdummies=0 ;; *) args= ;; esac
    modprobe \$m \$args || echo "fleet-vm guest: modprobe \$m FAILED"
done
ip link set lo up
# A node has a host name; FRR's config carries it ('hostname (none)' is refused).
echo netwave-vm >/proc/sys/kernel/hostname
echo "fleet-vm guest: \$(uname -r), \$(nproc) cpu(s), \$(free -m | awk '/Mem:/ {print \$2}') MiB, up \$(cut -d' ' -f1 /proc/uptime) s"
$run
EOF
    chmod 0755 "$1"
}

build_fleet_initramfs() { # build_fleet_initramfs <kernel dir> <out.cpio>
    local kdir=$1 out=$2 root busybox
    root=$(dirname "$out")/initrd
    rm -rf "$root"
    mkdir -p "$root"/{bin,proc,sys,dev,lower,upper,newroot}
    busybox=$(command -v busybox || echo /bin/busybox)
    readelf -d "$busybox" | grep -q NEEDED && die "$busybox is not static (install busybox-static)"
    install -m 0755 "$busybox" "$root/bin/busybox"
    install_modules "$kdir" "$root" "${BOOT_MODULES[@]}"
    cat >"$root/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
echo
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in ${BOOT_MODULES[*]}; do modprobe \$m || echo "fleet-vm guest: modprobe \$m FAILED"; done
rc=2
if mount -o ro /dev/vda /lower && mount -t tmpfs -o size=3g tmpfs /upper; then
    mkdir -p /upper/rw /upper/work
    mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/rw,workdir=/upper/work /newroot
    mount -o ro /dev/vdb /newroot/payload
    umount /proc /sys /dev
    chroot /newroot /payload/guest.sh
    rc=\$?
    mount -t proc proc /proc
else
    echo "fleet-vm guest: mounting the root filesystem FAILED"
fi
echo "fleet-vm guest: done at \$(cut -d' ' -f1 /proc/uptime) s"
echo "TEST-EXIT-CODE=\$rc"
poweroff -f
EOF
    chmod 0755 "$root/init"
    (cd "$root" && find . | LC_ALL=C sort | "$busybox" cpio -o -H newc 2>/dev/null) >"$out"
}

main() {
    local work kdir rootfs payload rc t
    mkdir -p "$CACHE" "$TARGET"
    work=$(mktemp -d "$TARGET/fleet-vm.XXXXXX")
    if [ "$KEEP" = 1 ]; then
        log "work directory: $work"
    else
        # shellcheck disable=SC2064 # expand now: $work is local to main
        trap "rm -rf '$work'" EXIT
    fi
    ensure_packages
        exec 9>"$CACHE/.lock"
    flock 9
    rm -rf "$CACHE"/.fetch.* "$CACHE"/.rootfs.*
    t=$(now)
    kdir=$(fetch_kernel)
    rootfs=$(rootfs_image)
    flock -u 9
    log "kernel and root filesystem ready in $(secs "$t" "$(now)") s: $(basename "$kdir")"
    payload=$(payload_image "$kdir" "$work")
    build_fleet_initramfs "$kdir" "$work/initramfs.cpio"
    # The root image is shared by concurrent runs: read-only, and its writes go to the tmpfs overlay.
    local disks=(-drive "file=$rootfs,format=raw,if=virtio,readonly=on"
        -drive "file=$payload,format=raw,if=virtio,readonly=on")
    rc=$(boot "$kdir/vmlinux" "$work/initramfs.cpio" "$work/guest.log" "${disks[@]}")
    log "total $(secs "$T0" "$(now)") s"
    if [ -z "$rc" ]; then
        echo "fleet-vm: INFRASTRUCTURE FAILURE: the guest gave no verdict (hung or crashed; log above)" >&2
        exit 2
    fi
    if [ "$rc" != 0 ]; then
        echo "fleet-vm: FAILED inside $(basename "$kdir") (TEST-EXIT-CODE=$rc)" >&2
        exit 1
    fi
    log "passed on $(basename "$kdir")"
}

main

#!/usr/bin/env bash
# Kernel tier: run netlink tests that need a full kernel (VRF, VLAN, dummy, bridge VLAN filtering) inside
# Debian's cloud kernel booted under qemu (TCG). See ../../../shared/docs/KERNEL-TIER.md for the measured
# recipe this follows.
#
#   tests/kernel-tier/run.sh [--filter SUBSTRING] [--keep] [CARGO TEST SELECTION...]
#
#   CARGO TEST SELECTION  passed to `cargo test --no-run` (default: -p netwave-kernel-tier); e.g.
#                         `-p netwave-kernel-tier -p netwave-agent`, or `-p netwave-agent --test netlink`.
#   --filter SUBSTRING    libtest name filter applied to every test executable (default: kernel_tier_);
#                         executables with no matching test are left out of the guest.
#   --keep                keep the work directory (initramfs, guest log) and print its path.
#
# Environment: NETWAVE_KERNEL_TIER_CACHE (extracted kernels; default /var/cache/netwave-kernel-tier as root,
# else <target>/kernel-tier-cache), NETWAVE_KERNEL_TIER_BUILD_DIR (target dir of the static build; default
# the normal one: with an explicit --target the static units live under <target>/x86_64-unknown-linux-gnu/
# and RUSTFLAGS do not reach host units (proc macros, build scripts), so the normal build is neither
# invalidated nor rebuilt (measured) and the proc macros are shared),
# NETWAVE_KERNEL_TIER_TIMEOUT (seconds per boot, default 120).
#
# Exit status: 0 tests passed; 1 tests failed (or did not build, or no test matched);
# 2 infrastructure failure (the guest gave no verdict twice); 77 SKIPPED: the packages could not be
# installed or downloaded (printed loudly; the only case in which the tier does not run).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
FILTER=kernel_tier_
KEEP=0
CARGO_SELECTION=()
while [ $# -gt 0 ]; do
    case $1 in
        --filter) FILTER=${2:?--filter needs a value}; shift 2 ;;
        --filter=*) FILTER=${1#--filter=}; shift ;;
        --keep) KEEP=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) CARGO_SELECTION+=("$1"); shift ;;
    esac
done
[ ${#CARGO_SELECTION[@]} -gt 0 ] || CARGO_SELECTION=(-p netwave-kernel-tier)
if [ "$(id -u)" = 0 ]; then
    CACHE=${NETWAVE_KERNEL_TIER_CACHE:-/var/cache/netwave-kernel-tier}
else
    CACHE=${NETWAVE_KERNEL_TIER_CACHE:-$TARGET/kernel-tier-cache}
fi
BUILD_DIR=${NETWAVE_KERNEL_TIER_BUILD_DIR:-$TARGET}
BOOT_TIMEOUT=${NETWAVE_KERNEL_TIER_TIMEOUT:-120}
# Modules the guest loads (their dependencies come from each module's own `depends=`).
MODULES=(dummy veth vrf 8021q bridge vxlan macvlan ip_gre ip6_gre sch_ingress cls_flower act_mirred)

T0=$(date +%s.%N)
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "kernel-tier: $*" >&2; }
die() { echo "kernel-tier: ERROR: $*" >&2; exit "${2:-2}"; }
skip() {
    {
        echo "################################################################################"
        echo "## KERNEL TIER SKIPPED: $*"
        echo "## VRF/VLAN/bridge-VLAN-filtering tests did NOT run. This is not a pass."
        echo "################################################################################"
    } >&2
    exit 77
}

# shellcheck source=tests/kernel-tier/lib.sh
source "$(dirname "$0")/lib.sh"

# --- 3. static test executables ---------------------------------------------------------------------------
# Prints one executable per line: those with at least one test matching $FILTER.
build_tests() {
    local json=$1 exe n
    log "building static test executables: cargo test --no-run ${CARGO_SELECTION[*]}"
    RUSTFLAGS='-C target-feature=+crt-static' CARGO_TARGET_DIR=$BUILD_DIR \
        cargo test --no-run --target x86_64-unknown-linux-gnu --message-format=json \
        "${CARGO_SELECTION[@]}" >"$json" || die "the test executables did not build" 1
    grep '"reason":"compiler-artifact"' "$json" | grep '"test":true' |
        grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | sort -u |
        while read -r exe; do
            if readelf -d "$exe" 2>/dev/null | grep -q NEEDED; then
                die "$exe is dynamically linked (crt-static did not apply)"
            fi
            # --list runs nothing: only executables with matching tests go into the guest.
            n=$("$exe" "$FILTER" --list --format terse 2>/dev/null | grep -c ': test$' || true)
            if [ "$n" -gt 0 ]; then
                log "  $(basename "$exe"): $n test(s) matching '$FILTER'"
                echo "$exe"
            fi
        done
}

# --- 4. initramfs
build_initramfs() { # build_initramfs <kernel dir> <out.cpio> <executables...>
    local kdir=$1 out=$2; shift 2
    local root kver busybox f rel i=0 exe
    root=$(dirname "$out")/root
    kver=$(cat "$kdir/kver")
    rm -rf "$root"
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,tests,etc} "$root/lib/modules/$kver"
    busybox=$(command -v busybox || echo /bin/busybox)
    readelf -d "$busybox" | grep -q NEEDED && die "$busybox is not static (install busybox-static)"
    install -m 0755 "$busybox" "$root/bin/busybox"
    # The real iproute2: busybox's ip silently ignores `vlan_filtering 1`.
    copy_with_libs "$root" "$(command -v ip)" /usr/bin/ip
    copy_with_libs "$root" "$(command -v bridge)" /usr/sbin/bridge
    ln -s ../bin/ip "$root/usr/sbin/ip"
    ln -s ../sbin/bridge "$root/usr/bin/bridge"
    [ -d /etc/iproute2 ] && cp -r /etc/iproute2 "$root/etc/"
    mkdir -p "$root/var" && ln -s /run "$root/var/run"
    # Modules, decompressed (busybox modprobe reads only plain .ko), then busybox depmod.
    while read -r f; do
        rel=${f#"$kdir/modules/"}
        mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
        case $f in
            *.xz) xz -dc "$f" >"$root/lib/modules/$kver/${rel%.xz}" ;;
            *.zst) zstd -dcq "$f" >"$root/lib/modules/$kver/${rel%.zst}" ;;
            *.gz) gzip -dc "$f" >"$root/lib/modules/$kver/${rel%.gz}" ;;
            *) cp "$f" "$root/lib/modules/$kver/$rel" ;;
        esac
    done < <(module_closure "$kdir/modules" "${MODULES[@]}")
    for f in modules.builtin modules.order; do
        [ -f "$kdir/modules/$f" ] && cp "$kdir/modules/$f" "$root/lib/modules/$kver/"
    done
    "$busybox" depmod -b "$root" "$kver"
    for exe in "$@"; do
        i=$((i + 1))
        install -m 0755 "$exe" "$root/tests/$(printf '%02d' "$i")-$(basename "$exe")"
    done
    write_init "$root/init"
    (cd "$root" && find . | LC_ALL=C sort | "$busybox" cpio -o -H newc 2>/dev/null) >"$out"
}

write_init() {
    cat >"$1" <<EOF
#!/bin/busybox sh
# Generated by tests/kernel-tier/run.sh: load modules, run every test executable, report, power off.
/bin/busybox --install -s /bin
echo # the firmware's last line has no newline
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp RUST_BACKTRACE=1 RUST_LIB_BACKTRACE=0 NETWAVE_KERNEL_TIER=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /run/netns
echo /bin/modprobe >/proc/sys/kernel/modprobe
rc=0
echo "kernel-tier guest: \$(uname -r), \$(nproc) cpu(s), iproute2 \$(/usr/bin/ip -V | sed 's/.*iproute2-//'), up \$(cut -d' ' -f1 /proc/uptime) s"
for m in ${MODULES[*]}; do
    case \$m in dummy) args=numdummies=0 ;; *) args= ;; esac
    modprobe \$m \$args || { echo "kernel-tier guest: modprobe \$m FAILED"; rc=1; }
done
ip link set lo up
for t in /tests/*; do
    echo "kernel-tier guest: running \${t#/tests/} '$FILTER'"
    "\$t" '$FILTER' || rc=1
done
echo "kernel-tier guest: done at \$(cut -d' ' -f1 /proc/uptime) s"
echo "TEST-EXIT-CODE=\$rc"
poweroff -f
EOF
    chmod 0755 "$1"
}

main() {
    local work kdir exes=() json rc t_build t_kernel t_initrd
    mkdir -p "$CACHE" "$TARGET"
    work=$(mktemp -d "$TARGET/kernel-tier-run.XXXXXX")
    if [ "$KEEP" = 1 ]; then
        log "work directory: $work"
    else
        # shellcheck disable=SC2064 # expand now: $work is local to main
        trap "rm -rf '$work'" EXIT
    fi

    ensure_packages
    exec 9>"$CACHE/.lock"
    flock 9
    rm -rf "$CACHE"/.fetch.* # left by an interrupted run (we hold the lock)
    t_kernel=$(now)
    kdir=$(fetch_kernel)
    flock -u 9
    log "kernel ready in $(secs "$t_kernel" "$(now)") s: $(basename "$kdir") ($(cat "$kdir/kver"))"

    t_build=$(now)
    json=$work/cargo.json
    build_tests "$json" >"$work/executables"
    mapfile -t exes <"$work/executables"
    [ ${#exes[@]} -gt 0 ] || die "no test matches '$FILTER' in: ${CARGO_SELECTION[*]}" 1
    log "static build in $(secs "$t_build" "$(now)") s"

    t_initrd=$(now)
    build_initramfs "$kdir" "$work/initramfs.cpio" "${exes[@]}"
    log "initramfs $(du -k "$work/initramfs.cpio" | cut -f1) KiB in $(secs "$t_initrd" "$(now)") s"

    rc=$(boot "$kdir/vmlinux" "$work/initramfs.cpio" "$work/guest.log")
    if [ -z "$rc" ]; then
        log "infrastructure failure: no TEST-EXIT-CODE in the guest output; retrying once"
        rc=$(boot "$kdir/vmlinux" "$work/initramfs.cpio" "$work/guest.log")
    fi
    log "total $(secs "$T0" "$(now)") s"
    if [ -z "$rc" ]; then
        echo "kernel-tier: KERNEL TIER INFRASTRUCTURE FAILURE: the guest gave no verdict twice" >&2
        exit 2
    fi
    if [ "$rc" != 0 ]; then
        echo "kernel-tier: FAILED: tests failed inside $(basename "$kdir") (TEST-EXIT-CODE=$rc)" >&2
        exit 1
    fi
    log "passed on $(basename "$kdir")"
}

main

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
MODULES=(dummy veth vrf 8021q bridge vxlan macvlan)

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

export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=0
apt_update() {
    [ "$APT_UPDATED" = 1 ] && return 0
    APT_UPDATED=1
    apt-get update -qq >&2
}

# --- 1. host packages -----------------------------------------------------------------------------------
ensure_packages() {
    local missing=() pkg
    for pkg in qemu-system-x86 busybox-static iproute2 xz-utils zstd lz4; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || skip "${missing[*]} not installed and not root to install them"
    log "installing ${missing[*]}"
    local start
    start=$(now)
    if ! { apt_update && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$CACHE/.apt.log" 2>&1
    then
        tail -n 20 "$CACHE/.apt.log" >&2
        skip "apt-get could not install ${missing[*]}"
    fi
    log "installed in $(secs "$start" "$(now)") s"
}

# --- 2. kernel: resolve through linux-image-cloud-amd64, download, extract, cache -------------------------
# Prints the cache directory holding `vmlinux`, `kver` and `modules/` (lib/modules/<kver> of the package).
resolve_kernel_package() {
    # "linux-image-6.1.0-48-cloud-amd64 (= 6.1.172-1)" → "linux-image-6.1.0-48-cloud-amd64=6.1.172-1"
    apt-cache show --no-all-versions linux-image-cloud-amd64 2>/dev/null |
        sed -n 's/^Depends: *\(linux-image-[^ ,]*\) *(= *\([^)]*\)).*/\1=\2/p' | head -n1
}

# The uncompressed ELF kernel out of a bzImage (what scripts/extract-vmlinux does, but exact): the boot
# protocol header says where the compressed payload starts ((setup_sects + 1) * 512 + payload_offset) and
# how long it is; its magic says the format (bookworm's cloud kernel: lz4; generic: xz). Booted directly,
# the ELF skips the in-guest decompression (≈4 s under TCG for xz).
extract_vmlinux() {
    local image=$1 out=$2 setup_sects offset length start magic tool
    setup_sects=$(od -An -tu1 -j $((0x1f1)) -N1 "$image" | tr -d ' ')
    [ "$setup_sects" = 0 ] && setup_sects=4
    offset=$(od -An -tu4 -j $((0x248)) -N4 "$image" | tr -d ' ')
    length=$(od -An -tu4 -j $((0x24c)) -N4 "$image" | tr -d ' ')
    start=$(((setup_sects + 1) * 512 + offset))
    magic=$(od -An -tx1 -j "$start" -N6 "$image" | tr -d ' \n')
    case $magic in
        fd377a585a00) tool='xz -dc' ;;
        28b52ffd*) tool='zstd -dcq' ;;
        1f8b*) tool='gzip -dc' ;;
        02214c18*) tool='lz4 -dc' ;;
        425a68*) tool='bzip2 -dc' ;;
        5d0000*) tool='xz -dc --format=lzma' ;;
        *) log "unknown kernel payload format (magic $magic)"; return 1 ;;
    esac
    # The kernel appends the uncompressed size after the stream: decompressors complain, output is whole.
    tail -c +$((start + 1)) "$image" | head -c "$length" | $tool >"$out" 2>/dev/null || true
    [ "$(head -c 4 "$out" | od -An -c | tr -d ' \n')" = '177ELF' ]
}

fetch_kernel() {
    local spec name version key dir tmp deb vmlinuz moddir
    spec=$(resolve_kernel_package)
    if [ -z "$spec" ]; then
        apt_update || true
        spec=$(resolve_kernel_package)
    fi
    if [ -n "$spec" ]; then
        name=${spec%%=*} version=${spec#*=}
        key="${name}_${version}"
        dir=$CACHE/$key
        if [ -f "$dir/ok" ]; then
            log "kernel $key (cached)"
            echo "$dir"
            return 0
        fi
        tmp=$(mktemp -d "$CACHE/.fetch.XXXXXX")
        log "downloading $name $version"
        # Kernel packages for one ABI leave the archive when the next lands: refresh the lists once.
        if ! (cd "$tmp" && apt-get download -qq "$spec" >&2 2>/dev/null); then
            apt_update || true
            spec=$(resolve_kernel_package)
            name=${spec%%=*} version=${spec#*=} key="${name}_${version}" dir=$CACHE/$key
            (cd "$tmp" && apt-get download -qq "$spec" >&2) || spec=
        fi
        if [ -n "$spec" ] && [ -f "$dir/ok" ]; then
            rm -rf "$tmp"
            echo "$dir"
            return 0
        fi
        if [ -n "$spec" ]; then
            deb=$(ls "$tmp"/*.deb)
            log "downloaded $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB); extracting"
            dpkg-deb -x "$deb" "$tmp/root"
            vmlinuz=$(ls "$tmp"/root/boot/vmlinuz-* | head -n1)
            moddir=$(ls -d "$tmp"/root/lib/modules/* "$tmp"/root/usr/lib/modules/* 2>/dev/null | head -n1)
            [ -f "$vmlinuz" ] && [ -d "$moddir" ] || die "no vmlinuz or modules in $(basename "$deb")"
            rm -rf "$dir"
            mkdir -p "$dir"
            extract_vmlinux "$vmlinuz" "$dir/vmlinux" || die "could not extract an ELF vmlinux from $vmlinuz"
            basename "$moddir" >"$dir/kver"
            mv "$moddir" "$dir/modules"
            rm -rf "$tmp"
            touch "$dir/ok"
            echo "$dir"
            return 0
        fi
        rm -rf "$tmp"
    fi
    # Nothing downloadable: an earlier extracted kernel still tests the code.
    dir=$(ls -dt "$CACHE"/linux-image-*/ok 2>/dev/null | head -n1 || true)
    if [ -n "$dir" ]; then
        log "WARNING: could not download the current kernel package; using cached $(basename "$(dirname "$dir")")"
        dirname "$dir"
        return 0
    fi
    skip "could not resolve or download linux-image-cloud-amd64 (apt-get download failed)"
}

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

# --- 4. initramfs -------------------------------------------------------------------------------------------
copy_with_libs() { # copy_with_libs <root> <binary> <dest path in root>
    local root=$1 bin=$2 dest=$3 lib
    install -D -m 0755 "$bin" "$root$dest"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
        [ -e "$root$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
    done
}

module_closure() { # module_closure <modules dir> <name>...: prints module file paths, dependencies first
    local moddir=$1; shift
    declare -A path=() seen=()
    local f base
    while read -r f; do
        base=${f##*/}; base=${base%%.ko*}
        path[${base//-/_}]=$f
    done < <(find "$moddir" -name '*.ko*')
    visit() {
        local m=${1//-/_} deps d
        [ -n "${seen[$m]:-}" ] && return 0
        seen[$m]=1
        [ -n "${path[$m]:-}" ] || return 0 # built in
        deps=$(modinfo_depends "${path[$m]}")
        for d in ${deps//,/ }; do visit "$d"; done
        echo "${path[$m]}"
    }
    for m in "$@"; do visit "$m"; done
}

modinfo_depends() {
    case $1 in
        *.xz) xz -dc "$1" ;;
        *.zst) zstd -dcq "$1" ;;
        *.gz) gzip -dc "$1" ;;
        *) cat "$1" ;;
    esac | tr '\0' '\n' | sed -n 's/^depends=//p' | head -n1
}

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

# --- 5. boot --------------------------------------------------------------------------------------------------
boot() { # boot <vmlinux> <initramfs> <log>; prints the guest's exit code, or nothing if it gave none
    local start end
    start=$(now)
    # -cpu max without -cx16 double-faults or hangs 6.12 kernels in 5-30 % of boots; -M microvm hangs
    # a third of boots; /dev/kvm here is a backend stock kernels cannot use (KERNEL-TIER.md pitfalls).
    {
        timeout --kill-after=5 "$BOOT_TIMEOUT" qemu-system-x86_64 -M pc -accel tcg -cpu max,-cx16 -nographic \
            -no-reboot -m 1024 -nodefaults -serial stdio -display none \
            -kernel "$1" -initrd "$2" -append 'console=ttyS0 panic=-1 quiet' </dev/null 2>&1
        echo $? >"$3.status"
    } | tr -d '\r' | tee "$3" >&2
    end=$(now)
    case $(cat "$3.status") in
        0) log "boot to poweroff: $(secs "$start" "$end") s" ;;
        124 | 137) log "qemu timed out after ${BOOT_TIMEOUT} s" ;;
        *) log "qemu exited with status $(cat "$3.status") after $(secs "$start" "$end") s" ;;
    esac
    { grep -a -o '^TEST-EXIT-CODE=[0-9]*' "$3" || true; } | tail -n1 | cut -d= -f2
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

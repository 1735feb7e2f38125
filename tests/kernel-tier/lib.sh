# Shared by run.sh (netlink tests in an initramfs) and fleet-vm.sh (the whole fleet on a Debian root
# filesystem): host packages, the Debian cloud kernel (resolved, downloaded, extracted, cached), module
# closures, and one qemu boot that reports the guest's `TEST-EXIT-CODE=<n>`.
# Callers set CACHE (kernel cache dir) and BOOT_TIMEOUT, and define log/die/skip/now/secs (see run.sh).

export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=0
apt_update() {
    [ "$APT_UPDATED" = 1 ] && return 0
    APT_UPDATED=1
    apt-get update -qq >&2
}

# --- 1. host packages -----------------------------------------------------------------------------------
ensure_packages() { # qemu, a static busybox, mmdebstrap…: tools/deps.sh is the one list (profile vm)
    bash "$ROOT/tools/deps.sh" vm >&2 || skip "tools/deps.sh could not provide the full-kernel tier's tools (above)"
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

# --- 5. boot --------------------------------------------------------------------------------------------------
boot() { # boot <vmlinux> <initramfs> <log> [qemu args...]; prints the guest's exit code, or nothing
    local start end kernel=$1 initrd=$2 out=$3
    shift 3
    start=$(now)
    # -cpu max without -cx16 double-faults or hangs 6.12 kernels in 5-30 % of boots; -M microvm hangs
    # a third of boots; /dev/kvm here is a backend stock kernels cannot use (KERNEL-TIER.md pitfalls).
    {
        timeout --kill-after=5 "$BOOT_TIMEOUT" qemu-system-x86_64 -M pc -accel tcg -cpu max,-cx16 -nographic \
            -no-reboot -m "${VM_MEMORY:-1024}" -smp "${VM_CPUS:-1}" -nodefaults -serial stdio -display none \
            -kernel "$kernel" -initrd "$initrd" -append "console=ttyS0 panic=-1 quiet ${VM_APPEND:-}" \
            "$@" </dev/null 2>&1
        echo $? >"$out.status"
    } | tr -d '\r' | tee "$out" >&2
    end=$(now)
    case $(cat "$out.status") in
        0) log "boot to poweroff: $(secs "$start" "$end") s" ;;
        124 | 137) log "qemu timed out after ${BOOT_TIMEOUT} s" ;;
        *) log "qemu exited with status $(cat "$out.status") after $(secs "$start" "$end") s" ;;
    esac
    { grep -a -o '^TEST-EXIT-CODE=[0-9]*' "$out" || true; } | tail -n1 | cut -d= -f2
}


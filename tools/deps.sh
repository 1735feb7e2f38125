#!/usr/bin/env bash
# The one place that knows every tool netwave's demo and tests run (`make deps`; `make demo`, `make test`
# and `.ci/run` call it first). For each tool it checks the command itself, not a package database, so a
# tool installed another way counts too.
#
#   tools/deps.sh demo            make demo: network namespaces, real agents, FRR (BGP EVPN), ping
#   tools/deps.sh demo-nokernel   make demo NO_KERNEL=1: the Rust toolchain only
#   tools/deps.sh vm              make demo KERNEL=full, make fleet-vm / kernel-tier: qemu, a static busybox,
#                                 mmdebstrap for the guest's root filesystem
#   tools/deps.sh cluster         make cluster: a real node (containerd, runc, CNI plugins, nftables, iptables)
#   tools/deps.sh test            make test: all of the above, Go, buildah, Prometheus
#
# As root on Debian (apt-get) it installs what is missing, says what and how long it took, and is silent
# when nothing is missing. Otherwise it stops at once, naming every missing tool and the command that
# installs it: nothing later fails for a tool that was never checked.
#
# Installing FRR must not start its daemons in the root namespace (there is no init here to stop them):
# a policy-rc.d refuses service starts for the duration of the install, unless the machine has its own.
set -euo pipefail

profile=${1:-test}

# tool → Debian package, and how the tool is found: a command on the PATH, or an absolute path.
declare -A PACKAGE_OF=(
    [ip]=iproute2 [bridge]=iproute2 [ping]=iputils-ping
    [/usr/lib/frr/zebra]=frr [/usr/lib/frr/bgpd]=frr [vtysh]=frr [/usr/lib/frr/frr-reload.py]=frr-pythontools
    [python3]=python3 [bash]=bash [make]=make [update-ca-certificates]=ca-certificates
    [buildah]=buildah [mmdebstrap]=mmdebstrap [mkfs.ext4]=e2fsprogs
    [prometheus]=prometheus [promtool]=prometheus
    [qemu-system-x86_64]=qemu-system-x86 [/bin/busybox]=busybox-static
    [xz]=xz-utils [zstd]=zstd [lz4]=lz4
    [containerd]=containerd [ctr]=containerd [runc]=runc [/usr/lib/cni/bridge]=containernetworking-plugins
    [nft]=nftables [iptables]=iptables [nsenter]=util-linux
    [git]=git
)
# What each profile needs, and why (the why is printed when a tool cannot be installed).
demo_tools=(make ip bridge ping /usr/lib/frr/zebra /usr/lib/frr/bgpd vtysh /usr/lib/frr/frr-reload.py)
vm_tools=(make ip bridge python3 qemu-system-x86_64 /bin/busybox mmdebstrap mkfs.ext4 xz zstd lz4)
cluster_tools=(ip nsenter containerd ctr runc /usr/lib/cni/bridge nft iptables /bin/busybox)
test_tools=("${demo_tools[@]}" "${vm_tools[@]}" "${cluster_tools[@]}" bash update-ca-certificates buildah prometheus promtool git)
declare -A WHY=(
    [ping]="the demo's and the e2e tests' data-plane checks"
    [/usr/lib/frr/zebra]="BGP EVPN per node (FRR)" [/usr/lib/frr/bgpd]="BGP EVPN per node (FRR)"
    [vtysh]="BGP EVPN per node (FRR)" [/usr/lib/frr/frr-reload.py]="the agent's FRR reloads"
    [buildah]="make images" [mmdebstrap]="the FRR image and the full-kernel guest's root filesystem"
    [git]="the many-clusters test's Git repository (Flux fetches it; git-http-backend serves it)"
    [prometheus]="the alert and dashboard tests" [promtool]="the alert rule tests"
    [qemu-system-x86_64]="the full-kernel tier" [/bin/busybox]="the full-kernel tier's initramfs, the real node's sandbox image"
    [containerd]="the real node's container runtime" [ctr]="importing images into the real node"
    [runc]="the real node's container runtime" [/usr/lib/cni/bridge]="the real node's pod network"
    [nft]="kube-proxy (nftables mode) on the real node" [iptables]="the CNI bridge's masquerading on the real node"
)

case $profile in
    demo) tools=("${demo_tools[@]}") ;;
    demo-nokernel) tools=() ;;
    vm) tools=("${vm_tools[@]}") ;;
    cluster) tools=("${cluster_tools[@]}") ;;
    test) tools=("${test_tools[@]}") ;;
    *) echo "deps: unknown profile '$profile' (demo, demo-nokernel, vm, cluster, test)" >&2; exit 2 ;;
esac

have() {
    case $1 in
        /bin/busybox) [ -x /bin/busybox ] && ! LC_ALL=C readelf -d /bin/busybox 2>/dev/null | grep -q NEEDED ;;
        /*) [ -e "$1" ] ;;
        *) command -v "$1" >/dev/null 2>&1 ;;
    esac
}

# Tools no package manager here provides: named, never installed.
problems=()
if ! command -v cargo >/dev/null 2>&1; then
    problems+=("cargo: the Rust toolchain (https://rustup.rs; rust-toolchain.toml pins the version)")
fi
if [ "$profile" = test ] || [ "$profile" = cluster ]; then
    if ! command -v go >/dev/null 2>&1; then
        problems+=("go: Go 1.26 builds kube-apiserver and etcd for the API tests (https://go.dev/dl)")
    fi
    if ! command -v kubectl >/dev/null 2>&1; then
        problems+=('kubectl: the tests run it against the real API server (apt-get install kubernetes-client, or put the directory that tests/control-plane/build.sh prints on the PATH)')
    fi
fi
# Disk: a cold `make test` writes ~NEED_GB into the target directory (debug test binaries, the static
# release build, the images, the previous release, the full-kernel guest). A disk that fills up half-way
# fails as a linker "Bus error" twenty minutes in; say it now instead.
if [ "$profile" = test ]; then
    target_dir=${CARGO_TARGET_DIR:-$(dirname "$0")/../target}
    probe_dir=$target_dir
    [ -d "$probe_dir" ] || probe_dir=$(dirname "$probe_dir")
    free_gb=$(df -Pk "$probe_dir" | awk 'NR == 2 { printf "%d", $4 / 1048576 }')
    need_gb=${NETWAVE_NEED_GB:-20}
    if [ "$free_gb" -lt "$need_gb" ]; then
        problems+=("disk: ${free_gb} GB free where the build goes ($(cd "$probe_dir" && pwd)); a cold make test needs ~${need_gb} GB (free some, e.g. cargo clean in another checkout; NETWAVE_NEED_GB lowers the bar for a warm target)")
    fi
fi

missing_tools=()
packages=()
for tool in "${tools[@]}"; do
    have "$tool" && continue
    missing_tools+=("$tool")
    pkg=${PACKAGE_OF[$tool]}
    [[ " ${packages[*]} " == *" $pkg "* ]] || packages+=("$pkg")
done

describe() { # the missing tools, one line each, with what needs them and the package
    local tool
    for tool in "${missing_tools[@]}"; do
        echo "  $tool (${WHY[$tool]:-needed by make ${profile%%-*}}): apt-get install ${PACKAGE_OF[$tool]}" >&2
    done
}

if [ "${#problems[@]}" -gt 0 ]; then
    echo "deps: missing, and not installable from here:" >&2
    printf '  %s\n' "${problems[@]}" >&2
    [ "${#missing_tools[@]}" -gt 0 ] && { echo "deps: missing too:" >&2; describe; }
    exit 1
fi
[ "${#packages[@]}" -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "deps: missing tools ($([ "$(id -u)" != 0 ] && echo "not root" || echo "no apt-get"), so not installing them):" >&2
    describe
    echo "deps: as root: apt-get install --no-install-recommends ${packages[*]}" >&2
    exit 1
fi

start=$(date +%s)
echo "deps: installing ${packages[*]} (for ${missing_tools[*]})"
own_policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    own_policy=1
fi
trap '[ -n "$own_policy" ] && rm -f /usr/sbin/policy-rc.d' EXIT
log=$(mktemp)
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${packages[@]}"; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "deps: apt-get could not install ${packages[*]} (its last lines above)" >&2
    rm -f "$log"
    exit 1
fi
rm -f "$log"
still=()
for tool in "${missing_tools[@]}"; do have "$tool" || still+=("$tool"); done
if [ "${#still[@]}" -gt 0 ]; then
    echo "deps: installed ${packages[*]}, but still missing: ${still[*]}" >&2
    exit 1
fi
echo "deps: installed ${packages[*]} in $(($(date +%s) - start)) s"

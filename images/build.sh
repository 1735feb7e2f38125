#!/usr/bin/env bash
# `make images`: static release binaries, then one OCI image layout per image under target/images/
# (outside git), built with buildah from Debian without a Docker engine.
#
#   target/images/netwave-configurator/   OCI layout, ref v<version>
#   target/images/netwave-agent/          OCI layout, ref v<version>
#   target/images/netwave-agent-frr/      OCI layout, ref v<version>: the agent + FRR from Debian bookworm
#
# The version is the workspace version in Cargo.toml, read back from the built binaries (`--version`), so a
# tag can never name another build than the one inside. deploy/base/kustomization.yaml's `images:` must say
# the same; tests/tests/images.rs fails when they drift and checks the layouts this script writes.
#
# buildah runs as root with the vfs storage driver and chroot isolation (no daemon, no overlayfs, no
# runc needed); its storage lives under target/images/.buildah so nothing outside the tree is touched.
# Load an image elsewhere with e.g. `skopeo copy oci:target/images/netwave-agent:v0.2.0 docker://…`.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
out=target/images
cargo_target=${CARGO_TARGET_DIR:-target}
triple=x86_64-unknown-linux-gnu
# Where the project's sources are published (the images' org.opencontainers.image.source label).
source_url=${IMAGE_SOURCE:-https://github.com/netwave/netwave}

if [ "$(uname -m)" != x86_64 ]; then
    echo "images: only x86_64 is built so far (host is $(uname -m))" >&2
    exit 1
fi
for tool in buildah mmdebstrap; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "images: $tool is missing (apt-get install $tool; tools/deps.sh installs it)" >&2
        exit 1
    fi
done

# Static glibc executables (static-pie). An explicit --target keeps the flag off build scripts and proc
# macros, and puts these artefacts beside, not over, the ordinary dynamic release build. No musl: its
# target cannot be installed here, and glibc's static link is supported for what these binaries use: no
# user lookups, host names (none in-cluster) only through glibc's built-in files/dns backends, no dlopen.
RUSTFLAGS="-C target-feature=+crt-static" "${CARGO:-cargo}" build --release --locked --target "$triple" \
    -p netwave-configurator --bins
# The agent with its own profile (Cargo.toml: agent-release, built for size; #14 idle RSS).
RUSTFLAGS="-C target-feature=+crt-static" "${CARGO:-cargo}" build --profile agent-release --locked \
    --target "$triple" -p netwave-agent --bins
bin_dir=$cargo_target/$triple/release
agent_dir=$cargo_target/$triple/agent-release
bin_of() { if [ "$1" = configurator ]; then echo "$bin_dir/netwave-$1"; else echo "$agent_dir/netwave-$1"; fi; }

version=""
for component in configurator agent; do
    bin=$(bin_of "$component")
    # A static binary has no program interpreter (PT_INTERP); the test checks it again in the image.
    headers=$(LC_ALL=C readelf -l "$bin")
    if grep -q 'Requesting program interpreter' <<<"$headers"; then
        echo "images: $bin is dynamically linked" >&2
        exit 1
    fi
    v=$("$bin" --version | awk '{print $2}')
    if [ -z "$version" ]; then version=$v; fi
    if [ "$v" != "$version" ]; then
        echo "images: netwave-configurator is $version but netwave-$component is $v" >&2
        exit 1
    fi
done
tag=v$version
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then revision=$revision-dirty; fi
# Deterministic image timestamps: the commit's time, so rebuilding one commit gives the same config.
created=$(git log -1 --format=%ct 2>/dev/null || echo 0)

# The FRR image's root filesystem: Debian bookworm's `essential` set plus FRR, from Debian's signed
# archive with mmdebstrap (~35 s, ~170 MB). Reused for a day, then made again to pick up security updates.
# FRR's user and groups get fixed ids before the package is installed (its postinst keeps existing ones):
# the DaemonSet names them (deploy/overlays/evpn: the pod's supplementalGroups, so the agent may use FRR's
# vty sockets), so they must not depend on the order Debian's packages happen to allocate ids in. The ids
# must be in Debian's system range (100-999: the package's addgroup refuses a non-system group of that
# name), high in it so no package allocates them first: frr 990 (user and group), frrvty 991.
frr_rootfs=$out/.cache/bookworm-frr.tar
frr_packages=frr,frr-pythontools
frr_ids="frr=990 frrvty=991"
if [ -z "$(find "$frr_rootfs" -mtime -1 2>/dev/null)" ] || [ "$(cat "$frr_rootfs.packages" 2>/dev/null)" != "$frr_packages $frr_ids" ]; then
    mkdir -p "$out/.cache"
    # (mmdebstrap picks the output format from the name: .tar)
    mmdebstrap --quiet --variant=essential --include="$frr_packages" \
        --essential-hook='echo "frrvty:x:991:frr" >>"$1/etc/group"; echo "frr:x:990:" >>"$1/etc/group"; echo "frr:x:990:990:Frr routing suite:/nonexistent:/usr/sbin/nologin" >>"$1/etc/passwd"' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        bookworm "$out/.cache/partial.tar" \
        "deb http://deb.debian.org/debian bookworm main" \
        "deb http://deb.debian.org/debian bookworm-updates main" \
        "deb http://deb.debian.org/debian-security bookworm-security main"
    mv "$out/.cache/partial.tar" "$frr_rootfs"
    echo "$frr_packages $frr_ids" >"$frr_rootfs.packages"
fi

buildah=(buildah --root "$PWD/$out/.buildah/root" --runroot "$PWD/$out/.buildah/run" --storage-driver vfs)
mkdir -p "$out"
for component in configurator agent agent-frr; do
    name=netwave-$component
    context=$out/.context/$name
    rm -rf "$context" && mkdir -p "$context"
    cp "$(bin_of "${component%-frr}")" "$context/"
    if [ "$component" = agent-frr ]; then
        ln "$frr_rootfs" "$context/rootfs.tar"
        cp images/agent-frr/netwave-frr "$context/"
    fi
    "${buildah[@]}" build --quiet --isolation chroot --timestamp "$created" --identity-label=false \
        --build-arg VERSION="$version" --build-arg REVISION="$revision" --build-arg SOURCE="$source_url" \
        -f "images/$component/Dockerfile" -t "localhost/$name:$tag" "$context" >/dev/null
    rm -rf "${out:?}/$name"
    "${buildah[@]}" push --quiet "localhost/$name:$tag" "oci:$out/$name:$tag"
    "${buildah[@]}" rmi "localhost/$name:$tag" >/dev/null
    size=$(du -sh --apparent-size "$out/$name/blobs" | cut -f1)
    echo "images: $name:$tag -> $out/$name (OCI layout, $size compressed)"
done
rm -rf "$out/.context"
echo "images: done in $(($(date +%s) - start)) s"

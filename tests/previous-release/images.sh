#!/usr/bin/env bash
# The previous release's images, for the real node's upgrade test (tests/tests/real_node_upgrade.rs): the
# release's own binaries (tests/previous-release/build.sh) in the release's own image definitions
# (images/<name>/ at its commit), as OCI layouts in the release's cache directory. Does nothing when they
# are there.
#
#   bash tests/previous-release/images.sh     # build or reuse; prints the release's cache directory, whose
#                                             # images/<name>/ are OCI layouts tagged v<version>
#
# Only the two images the EVPN install runs: netwave-configurator and netwave-agent-frr.
#
# What differs from the release as it was cut, and why: its images/build.sh links release binaries,
# ~10 more minutes of a cold CI run for a second build of the same sources; these carry the debug build
# the skew tests use (static too, so the same `FROM scratch` images run it). The FRR root filesystem is
# the one `make images` made for this tree, checked to come from the same recipe (the same Debian
# packages and FRR ids in both build scripts): this fails when the recipes part, rather than install
# an FRR the release never shipped with.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cache="$(bash "$root/tests/previous-release/build.sh")"
commit="$(awk -F'"' '/^commit = /{c=$2} END{print c}' "$root/releases.toml")"
version="$(awk -F'"' '/^version = /{v=$2} END{print v}' "$root/releases.toml")"
tag=v$version
images=(configurator agent-frr)

exec 9>"$cache/.images.lock"
flock 9
done=yes
for component in "${images[@]}"; do
    [ -f "$cache/images/netwave-$component/index.json" ] || done=no
done
if [ $done = yes ]; then
    echo "$cache"
    exit 0
fi

start=$(date +%s)
for tool in buildah git; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "previous-release images: $tool is missing (tools/deps.sh installs it)" >&2
        exit 1
    fi
done
rootfs="${CARGO_TARGET_DIR:-$root/target}/images/.cache/bookworm-frr.tar"
if [ ! -f "$rootfs" ]; then
    echo "previous-release images: $rootfs is missing: run \`make images\` first (make test does)" >&2
    exit 1
fi
recipe_of() { grep -E '^frr_(packages|ids)=' ; }
if [ "$(git -C "$root" show "$commit:images/build.sh" | recipe_of)" != "$(recipe_of <"$root/images/build.sh")" ]; then
    echo "previous-release images: FRR's root filesystem is made differently at $commit than in this tree" \
        "(frr_packages/frr_ids in images/build.sh): build the release's own (its images/build.sh)" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
buildah=(buildah --root "$work/buildah/root" --runroot "$work/buildah/run" --storage-driver vfs)
created=$(git -C "$root" log -1 --format=%ct "$commit")
rm -rf "$cache/images.tmp"
mkdir -p "$cache/images.tmp"
for component in "${images[@]}"; do
    name=netwave-$component
    bin=netwave-${component%-frr}
    context=$work/context/$name
    mkdir -p "$context"
    git -C "$root" archive "$commit" "images/$component" | tar -x -C "$work/context" --strip-components=1
    mv "$work/context/$component"/* "$context/"
    cp "$cache/bin/$bin" "$context/"
    if [ "$component" = agent-frr ]; then
        ln "$rootfs" "$context/rootfs.tar" 2>/dev/null || cp "$rootfs" "$context/rootfs.tar"
    fi
    "${buildah[@]}" build --quiet --isolation chroot --timestamp "$created" --identity-label=false \
        --build-arg VERSION="$version" --build-arg REVISION="$commit" \
        --build-arg SOURCE=https://github.com/netwave/netwave \
        -f "$context/Dockerfile" -t "localhost/$name:$tag" "$context" >/dev/null
    "${buildah[@]}" push --quiet "localhost/$name:$tag" "oci:$cache/images.tmp/$name:$tag"
    echo "previous-release images: $name:$tag -> $cache/images/$name" >&2
done
"${buildah[@]}" rm --all >/dev/null 2>&1 || true
"${buildah[@]}" rmi --all --force >/dev/null 2>&1 || true
rm -rf "$cache/images"
mv "$cache/images.tmp" "$cache/images"
echo "previous-release images: $version's images in $(($(date +%s) - start)) s" >&2
echo "$cache"

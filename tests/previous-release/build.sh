#!/usr/bin/env bash
# Builds the previous release — the newest entry of releases.toml — from its commit into a cache outside
# the repository, and does nothing when it is already there. The skew and upgrade tests run its binaries
# beside the working tree's and install its CRDs over the working tree's objects.
#
#   bash tests/previous-release/build.sh      # build or reuse; prints the directory
#                                             # (bin/, crds/, deploy/, build-info)
#
# The commit must be in this clone's history (it is an ancestor of main). It is checked out into a
# temporary git worktree; the build uses its own target directory in the cache, shared by later releases
# so their dependencies are reused. The binaries are debug builds (the tests need behaviour, not speed,
# and a debug build is ~2x faster on 2 cores than a release one), linked statically like the release's
# images (glibc's crt-static): the skew tests run them on this host, and tests/previous-release/images.sh
# puts the same files in the release's own images for the real node. Cold: ~8-11 min on 2 cores; cached:
# nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"

# The newest [[release]] of releases.toml: its version and commit.
version="$(awk -F'"' '/^version = /{v=$2} END{print v}' "$root/releases.toml")"
commit="$(awk -F'"' '/^commit = /{c=$2} END{print c}' "$root/releases.toml")"
if [ -z "$version" ] || [ -z "$commit" ]; then
    echo "previous-release: releases.toml names no release (version and commit)" >&2
    exit 1
fi
base="${NETWAVE_CACHE:-$HOME/.cache/netwave}/releases"
cache="$base/$version-${commit:0:12}"
# Several tests may ask at once (the skew tests run side by side): one builds, the others wait for it and
# then find it cached. Without the lock, two cold builds shared one temporary directory.
mkdir -p "$base"
exec 9>"$base/.build.lock"
flock 9
# How the binaries are built: a cache made another way (before the images needed static binaries) is
# built again.
recipe="debug, static (crt-static), line tables only"
if [ -x "$cache/bin/netwave-agent" ] && [ -x "$cache/bin/netwave-configurator" ] && [ -f "$cache/build-info" ] &&
    [ "$(cat "$cache/recipe" 2>/dev/null)" = "$recipe" ]; then
    echo "$cache"
    exit 0
fi
if ! git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "previous-release: commit $commit of release $version is not in this clone's history (git fetch it)" >&2
    exit 1
fi

start=$(date +%s)
work="$(mktemp -d)"
cleanup() {
    git -C "$root" worktree remove --force "$work/src" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
git -C "$root" worktree add --detach "$work/src" "$commit" >/dev/null 2>&1
echo "previous-release: building netwave $version (commit ${commit:0:12}) into $cache" >&2
# As images/build.sh links them: an explicit --target keeps the flag off build scripts and proc macros.
# Line tables only: backtraces keep their file and line, the binaries and the build are smaller.
triple=x86_64-unknown-linux-gnu
RUSTFLAGS="-C target-feature=+crt-static" CARGO_PROFILE_DEV_DEBUG=line-tables-only \
    CARGO_TARGET_DIR="$base/target" "${CARGO:-cargo}" build -q --locked --target "$triple" \
    --manifest-path "$work/src/Cargo.toml" \
    -p netwave-agent -p netwave-configurator -p netwave-testbed --bins >&2

rm -rf "$cache.tmp"
mkdir -p "$cache.tmp/bin"
for b in netwave-agent netwave-configurator netwave-testbed; do
    cp "$base/target/$triple/debug/$b" "$cache.tmp/bin/$b"
done
# The release's CRDs (installed over this tree's objects) and its manifests (the real node installs
# them: deploy/ refers to ../../crds, so both keep their places).
cp -r "$work/src/crds" "$cache.tmp/crds"
cp -r "$work/src/deploy" "$cache.tmp/deploy"
echo "$recipe" >"$cache.tmp/recipe"
# The host-triple debug build of the recipe before this one: 1.5 GB nothing uses any more.
rm -rf "$base/target/debug"
echo "netwave $version (commit $commit), $recipe, built in $(($(date +%s) - start)) s on $(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    >"$cache.tmp/build-info"
rm -rf "$cache"
mv "$cache.tmp" "$cache"
echo "$cache"

#!/usr/bin/env bash
# Builds gitops-health (main.go beside this script: kstatus from sigs.k8s.io/cli-utils and Argo CD's
# health.lua run in gopher-lua, for the tests of #50) from Go modules (go.mod, go.sum committed) into a
# cache outside the repo, keyed by a hash of its sources; does nothing when that binary exists. Prints
# the binary's path. Cold: ~40 s on 2 cores (k8s.io/apimachinery), plus the module download.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
key="$(cat "$here"/go.mod "$here"/go.sum "$here"/main.go | sha256sum | cut -c1-12)"
out="${NETWAVE_CACHE:-$HOME/.cache/netwave}/gitops-health/$key/gitops-health"
if [ -x "$out" ]; then
    echo "$out"
    exit 0
fi
if ! command -v go >/dev/null 2>&1; then
    echo "gitops-health: go is not installed; cannot build the kstatus and Argo CD health checker" >&2
    exit 1
fi
mkdir -p "$(dirname "$out")"
start=$(date +%s)
# GOTOOLCHAIN=local: never download another Go; -mod=readonly: go.sum is committed, nothing is resolved.
(cd "$here" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly go build -trimpath -o "$out.tmp" .)
mv "$out.tmp" "$out"
echo "gitops-health: built in $(($(date +%s) - start)) s ($(go env GOVERSION))" >&2
echo "$out"

#!/usr/bin/env bash
# Builds Flux's source-controller and kustomize-controller v1.9.6 (the newest Flux that builds on this
# machine's Go: ../shared/docs/GITOPS.md, recipe B: go.mod's `tool` lines and the replace lines of the
# controllers' own go.mod) and git-http (beside this script) into a cache outside the repo, keyed by a
# hash of go.mod, go.sum and git-http's source, with the controllers' CRDs copied from their module
# source. Does nothing when they exist. Prints the directory. Cold: ~8 min on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
key="$(cat "$here"/go.mod "$here"/go.sum "$here"/git-http/main.go "$0" | sha256sum | cut -c1-12)"
dir="${NETWAVE_CACHE:-$HOME/.cache/netwave}/flux/$key"
if [ -f "$dir/done" ]; then
    echo "$dir"
    exit 0
fi
for tool in go git; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "flux: $tool is not installed; cannot build Flux for the many-clusters test" >&2
        exit 1
    fi
done
mkdir -p "$dir/crds"
start=$(date +%s)
# GOTOOLCHAIN=local: never download another Go; -mod=readonly: go.sum is committed, nothing is resolved.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly
cd "$here"
for c in source-controller kustomize-controller; do
    go build -trimpath -o "$dir/$c" "github.com/fluxcd/$c"
    src="$(go list -m -f "{{.Dir}}" "github.com/fluxcd/$c")"
    cp "$src"/config/crd/bases/*.yaml "$dir/crds/"
done
go build -trimpath -o "$dir/git-http" ./git-http
touch "$dir/done"
echo "flux: built in $(($(date +%s) - start)) s ($(go env GOVERSION))" >&2
echo "$dir"

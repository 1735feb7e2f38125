#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tests run against — kube-apiserver, etcd and a matching kubectl — and
# the node components of the real-node tier (kube-controller-manager, kube-scheduler, kubelet, kube-proxy) from Go
# modules (`kubernetes/go.mod`, `etcd/go.mod`, their go.sum committed) into a cache outside the repo,
# and does nothing when the binaries for exactly these go.mod/go.sum files are already there.
#
#   bash tests/control-plane/build.sh          # build or reuse; prints the directory holding the binaries
#
# kubectl is built from the same release, so the admin's client matches the server.
# The cache directory is keyed by the versions and a hash of the module files, so a version bump builds
# into a new directory and never reuses stale binaries. `build-info` beside the binaries records the
# versions and how long the build took; the test harness prints it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

# The one place the versions live (the go.mod files must agree; checked below).
K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
# The Prometheus operator's CRDs (PrometheusRule, ServiceMonitor), so deploy/monitoring is applied to the
# server with the schema a cluster running the operator has. Its Go module carries them as YAML.
PROMETHEUS_OPERATOR_VERSION=v0.85.0

for f in kubernetes/go.mod etcd/go.mod; do
    case "$f" in
    kubernetes/*) want="k8s.io/kubernetes $K8S_VERSION" ;;
    etcd/*) want="go.etcd.io/etcd/server/v3 $ETCD_VERSION" ;;
    esac
    if ! grep -q "$want" "$here/$f"; then
        echo "control-plane: $f does not require $want (bump the version here and in go.mod together)" >&2
        exit 1
    fi
done

key="$(cat "$here"/kubernetes/go.{mod,sum} "$here"/etcd/go.{mod,sum} | sha256sum | cut -c1-12)"
cache="${NETWAVE_CACHE:-$HOME/.cache/netwave}/control-plane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-$key"

# Copies the operator's CRDs into the cache (a download of ~4 MB, checked against the Go checksum database).
fetch_crds() {
    local dest="$1/crds/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
    [ -d "$dest" ] && return 0
    local dir
    dir="$(cd "$here/etcd" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json \
        "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
        sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    mkdir -p "$dest.tmp"
    cp "$dir"/example/prometheus-operator-crd/monitoring.coreos.com_{prometheusrules,servicemonitors}.yaml "$dest.tmp/"
    chmod u+w "$dest.tmp"/*
    mv "$dest.tmp" "$dest"
}

NODE_COMPONENTS=(kube-controller-manager kube-scheduler kubelet kube-proxy)
complete=1
for b in kube-apiserver kubectl etcd "${NODE_COMPONENTS[@]}"; do [ -x "$cache/$b" ] || complete=""; done
if [ -n "$complete" ] && [ -f "$cache/build-info" ]; then
    fetch_crds "$cache"
    echo "$cache"
    exit 0
fi

if ! command -v go >/dev/null 2>&1; then
    echo "control-plane: go is not installed; cannot build kube-apiserver and etcd" >&2
    exit 1
fi

# GOTOOLCHAIN=local: never download another Go; -mod=readonly: go.sum is committed, nothing is resolved.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly
mkdir -p "$cache.tmp"
start=$(date +%s)

echo "control-plane: building etcd $ETCD_VERSION (go $(go env GOVERSION))" >&2
(cd "$here/etcd" && go build -trimpath -o "$cache.tmp/etcd" go.etcd.io/etcd/server/v3)
etcd_done=$(date +%s)

echo "control-plane: building kube-apiserver $K8S_VERSION (cold: ~15 min on 2 cores)" >&2
minor="${K8S_VERSION#v1.}"
minor="${minor%%.*}"
X="-X k8s.io/component-base/version"
Y="-X k8s.io/client-go/pkg/version"
(cd "$here/kubernetes" && go build -trimpath -tags selinux,notest \
    -ldflags "-s -w $X.gitVersion=$K8S_VERSION $X.gitMajor=1 $X.gitMinor=$minor $X.gitTreeState=clean $Y.gitVersion=$K8S_VERSION $Y.gitMajor=1 $Y.gitMinor=$minor" \
    -o "$cache.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
apiserver_done=$(date +%s)

# kubectl from the same release: the admin's client, without version skew against the server.
echo "control-plane: building kubectl $K8S_VERSION" >&2
(cd "$here/kubernetes" && go build -trimpath \
    -ldflags "-s -w $X.gitVersion=$K8S_VERSION $X.gitMajor=1 $X.gitMinor=$minor $X.gitTreeState=clean $Y.gitVersion=$K8S_VERSION $Y.gitMajor=1 $Y.gitMinor=$minor" \
    -o "$cache.tmp/kubectl" k8s.io/kubernetes/cmd/kubectl)
kubectl_done=$(date +%s)

# The node components of the real-node tier, same release and module graph (a warm build cache shares most
# packages with kube-apiserver: ~3 min on 2 cores).
echo "control-plane: building ${NODE_COMPONENTS[*]} $K8S_VERSION" >&2
for c in "${NODE_COMPONENTS[@]}"; do
    (cd "$here/kubernetes" && go build -trimpath -tags selinux,notest \
        -ldflags "-s -w $X.gitVersion=$K8S_VERSION $X.gitMajor=1 $X.gitMinor=$minor $X.gitTreeState=clean $Y.gitVersion=$K8S_VERSION $Y.gitMajor=1 $Y.gitMinor=$minor" \
        -o "$cache.tmp/$c" "k8s.io/kubernetes/cmd/$c")
done
end=$(date +%s)

cat >"$cache.tmp/build-info" <<EOF
kube-apiserver $K8S_VERSION, etcd $ETCD_VERSION, built with $(go env GOVERSION) in $((end - start)) s (etcd $((etcd_done - start)) s, kube-apiserver $((apiserver_done - etcd_done)) s, kubectl $((kubectl_done - apiserver_done)) s, node components $((end - kubectl_done)) s) on $(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
fetch_crds "$cache.tmp"
rm -rf "$cache"
mv "$cache.tmp" "$cache"
echo "control-plane: $(cat "$cache/build-info")" >&2
echo "$cache"

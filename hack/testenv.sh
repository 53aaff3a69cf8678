#!/usr/bin/env bash
# Provisions the test control plane binaries (etcd, kube-apiserver, kube-controller-manager,
# kubectl, helm, the LeaderWorkerSet controller and its CRD) and Prometheus into a cache outside
# the repo, reused when present.
# Prints the bin directory on its last line of stdout. See docs/testenv.md.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
HELM_VERSION=${HELM_VERSION:-v4.3.2}
# Pinned by hack/testbin/lws/go.mod (the controller is built from it, the CRD copied from it).
LWS_VERSION=v0.7.0
ENVTEST_TIMEOUT=${ENVTEST_TIMEOUT:-60}

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${PD_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/testbin}
bin_dir="$cache_root/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION"
mkdir -p "$bin_dir"
log() { echo "testenv: $*" >&2; }

have() { [ -x "$bin_dir/$1" ]; }

build_env=(GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod)
build_tags=selinux,notest,grpcnotrace

try_envtest_download() {
  # Works for users with internet: envtest ships etcd, kube-apiserver and kubectl (not the
  # controller-manager, which is always built). Bounded so that offline machines move on quickly.
  local minor=${K8S_VERSION#v}; minor=${minor%.*}
  log "trying a prebuilt envtest download for $minor.x (timeout ${ENVTEST_TIMEOUT}s)"
  local dir
  dir=$(timeout "$ENVTEST_TIMEOUT" go run sigs.k8s.io/controller-runtime/tools/setup-envtest@v0.25.1 \
        use "$minor.x" --bin-dir "$cache_root/envtest" -p path 2>/dev/null) || return 1
  [ -x "$dir/kube-apiserver" ] || return 1
  cp "$dir/etcd" "$dir/kube-apiserver" "$dir/kubectl" "$bin_dir/"
  log "using envtest binaries from $dir"
}

build_kubernetes() {
  local cmd=$1 minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local pkg=k8s.io/kubernetes/component-base
  local ldflags="-s -w"
  for kv in "gitVersion=$K8S_VERSION" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" \
            "buildDate=1970-01-01T00:00:00Z"; do
    ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  log "building $cmd $K8S_VERSION from the Go module proxy"
  (cd "$here/testbin/kubernetes" && env "${build_env[@]}" go build -trimpath -tags="$build_tags" \
     -ldflags="$ldflags" -o "$bin_dir/$cmd" "k8s.io/kubernetes/cmd/$cmd")
}

build_etcd() {
  log "building etcd $ETCD_VERSION from the Go module proxy"
  (cd "$here/testbin/etcd" && env "${build_env[@]}" go build -trimpath -ldflags="-s -w" \
     -o "$bin_dir/etcd" go.etcd.io/etcd/server/v3)
}

build_helm() {
  log "building helm $HELM_VERSION from the Go module proxy"
  GOBIN="$bin_dir" env "${build_env[@]}" go install -trimpath -ldflags="-s -w" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
}

build_lws() {
  local t0
  t0=$(date +%s)
  log "building lws-controller $LWS_VERSION from the Go module proxy"
  (cd "$here/testbin/lws" && env "${build_env[@]}" go build -trimpath \
     -ldflags="-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION" \
     -o "$bin_dir/lws-controller" sigs.k8s.io/lws/cmd)
  log "built lws-controller in $(( $(date +%s) - t0 ))s"
}

copy_lws_manifests() {
  # The CRD and webhook configurations from the module the controller is built from, so that
  # the schema and the webhooks always match the code (pd_tools/localcluster/lws.py reads them).
  local dir tmp=$bin_dir/lws-manifests.tmp
  dir=$(cd "$here/testbin/lws" && env "${build_env[@]}" go list -m -f '{{.Dir}}' sigs.k8s.io/lws)
  rm -rf "$tmp" && mkdir -p "$tmp/crd" "$tmp/webhook"
  cp "$dir"/config/crd/bases/*.yaml "$tmp/crd/"
  cp "$dir"/config/webhook/{manifests,mutating-patch,validating-patch}.yaml "$tmp/webhook/"
  chmod -R u+w "$tmp"
  mv "$tmp" "$bin_dir/lws-manifests"
}

ensure_prometheus() {
  if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's prometheus package"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    # The package would start a system service; tests start their own Prometheus on ephemeral
    # ports. Debian's policy-rc.d (exit 101: "action forbidden") keeps the service from starting
    # at all, so nothing has to be stopped afterwards (and no other Prometheus is touched).
    local policy=/usr/sbin/policy-rc.d made_policy=""
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2 || {
      [ -n "$made_policy" ] && rm -f "$policy"; return 1; }
    [ -n "$made_policy" ] && rm -f "$policy"
    # Without systemd (containers, CI) the package's service is started by nothing else; with
    # it, keep it from starting at boot.
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
      systemctl disable prometheus >/dev/null 2>&1 || true
    fi
  else
    log "prometheus not found: run 'sudo apt-get install prometheus' (Debian/Ubuntu) or put prometheus and promtool on PATH"
    return 1
  fi
}

start=$(date +%s)
if ! { have etcd && have kube-apiserver && have kubectl; }; then
  if [ "${PD_TESTENV_SKIP_DOWNLOAD:-}" = 1 ] || ! try_envtest_download; then
    have etcd || build_etcd
    have kube-apiserver || build_kubernetes kube-apiserver
    have kubectl || build_kubernetes kubectl
  fi
fi
have kube-controller-manager || build_kubernetes kube-controller-manager
have helm || build_helm
have lws-controller || build_lws
[ -d "$bin_dir/lws-manifests" ] || copy_lws_manifests
ensure_prometheus
elapsed=$(( $(date +%s) - start ))
[ "$elapsed" -gt 5 ] && log "provisioned in ${elapsed}s"
echo "$bin_dir"

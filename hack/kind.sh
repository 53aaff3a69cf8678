#!/usr/bin/env bash
# kind workflows (docs/kind.md):
#   hack/kind.sh up    kind cluster shaped like config/clusters/articles.yaml (make kind-up, which
#                      runs hack/kindenv.sh build first: Docker engine, kind, node image)
#   hack/kind.sh e2e   the cluster when there is none, the images (hack/kind-images.sh), the
#                      Prometheus of config/kind/prometheus.yaml, helm install of the chart, then
#                      pytest tests/kind: a load through the router breaches TTFT, the operator
#                      adds prefill, a replica that does not fit stays Pending (make kind-e2e)
# Exit 2, saying what is missing, when docker, kind, kubectl or helm is not available.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${KIND_CLUSTER:-pd-operator}
DOCKER=${DOCKER:-docker}
kindenv_env=${PD_KIND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/kind}/run/kindenv.env
kindenv_kind=$( [ -f "$kindenv_env" ] && sed -n 's/^KIND=//p' "$kindenv_env" || true)
KIND=${KIND:-${kindenv_kind:-kind}}
PYTHON=${PYTHON_BIN:-.venv/bin/python}
# config/kind/prometheus.yaml's Service, as the operator pod reaches it.
PROMETHEUS_IN_CLUSTER=http://prometheus.pd-monitoring.svc:9090
LOG_NAME="kind-e2e"
# shellcheck source=hack/lib/timed-steps.sh
. hack/lib/timed-steps.sh

missing() {
  echo "kind: $1" >&2
  echo "kind: Docker: https://docs.docker.com/engine/install/ ; kind: https://kind.sigs.k8s.io/docs/user/quick-start/#installation" >&2
  exit 2
}

find_tool() {
  local name=$1 cache=${PD_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/testbin}
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
  if [ -n "${PD_TESTBIN:-}" ] && [ -x "$PD_TESTBIN/$name" ]; then echo "$PD_TESTBIN/$name"; return; fi
  local found
  found=$(ls -d "$cache"/k8s-*/"$name" 2>/dev/null | sort | tail -n 1 || true)
  [ -n "$found" ] && echo "$found"
}

require_docker_and_kind() {
  command -v "$DOCKER" >/dev/null 2>&1 || missing "'$DOCKER' not found: kind runs its nodes as Docker containers."
  command -v "$KIND" >/dev/null 2>&1 || missing "'$KIND' not found."
  "$DOCKER" info >/dev/null 2>&1 || missing "the Docker daemon does not answer ('$DOCKER info' failed)."
}

cluster_exists() { "$KIND" get clusters 2>/dev/null | grep -x "$CLUSTER" >/dev/null; }

up() {
  require_docker_and_kind  # `make kind-up` runs `make kindenv` first, which provides both
  # The cluster on the pinned network, with the node image and CNI of kindenv, all nodes Ready.
  KIND_CLUSTER=$CLUSTER bash hack/kindenv.sh up
  "${MAKE:-make}" --no-print-directory install  # kind_mode runs from the project's .venv
  "$PYTHON" -m pd_tools.simcluster.kind_mode config/clusters/articles.yaml \
    --kubeconfig "$(sed -n 's/^KUBECONFIG_FILE=//p' "$kindenv_env")"
}

e2e() {
  require_docker_and_kind
  "${MAKE:-make}" --no-print-directory install
  local kubectl helm
  kubectl=$(find_tool kubectl) || true
  helm=$(find_tool helm) || true
  [ -n "$kubectl" ] || missing "kubectl not found (PATH or 'make testenv')."
  [ -n "$helm" ] || missing "helm not found (PATH or 'make testenv')."
  if cluster_exists && ! "$DOCKER" port "$CLUSTER-control-plane" 30080/tcp >/dev/null 2>&1; then
    echo "kind: cluster '$CLUSTER' publishes no port 30080 (made from an older config/kind/kind-cluster.yaml): make kind-down, then again" >&2
    exit 1
  fi
  cluster_exists || step "cluster (make kind-up)" up
  local context="kind-$CLUSTER" kubeconfig
  kubeconfig=$(sed -n 's/^KUBECONFIG_FILE=//p' "$kindenv_env")
  k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }

  step "images (make kind-images)" bash hack/kind-images.sh build
  local operator_image; operator_image=$(bash hack/kind-images.sh tags | sed -n 1p)
  # kind-up's tooling applied the CRD already (server-side, outside Helm): keep it out of the
  # release (crds.install=false) and update it the way such installs do (docs/install.md).
  k apply --server-side --force-conflicts -f crds/ >/dev/null
  step "Prometheus (config/kind/prometheus.yaml)" prometheus
  # The image's ID as a pod annotation: a rebuilt image under the same tag rolls the pod.
  local image_id; image_id=$("$DOCKER" image inspect -f '{{.Id}}' "$operator_image")
  step "helm install (operator pod)" "$helm" upgrade --install pd-operator charts/pd-operator \
    --kubeconfig "$kubeconfig" --kube-context "$context" \
    --namespace pd-operator-system --create-namespace --set crds.install=false \
    --set image.repository="${operator_image%:*}" --set image.tag="${operator_image##*:}" \
    --set image.pullPolicy=Never --set prometheusUrl="$PROMETHEUS_IN_CLUSTER" \
    --set-string "podAnnotations.pdoperator\.io/image-id=$image_id" --wait --timeout 3m
  local t0=$SECONDS rc=0
  PD_KIND_KUBECONFIG=$kubeconfig "$PYTHON" -m pytest tests/kind -p no:cacheprovider -v -s || rc=$?
  record "pytest tests/kind" "$t0"
  print_summary
  [ "$rc" = 0 ] || { echo "kind-e2e: FAILED (the cluster is kept: kubectl --context $context -n pd-e2e get all; make kind-down)" >&2; exit "$rc"; }
  echo "kind-e2e: OK (the cluster is kept; make kind-down removes it)"
}

prometheus() {
  k apply -f config/kind/prometheus.yaml >/dev/null
  k -n pd-monitoring rollout status deployment/prometheus --timeout=180s >/dev/null
}

case "${1:-}" in
  up) up ;;
  e2e) e2e ;;
  *) echo "usage: $0 up|e2e" >&2; exit 64 ;;
esac

#!/usr/bin/env bash
# kind workflows for users with Docker (the project's CI machines have none):
#   hack/kind.sh up    kind cluster shaped like config/clusters/articles.yaml (make kind-up, which
#                      runs hack/kindenv.sh build first: Docker engine, kind, node image)
#   hack/kind.sh e2e   image build, kind load, helm install, one sample reconciled (make kind-e2e)
# Exit 2, saying what is missing, when docker, kind, kubectl or helm is not available.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${KIND_CLUSTER:-pd-operator}
IMAGE=${IMAGE:-pd-operator:e2e}
DOCKER=${DOCKER:-docker}
kindenv_env=${PD_KIND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/kind}/run/kindenv.env
kindenv_kind=$( [ -f "$kindenv_env" ] && sed -n 's/^KIND=//p' "$kindenv_env" || true)
KIND=${KIND:-${kindenv_kind:-kind}}
PYTHON=${PYTHON_BIN:-.venv/bin/python}
SAMPLE=config/samples/heterogeneous-s5000-h200.yaml

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

cluster_exists() { "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; }

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
  cluster_exists || up
  local context="kind-$CLUSTER"
  k() { "$kubectl" --context "$context" "$@"; }

  "$DOCKER" build -t "$IMAGE" .
  "$KIND" load docker-image "$IMAGE" --name "$CLUSTER"
  # kind-up's tooling applied the CRD already (server-side, outside Helm): keep it out of the
  # release (crds.install=false) and update it the way such installs do (docs/install.md).
  k apply --server-side --force-conflicts -f crds/
  "$helm" upgrade --install pd-operator charts/pd-operator --kube-context "$context" \
    --namespace pd-operator-system --create-namespace --set crds.install=false \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
    --set image.pullPolicy=Never --wait --timeout 5m
  k create namespace pd-e2e --dry-run=client -o yaml | k apply -f -
  k apply -n pd-e2e -f "$SAMPLE"
  # Children and status prove the operator runs with the chart's RBAC. The engines need real
  # accelerators and multi-GB images, so Ready is not expected here.
  k wait -n pd-e2e pdd/glm-hetero --for=jsonpath='{.status.observedGeneration}'=1 --timeout=180s
  k get deployments,services -n pd-e2e -l app.kubernetes.io/managed-by=pd-operator
  k get pdd -n pd-e2e -o wide
  echo "kind-e2e: OK (clean up: kind delete cluster --name $CLUSTER)"
}

case "${1:-}" in
  up) up ;;
  e2e) e2e ;;
  *) echo "usage: $0 up|e2e" >&2; exit 64 ;;
esac

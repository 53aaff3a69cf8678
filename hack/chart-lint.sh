#!/usr/bin/env bash
# `make chart-lint`: helm lint --strict the chart, render it across the values users pick, and
# check that the copies the chart carries (CRDs, alert rules) match their sources.
# Exit 2 when helm is missing (run `make testenv`, or put helm on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

find_tool() {
  local name=$1 cache=${PD_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/testbin}
  if [ -n "${PD_TESTBIN:-}" ] && [ -x "$PD_TESTBIN/$name" ]; then echo "$PD_TESTBIN/$name"; return; fi
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
  local found
  found=$(ls -d "$cache"/k8s-*/"$name" 2>/dev/null | sort | tail -n 1 || true)
  [ -n "$found" ] && echo "$found"
}

helm=$(find_tool helm) || true
if [ -z "$helm" ]; then
  echo "chart-lint: helm not found (PD_TESTBIN, PATH or the test environment's cache)." >&2
  echo "chart-lint: run 'make testenv' (it builds helm), or install Helm >= 3.8." >&2
  exit 2
fi
chart=charts/pd-operator

echo "chart-lint: $helm lint --strict $chart"
"$helm" lint --strict "$chart"

render() { "$helm" template pd-operator "$chart" --namespace pd-operator-system "$@" >/dev/null; }
echo "chart-lint: helm template (default, watchNamespaces, monitoring, CRDs managed elsewhere)"
render
render --set 'watchNamespaces={team-a,team-b}'
render --set serviceMonitor.enabled=true --set prometheusRule.enabled=true \
  --set grafanaDashboard.enabled=true --set engineMonitor.enabled=true
render --set crds.install=false
if render --set unknownKey=1 2>/dev/null; then
  echo "chart-lint: values.schema.json accepted an unknown key" >&2; exit 1
fi

echo "chart-lint: the chart's copies match their sources"
diff -r crds "$chart/files/crds" || {
  echo "chart-lint: fix with: cp crds/*.yaml $chart/files/crds/" >&2; exit 1; }
cmp deploy/prometheus/pd-operator-rules.yaml "$chart/files/pd-operator-rules.yaml" || {
  echo "chart-lint: fix with: cp deploy/prometheus/pd-operator-rules.yaml $chart/files/" >&2; exit 1; }

if command -v promtool >/dev/null 2>&1; then
  promtool check rules deploy/prometheus/pd-operator-rules.yaml
  (cd deploy/prometheus && promtool test rules pd-operator-rules.test.yaml)
else
  echo "chart-lint: promtool not found: alert rules not checked ('make testenv' installs it)"
fi
echo "chart-lint: OK"

"""Shared PDDeployment documents for the validation tests (unit and against the apiserver)."""

import copy
from pathlib import Path
from typing import Any

import yaml

from pd_operator.core.reconcile import ANNOTATION_DESIRED_REPLICAS

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "config" / "samples").glob("*.yaml"))
CRD_PATH = ROOT / "crds" / "pdoperator.io_pddeployments.yaml"


def load_sample(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def minimal() -> dict[str, Any]:
    """The smallest valid PDDeployment: everything else comes from defaults."""
    return {
        "apiVersion": "pdoperator.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": "minimal"},
        "spec": {
            "model": {"name": "m", "image": "img:1"},
            "slo": {"ttft": {"targetMilliseconds": 1000}, "itl": {"targetMilliseconds": 20}},
            "prefill": {
                "pools": [{"name": "p", "accelerator": {"resourceName": "mthreads.com/gpu"}}]
            },
            "decode": {"pools": [{"name": "d", "accelerator": {"resourceName": "nvidia.com/gpu"}}]},
        },
    }


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set a dotted path (list indexes as numbers) in a copy of doc; `...` deletes the key."""
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    key: Any = int(last) if last.isdigit() else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return doc


def mutate(path: str, value: Any) -> dict[str, Any]:
    return _set(minimal(), path, value)


POOL = {"name": "p", "accelerator": {"resourceName": "mthreads.com/gpu"}}


def schedule(**fields: Any) -> dict[str, Any]:
    """A schedule of the minimal document: 09:00-18:00 UTC, prefill pool p at least 2."""
    return {"name": "peak", "start": "09:00", "end": "18:00", "prefill": {"p": 2}} | fields


# Scale to zero on the minimal document: every pool may go to zero.
IDLE = _set(
    _set(mutate("spec.scaling.idleSeconds", 300), "spec.prefill.pools.0.replicas.min", 0),
    "spec.decode.pools.0.replicas.min",
    0,
)

# (case id, document, the field path that the error must name)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("engine-unknown", mutate("spec.model.engine", "TensorRT"), "spec.model.engine"),
    ("connector-unknown", mutate("spec.kvTransfer.connector", "Gloo"), "spec.kvTransfer.connector"),
    ("protocol-unknown", mutate("spec.kvTransfer.protocol", "UDP"), "spec.kvTransfer.protocol"),
    (
        "cache-dtype-unknown",
        mutate("spec.kvTransfer.cacheDtype", "FP4"),
        "spec.kvTransfer.cacheDtype",
    ),
    ("percentile-unknown", mutate("spec.slo.ttft.percentile", "P75"), "spec.slo.ttft.percentile"),
    ("mode-off-yaml-bool", mutate("spec.scaling.mode", False), "spec.scaling.mode"),
    (
        "ttft-target-zero",
        mutate("spec.slo.ttft.targetMilliseconds", 0),
        "spec.slo.ttft.targetMilliseconds",
    ),
    (
        "itl-target-negative",
        mutate("spec.slo.itl.targetMilliseconds", -5),
        "spec.slo.itl.targetMilliseconds",
    ),
    (
        "itl-target-float",
        mutate("spec.slo.itl.targetMilliseconds", 20.5),
        "spec.slo.itl.targetMilliseconds",
    ),
    ("window-fractional", mutate("spec.slo.windowSeconds", 60.5), "spec.slo.windowSeconds"),
    ("window-too-short", mutate("spec.slo.windowSeconds", 5), "spec.slo.windowSeconds"),
    (
        "target-as-string",
        mutate("spec.slo.ttft.targetMilliseconds", "1000"),
        "spec.slo.ttft.targetMilliseconds",
    ),
    (
        "replicas-min-negative",
        mutate("spec.prefill.pools.0.replicas", {"min": -1, "max": 2}),
        "spec.prefill.pools[0].replicas.min",
    ),
    (
        "replicas-max-zero",
        mutate("spec.decode.pools.0.replicas", {"min": 0, "max": 0}),
        "spec.decode.pools[0].replicas.max",
    ),
    (
        "replicas-min-gt-max",
        mutate("spec.prefill.pools.0.replicas", {"min": 5, "max": 2}),
        "spec.prefill.pools[0].replicas",
    ),
    (
        "per-replica-zero",
        mutate("spec.prefill.pools.0.accelerator.perReplica", 0),
        "spec.prefill.pools[0].accelerator.perReplica",
    ),
    ("duplicate-pool-names", mutate("spec.prefill.pools", [POOL, POOL]), "spec.prefill.pools"),
    ("empty-role", mutate("spec.decode.pools", []), "spec.decode.pools"),
    ("missing-role", mutate("spec.decode", ...), "spec.decode"),
    ("unknown-field", mutate("spec.model.weights", "s3://bucket"), "spec.model"),
    ("unknown-field-in-pool", mutate("spec.prefill.pools.0.gpus", 8), "spec.prefill.pools[0]"),
    (
        "pool-name-too-long",
        mutate("spec.prefill.pools.0.name", "p" * 40),
        "spec.prefill.pools[0].name",
    ),
    (
        "pool-name-not-dns",
        mutate("spec.prefill.pools.0.name", "Prefill_Pool"),
        "spec.prefill.pools[0].name",
    ),
    (
        "resource-name-invalid",
        mutate("spec.prefill.pools.0.accelerator.resourceName", "gpu cards!"),
        "spec.prefill.pools[0].accelerator.resourceName",
    ),
    (
        "node-selector-bad-key",
        mutate("spec.prefill.pools.0.accelerator.nodeSelector", {"bad key!": "x"}),
        "spec.prefill.pools[0].accelerator.nodeSelector",
    ),
    ("model-name-empty", mutate("spec.model.name", ""), "spec.model.name"),
    ("image-too-long", mutate("spec.model.image", "i" * 600), "spec.model.image"),
    ("too-many-args", mutate("spec.model.args", ["--x"] * 65), "spec.model.args"),
    (
        "ratio-min-gt-max",
        mutate("spec.scaling.prefillToDecodeRatio", {"minPercent": 300, "maxPercent": 100}),
        "spec.scaling.prefillToDecodeRatio",
    ),
    (
        "ratio-float",
        mutate("spec.scaling.prefillToDecodeRatio", {"minPercent": 1.5, "maxPercent": 100}),
        "spec.scaling.prefillToDecodeRatio.minPercent",
    ),
    (
        "interval-too-short",
        mutate("spec.scaling.intervalSeconds", 1),
        "spec.scaling.intervalSeconds",
    ),
    (
        "step-zero",
        mutate("spec.scaling.scaleUp", {"stabilizationSeconds": 0, "maxStepReplicas": 0}),
        "spec.scaling.scaleUp.maxStepReplicas",
    ),
    (
        "prometheus-url-scheme",
        mutate("spec.scaling.prometheus", {"url": "prometheus:9090"}),
        "spec.scaling.prometheus.url",
    ),
    (
        "toleration-bad-operator",
        mutate("spec.decode.pools.0.accelerator.tolerations", [{"key": "k", "operator": "In"}]),
        "spec.decode.pools[0].accelerator.tolerations[0].operator",
    ),
    (
        "memory-not-quantity",
        mutate("spec.decode.pools.0.template", {"resources": {"requests": {"memory": "lots"}}}),
        "spec.decode.pools[0].template.resources.requests.memory",
    ),
    (
        "schedule-unknown-pool",
        mutate("spec.scaling.schedules", [schedule(prefill={"s5000": 2})]),
        "spec.scaling",
    ),
    (
        "schedule-floor-over-max",
        mutate("spec.scaling.schedules", [schedule(decode={"d": 11})]),
        "spec.scaling",
    ),
    (
        "schedule-time-not-24h",
        mutate("spec.scaling.schedules", [schedule(start="9:00")]),
        "spec.scaling.schedules[0].start",
    ),
    (
        "schedule-day-unknown",
        mutate("spec.scaling.schedules", [schedule(days=["Monday"])]),
        "spec.scaling.schedules[0].days[0]",
    ),
    (
        "schedule-floor-negative",
        mutate("spec.scaling.schedules", [schedule(prefill={"p": -1})]),
        "spec.scaling.schedules[0].prefill",
    ),
    (
        "schedule-duplicate-names",
        mutate("spec.scaling.schedules", [schedule(), schedule()]),
        "spec.scaling.schedules",
    ),
    (
        "seasonal-period-unknown",
        mutate("spec.scaling.seasonal", {"period": "Month"}),
        "spec.scaling.seasonal.period",
    ),
    (
        "seasonal-no-season",
        mutate("spec.scaling.seasonal", {"seasons": 0}),
        "spec.scaling.seasonal.seasons",
    ),
    (
        "seasonal-too-many-seasons",
        mutate("spec.scaling.seasonal", {"seasons": 9}),
        "spec.scaling.seasonal.seasons",
    ),
    (
        "schedule-time-zone-a-path",
        mutate("spec.scaling.schedules", [schedule(timeZone="../../etc/passwd")]),
        "spec.scaling.schedules[0].timeZone",
    ),
    (
        "seasonal-time-zone-with-spaces",
        mutate("spec.scaling.seasonal", {"timeZone": "Asia/Shanghai time"}),
        "spec.scaling.seasonal.timeZone",
    ),
    (
        "router-replicas-min-over-max",
        mutate("spec.router.replicas", {"min": 3, "max": 2}),
        "spec.router.replicas",
    ),
    (
        "router-service-account",
        mutate("spec.router.template", {"serviceAccountName": "admin"}),
        "spec.router.template",
    ),
    (
        "router-policy-unknown",
        mutate("spec.router.prefillPolicy", "LeastLatency"),
        "spec.router.prefillPolicy",
    ),
    ("name-not-dns-label", mutate("metadata.name", "GLM.Hetero"), "metadata.name"),
    ("name-too-long", mutate("metadata.name", "g" * 64), "metadata.name"),
    # A raw JSON client's whole float where a CEL rule reads an integer.
    (
        "replicas-min-whole-float",
        mutate("spec.prefill.pools.0.replicas", {"min": 1.0, "max": 2}),
        "spec.prefill.pools[0].replicas.min",
    ),
    (
        "ratio-max-whole-float",
        mutate("spec.scaling.prefillToDecodeRatio", {"minPercent": 100, "maxPercent": 200.0}),
        "spec.scaling.prefillToDecodeRatio.maxPercent",
    ),
    (
        "router-replicas-whole-float",
        mutate("spec.router.replicas", {"min": 1, "max": 2.0}),
        "spec.router.replicas.max",
    ),
    (
        "schedule-floor-whole-float",
        mutate("spec.scaling.schedules", [schedule(prefill={"p": 2.0})]),
        "spec.scaling.schedules[0].prefill",
    ),
    (
        "scale-down-window-whole-float",
        mutate("spec.scaling.scaleDown", {"stabilizationSeconds": 300.0, "maxStepReplicas": 1}),
        "spec.scaling.scaleDown.stabilizationSeconds",
    ),
    ("router-enabled-a-string", mutate("spec.router.enabled", "true"), "spec.router.enabled"),
    (
        "budget-enabled-a-number",
        mutate("spec.disruptionBudget.enabled", 1),
        "spec.disruptionBudget.enabled",
    ),
    (
        "budget-enabled-yes",
        mutate("spec.disruptionBudget.enabled", "yes"),
        "spec.disruptionBudget.enabled",
    ),
    (
        "shm-size-not-quantity",
        mutate("spec.decode.pools.0.template", {"shmSize": "lots"}),
        "spec.decode.pools[0].template.shmSize",
    ),
    (
        "router-shm-size",
        mutate("spec.router.template", {"shmSize": "1Gi"}),
        "spec.router.template",
    ),
    # What the apiserver refuses in the pool's Deployment (issue #28's fuzz test found these).
    (
        "toleration-keyless-equal",
        mutate("spec.prefill.pools.0.accelerator.tolerations", [{"effect": "NoSchedule"}]),
        "spec.prefill.pools[0].accelerator.tolerations[0].operator",
    ),
    (
        "toleration-exists-with-value",
        mutate(
            "spec.prefill.pools.0.accelerator.tolerations",
            [{"key": "k", "operator": "Exists", "value": "v"}],
        ),
        "spec.prefill.pools[0].accelerator.tolerations[0].value",
    ),
    (
        "toleration-seconds-without-no-execute",
        mutate(
            "spec.prefill.pools.0.accelerator.tolerations",
            [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 30}],
        ),
        "spec.prefill.pools[0].accelerator.tolerations[0].tolerationSeconds",
    ),
    (
        "toleration-key-not-qualified",
        mutate(
            "spec.prefill.pools.0.accelerator.tolerations",
            [{"key": "bad key!", "operator": "Exists"}],
        ),
        "spec.prefill.pools[0].accelerator.tolerations[0].key",
    ),
    (
        "toleration-value-not-label-value",
        mutate("spec.prefill.pools.0.accelerator.tolerations", [{"key": "k", "value": "a b"}]),
        "spec.prefill.pools[0].accelerator.tolerations[0].value",
    ),
    (
        "toleration-seconds-over-int64",
        mutate(
            "spec.prefill.pools.0.accelerator.tolerations",
            [{"key": "k", "effect": "NoExecute", "tolerationSeconds": 2**63}],
        ),
        "spec.prefill.pools[0].accelerator.tolerations[0].tolerationSeconds",
    ),
    (
        "label-value-with-space",
        mutate("spec.prefill.pools.0.template", {"labels": {"app": "with space"}}),
        "spec.prefill.pools[0].template.labels",
    ),
    (
        "node-selector-value-not-ascii",
        mutate("spec.prefill.pools.0.accelerator.nodeSelector", {"k": "模型"}),
        "spec.prefill.pools[0].accelerator.nodeSelector",
    ),
    (
        "node-selector-value-leading-dash",
        mutate("spec.prefill.pools.0.accelerator.nodeSelector", {"k": "-a"}),
        "spec.prefill.pools[0].accelerator.nodeSelector",
    ),
    (
        "label-key-name-over-63",
        mutate("spec.prefill.pools.0.template", {"labels": {"a" * 64: "v"}}),
        "spec.prefill.pools[0].template.labels",
    ),
    (
        "annotation-key-name-over-63",
        mutate("spec.router.template", {"annotations": {"example.com/" + "n" * 64: "v"}}),
        "spec.router.template.annotations",
    ),
    (
        "node-selector-key-prefix-over-253",
        mutate("spec.prefill.pools.0.accelerator.nodeSelector", {"a" * 250 + ".com/x": "v"}),
        "spec.prefill.pools[0].accelerator.nodeSelector",
    ),
    (
        "resource-name-part-over-63",
        mutate("spec.prefill.pools.0.accelerator.resourceName", "example.com/" + "g" * 64),
        "spec.prefill.pools[0].accelerator.resourceName",
    ),
    (
        "resource-name-without-domain",
        mutate("spec.prefill.pools.0.accelerator.resourceName", "gpu"),
        "spec.prefill.pools[0].accelerator.resourceName",
    ),
    (
        "resource-name-quota-prefix",
        mutate("spec.prefill.pools.0.accelerator.resourceName", "requests.example.com/gpu"),
        "spec.prefill.pools[0].accelerator.resourceName",
    ),
    (
        "requests-over-limits",
        mutate(
            "spec.decode.pools.0.template",
            {"resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}},
        ),
        "spec.decode.pools[0].template.resources",
    ),
    (
        "router-requests-over-limits",
        mutate(
            "spec.router.template",
            {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1024Mi"}}},
        ),
        "spec.router.template.resources",
    ),
    (
        "priority-class-not-dns",
        mutate("spec.prefill.pools.0.template", {"priorityClassName": "UPPER"}),
        "spec.prefill.pools[0].template.priorityClassName",
    ),
    (
        "service-account-not-dns",
        mutate("spec.prefill.pools.0.template", {"serviceAccountName": "under_score"}),
        "spec.prefill.pools[0].template.serviceAccountName",
    ),
    (
        "schedule-without-floors",
        mutate("spec.scaling.schedules", [{"name": "s", "start": "09:00", "end": "18:00"}]),
        "spec.scaling.schedules[0]",
    ),
    (
        "schedule-with-empty-floors",
        mutate("spec.scaling.schedules", [schedule(prefill={})]),
        "spec.scaling.schedules[0]",
    ),
    (
        "router-service-account-empty",
        mutate("spec.router.template", {"serviceAccountName": ""}),
        "spec.router.template",
    ),
    (
        "env-duplicate-names",
        mutate(
            "spec.decode.pools.0.template",
            {"env": [{"name": "X", "value": "1"}, {"name": "X", "value": "2"}]},
        ),
        "spec.decode.pools[0].template.env",
    ),
    (
        "image-pull-secrets-repeated",
        mutate("spec.router.template", {"imagePullSecrets": ["regcred", "regcred"]}),
        "spec.router.template.imagePullSecrets",
    ),
    # Scale to zero takes every pool to zero, and needs the router's activator.
    ("idle-with-pools-min-1", mutate("spec.scaling.idleSeconds", 300), "spec.scaling"),
    ("idle-without-router", _set(IDLE, "spec.router.enabled", False), "spec.router"),
    # Topology-aware placement: a node label key, and one of two modes.
    ("placement-no-key", mutate("spec.placement", {"mode": "Required"}), "spec.placement"),
    (
        "placement-bad-key",
        mutate("spec.placement", {"topologyKey": "rack name!"}),
        "spec.placement.topologyKey",
    ),
    (
        "placement-mode-unknown",
        mutate("spec.placement", {"topologyKey": "example.com/rack", "mode": "Always"}),
        "spec.placement.mode",
    ),
]


def pool_deployment(role: str, pool: str, replicas: int) -> dict[str, Any]:
    """The Deployment of pool `pool` of `minimal` in namespace llm, as the reconciler made it,
    with `replicas` all Ready."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": f"minimal-{role}-{pool}",
            "namespace": "llm",
            "labels": {"pdoperator.io/deployment": "minimal"},
            "annotations": {ANNOTATION_DESIRED_REPLICAS: str(replicas)},
            "ownerReferences": [
                {"kind": "PDDeployment", "name": "minimal", "uid": "u1", "controller": True}
            ],
        },
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "readyReplicas": replicas},
    }

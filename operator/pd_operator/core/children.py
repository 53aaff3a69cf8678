"""Desired child objects of a PDDeployment, built whole as data for server-side apply.

Per role one ClusterIP Service over all of the role's pools (and, in scaling mode External, one
PDPool: the role's /scale target); per pool one workload and (unless
`spec.disruptionBudget.enabled` is false) one PodDisruptionBudget of the same name. The
workload is a Deployment, or a LeaderWorkerSet (sigs.k8s.io/lws) when a replica spans
`accelerator.nodesPerReplica` > 1 nodes: one group of pods per replica, whose leader alone
carries `pdoperator.io/role` and so is the only pod the Service and the routers select. Each
manifest carries only the fields the operator owns (field manager `pd-operator`); fields that
the apiserver or other controllers set (clusterIP, status, defaults) are left out. Children get
their own labels and never the parent's labels or annotations, which GitOps tools use to track
what they applied.
"""

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pd_operator.api.document import API_VERSION, KIND, PDDeployment
from pd_operator.api.pdpool import POOL_KIND
from pd_operator.api.spec import (
    ENGINE_CONTAINER,
    PlacementSpec,
    PodTemplateOverrides,
    PoolSpec,
    PoolTemplateOverrides,
    Role,
)
from pd_operator.core.drain import drain_command
from pd_operator.core.engine_args import (
    HEALTH_PATH,
    METRICS_PATH,
    SGLANG_BOOTSTRAP_ANNOTATION,
    SGLANG_BOOTSTRAP_PORT,
    engine_command,
    engine_env,
    engine_port,
)
from pd_operator.core.naming import deployment_name, pdpool_name, service_name
from pd_operator.core.strategic_merge import strategic_merge

Manifest = dict[str, Any]
PoolKey = tuple[Role, str]

ROLES: tuple[Role, ...] = ("prefill", "decode")
LABEL_DEPLOYMENT = "pdoperator.io/deployment"
LABEL_ROLE = "pdoperator.io/role"
LABEL_POOL = "pdoperator.io/pool"
# On every engine pod and the router's: the revision of what the engines must agree on
# (`revision`); the routers select it, so new prefill hands off to new decode only.
LABEL_REVISION = "pdoperator.io/revision"
REVISION_LENGTH = 10
ENGINE_APP_NAME = "pd-operator-engine"
MANAGED_BY = "pd-operator"
CONTAINER_NAME = ENGINE_CONTAINER
PORT_NAME = "http"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
# The kinds that run a pool's engines: a Deployment, or a LeaderWorkerSet for multi-node ones.
POOL_WORKLOAD_KINDS = ("Deployment", LWS_KIND)
# On every pod of a multi-node replica, leader and workers: their pool's budget selects it.
LABEL_GROUP_ROLE = "pdoperator.io/group-role"
# Service-side only: the engine serves /metrics on its HTTP port, and a Service needs distinct
# port numbers, so the `metrics` name that a ServiceMonitor selects gets one of its own.
METRICS_SERVICE_PORT = 9090
SHM_VOLUME = "pd-shm"
SHM_PATH = "/dev/shm"

# Pod Security `baseline`, and every `restricted` control that an image running as root passes:
# runAsNonRoot is left to template.securityContext, as most engine images run as root.
POD_SECURITY_CONTEXT: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
# Pinning memory for RDMA registration (ibv_reg_mr) past the memlock limit needs this one.
IPC_LOCK = "IPC_LOCK"

READINESS_PERIOD_SECONDS = 10
# Loading a large checkpoint onto 8 cards and capturing graphs can take tens of minutes; the
# startup probe holds readiness off for up to an hour before the kubelet restarts the engine.
STARTUP_PERIOD_SECONDS = 10
STARTUP_FAILURE_THRESHOLD = 360
# A rollout that waits on model loading is not stuck: report no ProgressDeadlineExceeded before
# a replacement pod has had its whole startup window.
PROGRESS_DEADLINE_SECONDS = STARTUP_PERIOD_SECONDS * STARTUP_FAILURE_THRESHOLD + 600
# After the drain (`core.drain`), the engine's own shutdown (freeing the cards, closing
# KV-transfer connections) before the kubelet kills it.
ENGINE_STOP_SECONDS = 30


def selector_labels(pdd_name: str, role: Role, pool: str | None = None) -> dict[str, str]:
    """The pdoperator.io labels that select a role's pods, or one pool's when `pool` is given."""
    labels = {LABEL_DEPLOYMENT: pdd_name, LABEL_ROLE: role}
    if pool is not None:
        labels[LABEL_POOL] = pool
    return labels


def revision(pdd: PDDeployment) -> str:
    """A short hash of what prefill and decode engines must agree on: the model (engine,
    image, engine args), KV transfer, and the images pools override it with. Not replicas,
    scaling, pools added or removed, nor the rest of a pool's template: those roll in place."""
    spec = pdd.spec
    images = sorted(
        {
            (pool.template or PoolTemplateOverrides()).image or spec.model.image
            for role in ROLES
            for pool in spec.pools(role)
        }
    )
    identity = [spec.model.model_dump(mode="json"), spec.kv_transfer.model_dump(mode="json")]
    encoded = json.dumps([*identity, images], sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:REVISION_LENGTH]


def child_labels(pdd_name: str, role: Role, pool: str | None = None) -> dict[str, str]:
    """All labels the operator puts on a child and its pods."""
    return {
        **selector_labels(pdd_name, role, pool),
        "app.kubernetes.io/name": ENGINE_APP_NAME,
        "app.kubernetes.io/instance": pdd_name,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/part-of": pdd_name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def owner_reference(pdd: PDDeployment) -> dict[str, Any]:
    """The controller owner reference that ties a child to its PDDeployment."""
    if not pdd.metadata.uid:
        raise ValueError(f"PDDeployment {pdd.metadata.name!r} has no metadata.uid")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": pdd.metadata.name,
        "uid": pdd.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(pdd: PDDeployment, name: str, labels: dict[str, str]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if pdd.metadata.namespace:
        metadata["namespace"] = pdd.metadata.namespace
    metadata["labels"] = labels
    metadata["ownerReferences"] = [owner_reference(pdd)]
    return metadata


def merge_by(key: str, ours: list[dict[str, Any]], theirs: Iterable[dict[str, Any]]) -> list[Any]:
    """Ours then theirs; an entry of theirs replaces ours with the same key.

    Server-side apply rejects list-map entries with duplicate keys, and the user's entry is the
    deliberate one.
    """
    copied = [copy.deepcopy(item) for item in theirs]
    taken = {item.get(key) for item in copied}
    return [item for item in ours if item[key] not in taken] + copied


def merge_over(ours: Mapping[str, Any], theirs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Ours with theirs merged in key by key, nested objects too: theirs wins, a list of theirs
    replaces ours whole, and a null of theirs removes our key."""
    merged = copy.deepcopy(dict(ours))
    for key, value in (theirs or {}).items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_over(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def container_security_context(
    template: PodTemplateOverrides, *, ipc_lock: bool = False
) -> dict[str, Any]:
    """The container securityContext: ours, with the template's merged over it; `ipc_lock` adds
    IPC_LOCK to whatever capabilities that leaves added."""
    ours = dict(CONTAINER_SECURITY_CONTEXT)
    if (template.container_security_context or {}).get("privileged") is True:
        # A privileged container escalates by definition: the apiserver refuses ours beside it.
        ours.pop("allowPrivilegeEscalation", None)
    merged = merge_over(ours, template.container_security_context)
    if ipc_lock:
        capabilities = merged.setdefault("capabilities", {})
        added = list(capabilities.get("add") or [])
        if IPC_LOCK not in added:
            capabilities["add"] = [*added, IPC_LOCK]
    return merged


def _resources(pool: PoolSpec, template: PodTemplateOverrides) -> dict[str, Any]:
    # Extended resources cannot be overcommitted: the apiserver requires requests == limits.
    cards = {pool.accelerator.resource_name: str(pool.accelerator.per_replica)}
    cards |= {name: str(count) for name, count in sorted(pool.accelerator.devices.items())}
    extra = template.resources
    requests = extra.requests.model_dump(exclude_none=True) if extra and extra.requests else {}
    limits = extra.limits.model_dump(exclude_none=True) if extra and extra.limits else {}
    return {"requests": {**requests, **cards}, "limits": {**limits, **cards}}


def _probe(failure_threshold: int, period_seconds: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": period_seconds,
        # A busy engine answers slowly; the default of 1 s would flap readiness under load.
        "timeoutSeconds": 5,
        "failureThreshold": failure_threshold,
    }


def _engine_container(
    pdd: PDDeployment, role: Role, pool: PoolSpec, leader: bool = True
) -> dict[str, Any]:
    spec = pdd.spec
    template = pool.template or PoolTemplateOverrides()
    user_env = [var.model_dump() for var in template.env]
    shm_mount = [] if _user_mounts_shm(template) else [{"name": SHM_VOLUME, "mountPath": SHM_PATH}]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": template.image or spec.model.image,
        "command": engine_command(spec, role, pool, leader=leader),
        "ports": [
            {"name": PORT_NAME, "containerPort": engine_port(spec.model.engine), "protocol": "TCP"}
        ],
        "resources": _resources(pool, template),
        "securityContext": container_security_context(template, ipc_lock=template.ipc_lock),
    }
    # A worker of a multi-node replica serves no HTTP: nothing to probe or to drain, its group's
    # leader answers for it.
    if leader:
        container["readinessProbe"] = _probe(3, READINESS_PERIOD_SECONDS)
        # No liveness probe: /health is slow on a loaded engine, and a false restart costs a
        # full model reload, far worse than a wedged replica that readiness already takes out.
        container["startupProbe"] = _probe(STARTUP_FAILURE_THRESHOLD, STARTUP_PERIOD_SECONDS)
    drain = spec.termination.drain_seconds
    if drain and leader:
        command = drain_command(spec.model.engine, role, drain)
        container["lifecycle"] = {"preStop": {"exec": {"command": command}}}
    env = merge_by("name", engine_env(spec, pool), user_env)
    if env:
        container["env"] = env
    mounts = merge_by("mountPath", shm_mount, template.volume_mounts)
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _user_mounts_shm(template: PodTemplateOverrides) -> bool:
    return any(mount.get("mountPath") == SHM_PATH for mount in template.volume_mounts)


def _pod_labels(pdd_name: str, role: Role, pool: PoolSpec, leader: bool) -> dict[str, str]:
    labels = child_labels(pdd_name, role, pool.name)
    if pool.accelerator.nodes_per_replica == 1:
        return labels
    labels[LABEL_GROUP_ROLE] = role
    if not leader:
        # Not an endpoint: neither the role's Service nor a router may select it.
        del labels[LABEL_ROLE]
    return labels


def _pod_template(
    pdd: PDDeployment, role: Role, pool: PoolSpec, leader: bool = True
) -> dict[str, Any]:
    template = pool.template or PoolTemplateOverrides()
    port = engine_port(pdd.spec.model.engine)
    # Ours win over the template's: the selector and the metrics scrape depend on them.
    own = _pod_labels(pdd.metadata.name, role, pool, leader)
    labels = {**template.labels, **own, LABEL_REVISION: revision(pdd)}
    annotations = dict(template.annotations)
    if leader:
        annotations |= {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": METRICS_PATH,
        }
    if pdd.spec.model.engine == "SGLang" and role == "prefill" and leader:
        # sglang-router finds the prefill pod's KV bootstrap server by this annotation.
        annotations[SGLANG_BOOTSTRAP_ANNOTATION] = str(SGLANG_BOOTSTRAP_PORT)
    # Engines need a large /dev/shm for tensor-parallel collectives; the default is 64 MiB.
    shm_volume = (
        []
        if _user_mounts_shm(template)
        else [
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": template.shm_size}}
        ]
    )
    pod: dict[str, Any] = {
        "containers": [_engine_container(pdd, role, pool, leader)],
        "terminationGracePeriodSeconds": pdd.spec.termination.drain_seconds + ENGINE_STOP_SECONDS,
        # Service environment variables can clash with engine settings (a Service named `vllm`
        # sets VLLM_PORT, which vLLM reads), and engines find peers by other means.
        "enableServiceLinks": False,
        # Engines never call the Kubernetes API: no token to steal from them unless asked.
        "automountServiceAccountToken": template.automount_service_account_token,
    }
    volumes = merge_by("name", shm_volume, template.volumes)
    if volumes:
        pod["volumes"] = volumes
    if pool.accelerator.node_selector:
        pod["nodeSelector"] = dict(pool.accelerator.node_selector)
    if pool.accelerator.tolerations:
        pod["tolerations"] = [
            toleration.model_dump(by_alias=True, exclude_none=True)
            for toleration in pool.accelerator.tolerations
        ]
    if template.host_network:
        pod["hostNetwork"] = True
        # Else the pod resolves names with the node's resolv.conf, and no Service name resolves.
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    keys = (LABEL_DEPLOYMENT, LABEL_ROLE if leader else LABEL_GROUP_ROLE, LABEL_POOL)
    pod.update(template_pod_fields(template, {k: own[k] for k in keys if k in own}))
    if pdd.spec.placement is not None:
        pod["affinity"] = with_placement(pod.get("affinity"), pdd.metadata.name, pdd.spec.placement)
    built = {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod}
    # Last, over everything above; the API refuses a patch of what the operator relies on.
    return strategic_merge(built, template.patch) if template.patch else built


# The weight of the Preferred term: the highest, so the domain outweighs other preferences.
PLACEMENT_WEIGHT = 100


def placement_term(pdd_name: str, placement: PlacementSpec) -> dict[str, Any]:
    """The podAffinity term that draws a pool pod to the domain of the PDDeployment's other pool
    pods (both roles, leaders and workers; not its routers, which carry no pool label)."""
    return {
        "labelSelector": {
            "matchLabels": {LABEL_DEPLOYMENT: pdd_name},
            "matchExpressions": [{"key": LABEL_POOL, "operator": "Exists"}],
        },
        "topologyKey": placement.topology_key,
    }


def with_placement(
    affinity: Mapping[str, Any] | None, pdd_name: str, placement: PlacementSpec
) -> dict[str, Any]:
    """A pod's affinity with the placement's podAffinity term added after the template's own
    terms. Kubernetes lets the first pod of a self-affine set land anywhere."""
    merged = copy.deepcopy(dict(affinity or {}))
    pod_affinity = merged.setdefault("podAffinity", {})
    term = placement_term(pdd_name, placement)
    if placement.mode == "Required":
        field, entry = "requiredDuringSchedulingIgnoredDuringExecution", term
    else:
        field = "preferredDuringSchedulingIgnoredDuringExecution"
        entry = {"weight": PLACEMENT_WEIGHT, "podAffinityTerm": term}
    pod_affinity[field] = [*(pod_affinity.get(field) or []), entry]
    return merged


def template_pod_fields(template: PodTemplateOverrides, own: Mapping[str, str]) -> dict[str, Any]:
    """The pod-spec fields a template sets besides containers and volumes; `own` are the labels
    that select the workload's pods."""
    pod: dict[str, Any] = {
        "securityContext": merge_over(POD_SECURITY_CONTEXT, template.security_context)
    }
    for field, value in (
        ("schedulerName", template.scheduler_name),
        ("serviceAccountName", template.service_account_name),
        ("priorityClassName", template.priority_class_name),
    ):
        if value:
            pod[field] = value
    if template.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in template.image_pull_secrets]
    if template.affinity:
        pod["affinity"] = template.affinity
    if template.topology_spread_constraints:
        # Without a selector a constraint counts no pods; the natural one is the workload's own.
        pod["topologySpreadConstraints"] = [
            {"labelSelector": {"matchLabels": dict(own)}, **constraint}
            for constraint in template.topology_spread_constraints
        ]
    return pod


def _pool_metadata(pdd: PDDeployment, role: Role, pool: PoolSpec) -> dict[str, Any]:
    """Name, labels and owner of a per-pool child (its Deployment and its budget)."""
    name = pdd.metadata.name
    return _metadata(
        pdd, deployment_name(name, role, pool.name), child_labels(name, role, pool.name)
    )


def build_deployment(pdd: PDDeployment, role: Role, pool: PoolSpec, replicas: int) -> Manifest:
    """The Deployment of one pool, running `replicas` engine pods."""
    if replicas < 0:
        raise ValueError(f"replicas of {role} pool {pool.name!r} must be >= 0, got {replicas}")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _pool_metadata(pdd, role, pool),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(pdd.metadata.name, role, pool.name)},
            # No surge: an extra pod needs a whole replica's worth of free cards, which a busy
            # accelerator pool rarely has, so it would sit Pending and stall the rollout.
            # Replacing one replica at a time frees its cards for the new pod first.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
            "template": _pod_template(pdd, role, pool),
        },
    }


def build_leader_worker_set(
    pdd: PDDeployment, role: Role, pool: PoolSpec, replicas: int
) -> Manifest:
    """The LeaderWorkerSet of a multi-node pool: `replicas` groups of `nodesPerReplica` pods."""
    if replicas < 0:
        raise ValueError(f"replicas of {role} pool {pool.name!r} must be >= 0, got {replicas}")
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": _pool_metadata(pdd, role, pool),
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": pool.accelerator.nodes_per_replica,
                # A group is one engine: a pod that restarts alone cannot rejoin it.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _pod_template(pdd, role, pool, leader=True),
                "workerTemplate": _pod_template(pdd, role, pool, leader=False),
            },
            # Workers start with their leader: the engines wait for each other at rendezvous.
            "startupPolicy": "LeaderCreated",
            # No surge, one group at a time, as for Deployments (build_deployment).
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            # LWS's default, sent so that a cluster without its webhook builds the same object.
            "networkConfig": {"subdomainPolicy": "Shared"},
        },
    }


def build_workload(pdd: PDDeployment, role: Role, pool: PoolSpec, replicas: int) -> Manifest:
    """The workload that runs a pool: a Deployment, or a LeaderWorkerSet when a replica spans
    several nodes."""
    if pool.accelerator.nodes_per_replica > 1:
        return build_leader_worker_set(pdd, role, pool, replicas)
    return build_deployment(pdd, role, pool, replicas)


def workload_key(pdd_name: str, role: Role, pool: PoolSpec) -> tuple[str, str, str]:
    """(apiVersion, kind, name) of the workload that runs a pool (see `child_key`)."""
    name = deployment_name(pdd_name, role, pool.name)
    if pool.accelerator.nodes_per_replica > 1:
        return (LWS_API_VERSION, LWS_KIND, name)
    return ("apps/v1", "Deployment", name)


def build_service(pdd: PDDeployment, role: Role) -> Manifest:
    """The ClusterIP Service over every pool of a role."""
    name = pdd.metadata.name
    port = engine_port(pdd.spec.model.engine)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pdd, service_name(name, role), child_labels(name, role)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(name, role),
            "ports": [
                {"name": PORT_NAME, "port": port, "targetPort": PORT_NAME, "protocol": "TCP"},
                {
                    "name": "metrics",
                    "port": METRICS_SERVICE_PORT,
                    "targetPort": PORT_NAME,
                    "protocol": "TCP",
                },
            ],
        },
    }


def build_disruption_budget(pdd: PDDeployment, role: Role, pool: PoolSpec) -> Manifest:
    """The PodDisruptionBudget of one pool: evictions take at most `maxUnavailable` of its
    Ready pods at a time (of a multi-node pool: leaders and workers)."""
    name = pdd.metadata.name
    selector = selector_labels(name, role, pool.name)
    if pool.accelerator.nodes_per_replica > 1:
        selector = {LABEL_DEPLOYMENT: name, LABEL_POOL: pool.name, LABEL_GROUP_ROLE: role}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _pool_metadata(pdd, role, pool),
        "spec": {
            "maxUnavailable": pdd.spec.disruption_budget.max_unavailable,
            "selector": {"matchLabels": selector},
            # A replica still loading its model (or failing) serves nothing: evicting it costs
            # nothing, and under the default policy it would hold a node drain up for as long.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def pod_selector(pdd_name: str, role: Role) -> str:
    """The role's pods as a label selector string (a PDPool's status.selector, for /scale)."""
    return ",".join(f"{key}={value}" for key, value in selector_labels(pdd_name, role).items())


def build_pdpool(pdd: PDDeployment, role: Role, replicas: int | None = None) -> Manifest:
    """The PDPool of a role (mode External). `replicas` only for the create: afterwards
    spec.replicas belongs to whoever scales the role (HPA, KEDA, GitOps), so an apply leaves it
    out."""
    name = pdd.metadata.name
    manifest: Manifest = {
        "apiVersion": API_VERSION,
        "kind": POOL_KIND,
        "metadata": _metadata(pdd, pdpool_name(name, role), child_labels(name, role)),
    }
    if replicas is not None:
        manifest["spec"] = {"replicas": replicas}
    return manifest


def desired_children(pdd: PDDeployment, replicas: Mapping[PoolKey, int]) -> list[Manifest]:
    """Every child of a PDDeployment: per role its Service, then per pool in order its
    workload (`build_workload`) and its PodDisruptionBudget.

    `replicas` maps (role, pool name) to the pool's replica count; a pool missing from it gets
    its `replicas.min`, and keys of pools no longer in the spec are ignored.
    """
    children: list[Manifest] = []
    for role in ROLES:
        children.append(build_service(pdd, role))
        for pool in pdd.spec.pools(role):
            count = replicas.get((role, pool.name), pool.replicas.min)
            children.append(build_workload(pdd, role, pool, count))
            if pdd.spec.disruption_budget.enabled:
                children.append(build_disruption_budget(pdd, role, pool))
    return children


def child_key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """(apiVersion, kind, name) of a manifest: what identifies it within one namespace."""
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])

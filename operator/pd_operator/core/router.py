"""The PD router of a PDDeployment, built whole as data: its one OpenAI-compatible endpoint.

The engine's own router runs in front of the pools (vllm-router for vLLM, sglang-router for
SGLang; both Rust binaries shipped in PyPI wheels, versions pinned below). It finds the pools'
pods itself, by label, with Kubernetes service discovery: a new Ready replica gets requests as
soon as the router's pod watch sees it, with no operator write and no router restart, which a
list kept current by the operator could not give. Hence its own ServiceAccount, bound to a Role
that may only list and watch pods in its namespace (what the discovery watch needs, and what
the operator holds itself, so the grant is never an escalation).

Children: a Deployment, a ServiceAccount, a Role and RoleBinding `{pdd}-router`, a
PodDisruptionBudget of the same name, a HorizontalPodAutoscaler on CPU when replicas.min <
replicas.max, and the endpoint: a Service named after the PDDeployment.

With `spec.scaling.idleSeconds` (scale to zero) the router pod also runs the activator
(`pd_operator.activator`, from the operator's image): it takes the public port and holds
requests while the router has no workers; the router moves to an internal port.
"""

from typing import Any

from pd_operator import __version__
from pd_operator.api.document import PDDeployment
from pd_operator.api.spec import Engine, PodTemplateOverrides, Role, RoutingPolicy
from pd_operator.core.children import (
    LABEL_DEPLOYMENT,
    LABEL_REVISION,
    LABEL_ROLE,
    MANAGED_BY,
    container_security_context,
    merge_by,
    owner_reference,
    revision,
    selector_labels,
    template_pod_fields,
)
from pd_operator.core.engine_args import engine_port
from pd_operator.core.naming import endpoint_service_name, router_name

Manifest = dict[str, Any]

ROUTER_ROLE = "router"
CONTAINER_NAME = "router"
PORT = 8000
METRICS_PORT = 29000
PORT_NAME = "http"
METRICS_PORT_NAME = "metrics"
# With the activator in front: the router's own API port, reached through the pod's address.
INTERNAL_PORT = 8001
INTERNAL_PORT_NAME = "router-http"
ACTIVATOR_CONTAINER_NAME = "activator"
ACTIVATOR_METRICS_PORT = 29001
ACTIVATOR_METRICS_PORT_NAME = "act-metrics"  # a port name has at most 15 characters
# The operator's image as the chart installs it by default (repository `pd-operator`, tag the
# chart's appVersion, which is this package's version); the operator passes its own otherwise.
DEFAULT_ACTIVATOR_IMAGE = f"pd-operator:{__version__}"
ACTIVATOR_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"memory": "512Mi"},
}
# Pinned: the PD protocol between router and engines changes between versions.
VLLM_ROUTER_VERSION = "0.1.17"
SGLANG_ROUTER_VERSION = "0.3.2"
DEFAULT_IMAGES: dict[Engine, str] = {
    "VLLM": f"vllm/vllm-router:v{VLLM_ROUTER_VERSION}",
    "SGLang": f"lmsysorg/sglang-router:v{SGLANG_ROUTER_VERSION}",
}
# The routers' defaults suit static worker lists: a dead worker that is not deleted keeps
# traffic for 3 x 60 s, and a discovered pod whose /health fails is retried every 30 s while
# every other pod event waits behind it. A pod is Ready only once /health answers, so short
# waits lose nothing.
HEALTH_CHECK_SECONDS = 10
WORKER_STARTUP_CHECK_SECONDS = 2
WORKER_STARTUP_TIMEOUT_SECONDS = 60
# A router is CPU-bound: the autoscaler adds one when the replicas average this much CPU.
CPU_TARGET_PERCENT = 70
DEFAULT_RESOURCES = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}

POLICY_ARGS: dict[RoutingPolicy, str] = {
    "CacheAware": "cache_aware",
    "PowerOfTwo": "power_of_two",
    "RoundRobin": "round_robin",
    "ConsistentHash": "consistent_hash",
    "Random": "random",
}


def router_labels(pdd_name: str) -> dict[str, str]:
    """Labels of the router's objects and pods (the role label says `router`)."""
    return {
        LABEL_DEPLOYMENT: pdd_name,
        LABEL_ROLE: ROUTER_ROLE,
        "app.kubernetes.io/name": "pd-operator-router",
        "app.kubernetes.io/instance": pdd_name,
        "app.kubernetes.io/component": ROUTER_ROLE,
        "app.kubernetes.io/part-of": pdd_name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def endpoint_url(pdd: PDDeployment) -> str:
    """The in-cluster URL of the PDDeployment's OpenAI API."""
    name = endpoint_service_name(pdd.metadata.name)
    return f"http://{name}.{pdd.metadata.namespace}.svc:{PORT}"


def _selector_args(flag: str, pdd_name: str, role: Role, serving: str) -> list[str]:
    labels = {**selector_labels(pdd_name, role), LABEL_REVISION: serving}
    return [flag, *(f"{k}={v}" for k, v in labels.items())]


def has_activator(pdd: PDDeployment) -> bool:
    """Scale to zero: the router pod runs the activator in front of the router."""
    return pdd.spec.scaling.idle_seconds is not None


def router_command(pdd: PDDeployment, serving: str | None = None) -> list[str]:
    """The router container's command line: PD mode, pods of revision `serving` (default: the
    spec's) found by this PDDeployment's labels in its namespace only, the spec's policies,
    metrics on their own port; `router.args` last."""
    spec, name = pdd.spec, pdd.metadata.name
    router = spec.router
    engine = spec.model.engine
    if engine == "VLLM":
        argv = ["vllm-router", "--vllm-pd-disaggregation"]
    else:
        argv = ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    port = INTERNAL_PORT if has_activator(pdd) else PORT
    argv += ["--host", "0.0.0.0", "--port", str(port)]
    argv += ["--service-discovery", "--service-discovery-namespace", pdd.metadata.namespace or ""]
    argv += ["--service-discovery-port", str(engine_port(engine))]
    serving = serving or revision(pdd)
    argv += _selector_args("--prefill-selector", name, "prefill", serving)
    argv += _selector_args("--decode-selector", name, "decode", serving)
    argv += ["--health-check-interval-secs", str(HEALTH_CHECK_SECONDS)]
    argv += ["--worker-startup-check-interval", str(WORKER_STARTUP_CHECK_SECONDS)]
    argv += ["--worker-startup-timeout-secs", str(WORKER_STARTUP_TIMEOUT_SECONDS)]
    argv += ["--prefill-policy", POLICY_ARGS[router.prefill_policy]]
    argv += ["--decode-policy", POLICY_ARGS[router.decode_policy]]
    argv += ["--prometheus-host", "0.0.0.0", "--prometheus-port", str(METRICS_PORT)]
    return [*argv, *router.args]


def _resources(template: PodTemplateOverrides) -> dict[str, Any]:
    if template.resources is None:
        return {kind: dict(amounts) for kind, amounts in DEFAULT_RESOURCES.items()}
    result: dict[str, Any] = {}
    for kind in ("requests", "limits"):
        amounts = getattr(template.resources, kind)
        if amounts is not None and amounts.model_dump(exclude_none=True):
            result[kind] = amounts.model_dump(exclude_none=True)
    return result


def _metadata(pdd: PDDeployment, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": pdd.metadata.namespace,
        "labels": router_labels(pdd.metadata.name),
        "ownerReferences": [owner_reference(pdd)],
    }


def _selector(pdd_name: str) -> dict[str, Any]:
    return {"matchLabels": {LABEL_DEPLOYMENT: pdd_name, LABEL_ROLE: ROUTER_ROLE}}


def _probe(path: str, failure_threshold: int, port: str = PORT_NAME) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": failure_threshold,
    }


def activator_container(image: str) -> dict[str, Any]:
    """The activator: the public port, the router behind it on the pod's own address."""
    return {
        "name": ACTIVATOR_CONTAINER_NAME,
        "image": image,
        "command": [
            "python",
            "-m",
            "pd_operator.activator",
            "--host",
            "0.0.0.0",
            "--port",
            str(PORT),
            "--upstream",
            f"http://$(POD_IP):{INTERNAL_PORT}",
            "--metrics-port",
            str(ACTIVATOR_METRICS_PORT),
        ],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [
            {"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"},
            {
                "name": ACTIVATOR_METRICS_PORT_NAME,
                "containerPort": ACTIVATOR_METRICS_PORT,
                "protocol": "TCP",
            },
        ],
        "resources": {kind: dict(amounts) for kind, amounts in ACTIVATOR_RESOURCES.items()},
        # Its own /health: the pod stays Ready at zero workers, so requests reach it.
        "readinessProbe": _probe("/health", 3),
        "livenessProbe": _probe("/health", 6),
        "securityContext": container_security_context(PodTemplateOverrides()),
    }


def build_router_deployment(
    pdd: PDDeployment, activator_image: str = DEFAULT_ACTIVATOR_IMAGE, serving: str | None = None
) -> Manifest:
    """The router's Deployment, routing to revision `serving` (default: the spec's); replicas
    left to the HPA when the bounds differ."""
    router, name = pdd.spec.router, router_name(pdd.metadata.name)
    template = router.template or PodTemplateOverrides()
    activator = has_activator(pdd)
    api_name, api_number = (INTERNAL_PORT_NAME, INTERNAL_PORT) if activator else (PORT_NAME, PORT)
    api_port = {"name": api_name, "containerPort": api_number, "protocol": "TCP"}
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": template.image or DEFAULT_IMAGES[pdd.spec.model.engine],
        "command": router_command(pdd, serving),
        "ports": [
            api_port,
            {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": _resources(template),
        # Behind the activator, ready once it listens: /readiness fails with no workers, and
        # at zero that is the normal state.
        "readinessProbe": (
            _probe("/health", 3, INTERNAL_PORT_NAME) if activator else _probe("/readiness", 3)
        ),
        "livenessProbe": _probe("/liveness", 6, api_name),
        # The pools' defaults. Not runAsNonRoot: the pinned images declare no user (vllm-router's
        # Dockerfile has no USER), and a uid of ours is not checked against what they write.
        "securityContext": container_security_context(template),
    }
    if template.env:
        container["env"] = [var.model_dump() for var in template.env]
    if template.volume_mounts:
        container["volumeMounts"] = merge_by("mountPath", [], template.volume_mounts)
    # Which engine revision its pods route to: a rollout waits for them to switch.
    labels = {**router_labels(pdd.metadata.name), LABEL_REVISION: serving or revision(pdd)}
    pod: dict[str, Any] = {
        **template_pod_fields(template, _selector(pdd.metadata.name)["matchLabels"]),
        "serviceAccountName": name,
        "enableServiceLinks": False,
        "containers": [container],
    }
    if activator:
        pod["containers"].append(activator_container(activator_image))
    if template.volumes:
        pod["volumes"] = merge_by("name", [], template.volumes)
    spec: dict[str, Any] = {
        "selector": _selector(pdd.metadata.name),
        # Routers are cheap and stateless: surge one so the endpoint never loses capacity.
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "template": {
            "metadata": {
                # Ours win over the template's: the selector and the Service depend on them.
                "labels": {**template.labels, **labels},
                "annotations": {
                    **template.annotations,
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(METRICS_PORT),
                    "prometheus.io/path": "/metrics",
                },
            },
            "spec": pod,
        },
    }
    if router.replicas.min == router.replicas.max:
        spec["replicas"] = router.replicas.min
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(pdd, name),
        "spec": spec,
    }


def build_endpoint_service(pdd: PDDeployment) -> Manifest:
    """The PDDeployment's endpoint: a Service named after it, in front of the routers."""
    metadata = _metadata(pdd, endpoint_service_name(pdd.metadata.name))
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": "ClusterIP",
            "selector": _selector(pdd.metadata.name)["matchLabels"],
            "ports": [
                {"name": PORT_NAME, "port": PORT, "targetPort": PORT_NAME, "protocol": "TCP"},
                {
                    "name": METRICS_PORT_NAME,
                    "port": METRICS_PORT,
                    "targetPort": METRICS_PORT_NAME,
                    "protocol": "TCP",
                },
            ],
        },
    }


def build_router_service_account(pdd: PDDeployment) -> Manifest:
    """The router's own identity (never the namespace's default ServiceAccount)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(pdd, router_name(pdd.metadata.name)),
    }


def build_router_role(pdd: PDDeployment) -> Manifest:
    """List and watch pods in the PDDeployment's namespace: all the discovery watch needs."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(pdd, router_name(pdd.metadata.name)),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}],
    }


def build_router_role_binding(pdd: PDDeployment) -> Manifest:
    """Binds the router's Role to its ServiceAccount, and to nothing else."""
    name = router_name(pdd.metadata.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(pdd, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": pdd.metadata.namespace}],
    }


def build_router_disruption_budget(pdd: PDDeployment) -> Manifest:
    """A drain takes one router at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(pdd, router_name(pdd.metadata.name)),
        "spec": {
            "maxUnavailable": 1,
            "selector": _selector(pdd.metadata.name),
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def build_router_autoscaler(pdd: PDDeployment) -> Manifest:
    """Scales the routers on CPU between replicas.min and replicas.max."""
    name, bounds = router_name(pdd.metadata.name), pdd.spec.router.replicas
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(pdd, name),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": bounds.min,
            "maxReplicas": bounds.max,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": CPU_TARGET_PERCENT},
                    },
                }
            ],
        },
    }


def router_children(
    pdd: PDDeployment, activator_image: str = DEFAULT_ACTIVATOR_IMAGE, serving: str | None = None
) -> list[Manifest]:
    """Every router object, or none when `router.enabled` is false; `activator_image` is the
    operator's own image (scale to zero), `serving` the engine revision routed to."""
    router = pdd.spec.router
    if not router.enabled:
        return []
    children = [
        build_router_service_account(pdd),
        build_router_role(pdd),
        build_router_role_binding(pdd),
        build_router_deployment(pdd, activator_image, serving),
        build_endpoint_service(pdd),
        build_router_disruption_budget(pdd),
    ]
    if router.replicas.min < router.replicas.max:
        children.append(build_router_autoscaler(pdd))
    return children

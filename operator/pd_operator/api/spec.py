"""The PDDeployment spec (pdoperator.io/v1alpha1) as pydantic models.

These models are the source of truth: `make manifests` generates the CRD's OpenAPI schema from
them (see `pd_operator.api.crd`). Wire names are camelCase, Python names snake_case.
Extra keys on the models carry Kubernetes schema extensions (CEL rules, list-map keys) and
schema-only defaults; the CRD generator copies them through.
"""

import math
import re
import zoneinfo
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from pd_operator.api.types import (
    DNS_LABEL_PATTERN,
    ENV_NAME_PATTERN,
    INT64,
    INTEGER_LITERAL,
    INTEGER_LITERAL_RULE,
    WHOLE_NUMBER,
    LabelKey,
    LabelValue,
    Milliseconds,
    ObjectName,
    PoolName,
    Quantity,
    ResourceName,
    RuleReplicas,
    RuleSeconds,
    Seconds,
    ShortText,
    TaintKey,
    quantity_value,
)

JsonDict = dict[str, JsonValue]
Engine = Literal["VLLM", "SGLang"]
KVConnector = Literal["Mooncake", "NIXL", "None"]
KVProtocol = Literal["RDMA", "TCP"]
CacheDtype = Literal["FP8", "BF16", "Auto"]
Percentile = Literal["P50", "P90", "P95", "P99"]
# The share of requests each percentile says meet the target.
PERCENTILE_SHARES: dict[str, float] = {"P50": 0.5, "P90": 0.9, "P95": 0.95, "P99": 0.99}
# Not "Off": YAML 1.1 parsers (PyYAML, go-yaml v2 in kubectl) read a bare Off as false.
ScalingMode = Literal["Active", "Advisory", "Disabled", "External"]
Role = Literal["prefill", "decode"]
ROLE_NAMES: tuple[Role, Role] = ("prefill", "decode")

# An object-valued field whose nested defaults the apiserver should fill in even when the
# user omits the whole object: `default: {}` makes the apiserver descend into it.
EMPTY_OBJECT_DEFAULT: dict[str, Any] = {"default": {}}


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One `x-kubernetes-validations` entry."""
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _check_unique(names: list[str], what: str) -> None:
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"duplicate {what}(s): {', '.join(duplicates)}")


class SpecModel(BaseModel):
    """Base of every spec model: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        # The apiserver prunes a null from a typed field before defaulting (YAML's `key:` with
        # nothing after it): read it as absent, as the stored object will have it. Nulls inside
        # free-form objects (a securityContext key) are kept: they mean something there.
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class ModelSpec(SpecModel):
    """The model served by both pools and the engine that serves it."""

    name: Annotated[StrictStr, Field(min_length=1, max_length=253)] = Field(
        description="Model name or path as the engine loads it, e.g. zai-org/GLM-4.5-FP8. "
        "Immutable: serving another model is another PDDeployment.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self == oldSelf",
                    "spec.model.name is immutable: "
                    "create a new PDDeployment to serve another model",
                )
            ]
        },
    )
    engine: Engine = Field("VLLM", description="Inference engine: VLLM or SGLang.")
    image: Annotated[StrictStr, Field(min_length=1, max_length=512)] = Field(
        description="Container image of the engine, e.g. vllm/vllm-openai:v0.11.0."
    )
    args: Annotated[list[Annotated[StrictStr, Field(max_length=1024)]], Field(max_length=64)] = (
        Field(
            default_factory=list,
            description="Extra engine arguments appended to the generated command line.",
        )
    )
    context_length: Annotated[int, Field(ge=1, le=10_000_000), WHOLE_NUMBER] | None = Field(
        None,
        description=(
            "Maximum context length in tokens (vLLM --max-model-len, SGLang --context-length)."
        ),
    )


NIXL_BACKEND_PATTERN = r"^[A-Z][A-Z0-9_]*$"
NIXL_BACKEND_MESSAGE = (
    "kvTransfer.nixlBackend applies only to connector NIXL: remove it, or set connector NIXL"
)


class KVTransferSpec(SpecModel):
    """How the KV cache moves from prefill to decode."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.nixlBackend) || self.connector == 'NIXL'",
                    NIXL_BACKEND_MESSAGE,
                    ".nixlBackend",
                )
            ]
        }
    )

    connector: KVConnector = Field(
        "Mooncake", description="KV-transfer connector: Mooncake, NIXL, or None."
    )
    protocol: KVProtocol = Field("RDMA", description="Transport: RDMA or TCP.")
    cache_dtype: CacheDtype = Field(
        "Auto", description="KV-cache element type: FP8, BF16, or Auto (the engine's default)."
    )
    nixl_backend: (
        Annotated[StrictStr, Field(min_length=1, max_length=32, pattern=NIXL_BACKEND_PATTERN)]
        | None
    ) = Field(
        None,
        description="NIXL transport plugin, e.g. LIBFABRIC (AWS EFA); NIXL's default, UCX, when "
        "absent. Connector NIXL only.",
    )

    @model_validator(mode="after")
    def _nixl_backend_for_nixl(self) -> "KVTransferSpec":
        if self.nixl_backend is not None and self.connector != "NIXL":
            raise ValueError(NIXL_BACKEND_MESSAGE)
        return self


class LatencyTarget(SpecModel):
    """A latency objective at a percentile."""

    percentile: Percentile = Field("P50", description="Percentile the target applies to.")
    target_milliseconds: Milliseconds = Field(description="Target latency in milliseconds.")


class SLOSpec(SpecModel):
    """Service-level objectives: prefill scales on TTFT, decode on ITL."""

    ttft: LatencyTarget = Field(description="Time to first token objective (prefill pools).")
    itl: LatencyTarget = Field(description="Inter-token latency objective (decode pools).")
    window_seconds: Annotated[int, Field(ge=10, le=3600), WHOLE_NUMBER] = Field(
        60, description="Window over which percentiles are computed, in seconds."
    )

    def target(self, role: Role) -> LatencyTarget:
        """The role's objective: TTFT for prefill, ITL for decode."""
        return self.ttft if role == "prefill" else self.itl


KEYLESS_TOLERATION_MESSAGE = (
    "a toleration without a key must have operator Exists (it then tolerates every taint): "
    "set operator Exists, or a key"
)
EXISTS_VALUE_MESSAGE = (
    "value must be empty when operator is Exists (it tolerates every value of the key): "
    "remove the value, or use operator Equal"
)
TOLERATION_SECONDS_MESSAGE = (
    "tolerationSeconds applies only to effect NoExecute: set effect NoExecute, or remove "
    "tolerationSeconds"
)


class Toleration(SpecModel):
    """A pod toleration (the core/v1 Toleration shape, checked as the apiserver checks a pod's)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.operator == 'Exists' || (has(self.key) && self.key != '')",
                    KEYLESS_TOLERATION_MESSAGE,
                    ".operator",
                ),
                cel(
                    "self.operator != 'Exists' || !has(self.value) || self.value == ''",
                    EXISTS_VALUE_MESSAGE,
                    ".value",
                ),
                cel(
                    "!has(self.tolerationSeconds) || "
                    "(has(self.effect) && self.effect == 'NoExecute')",
                    TOLERATION_SECONDS_MESSAGE,
                    ".tolerationSeconds",
                ),
            ]
        }
    )

    key: TaintKey | None = Field(
        None, description="Taint key tolerated; empty, with operator Exists, tolerates every taint."
    )
    operator: Literal["Exists", "Equal"] = Field(
        "Equal",
        validate_default=True,
        description="Equal matches the value; Exists matches every value of the key.",
    )
    value: LabelValue | None = Field(None, description="Taint value matched by operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect tolerated; every effect when absent."
    )
    toleration_seconds: (
        Annotated[int, Field(ge=0, json_schema_extra=INTEGER_LITERAL_RULE), INTEGER_LITERAL, INT64]
        | None
    ) = Field(
        None,
        description="Seconds a NoExecute taint is tolerated before the pod is evicted; forever "
        "when absent.",
    )

    @field_validator("operator")
    @classmethod
    def _keyless_tolerates_all(cls, operator: str, info: ValidationInfo) -> str:
        if operator == "Equal" and "key" in info.data and not info.data["key"]:
            raise ValueError(KEYLESS_TOLERATION_MESSAGE)
        return operator

    @field_validator("value")
    @classmethod
    def _exists_has_no_value(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value and info.data.get("operator") == "Exists":
            raise ValueError(EXISTS_VALUE_MESSAGE)
        return value

    @field_validator("toleration_seconds")
    @classmethod
    def _seconds_only_for_no_execute(cls, seconds: int | None, info: ValidationInfo) -> int | None:
        if seconds is not None and "effect" in info.data and info.data["effect"] != "NoExecute":
            raise ValueError(TOLERATION_SECONDS_MESSAGE)
        return seconds


DeviceCount = Annotated[int, Field(ge=1, le=256), WHOLE_NUMBER]
# An RDMA device as ibv_devices lists it (mlx5_0, ionic_3, rocep1s0f0).
RdmaDevice = Annotated[
    StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")
]
DEVICE_IS_CARD_MESSAGE = (
    "accelerator.devices must not name accelerator.resourceName: set the cards per replica "
    "with perReplica"
)


class AcceleratorSpec(SpecModel):
    """Where a pool's replicas run and which accelerator resource each one takes."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.devices) || !(self.resourceName in self.devices)",
                    DEVICE_IS_CARD_MESSAGE,
                    ".devices",
                )
            ]
        }
    )

    resource_name: ResourceName = Field(
        description="Extended resource of the accelerator, e.g. mthreads.com/gpu or nvidia.com/gpu."
    )
    per_replica: Annotated[int, Field(ge=1, le=64), WHOLE_NUMBER] = Field(
        1, description="Accelerator cards per replica (the engine's tensor-parallel size)."
    )
    nodes_per_replica: Annotated[int, Field(ge=1, le=16), WHOLE_NUMBER] = Field(
        1,
        description="Nodes one replica spans, one pod of perReplica cards on each; above 1 the "
        "pool runs as a LeaderWorkerSet (sigs.k8s.io/lws installed) whose leader pod serves.",
    )
    node_selector: Annotated[dict[LabelKey, LabelValue], Field(max_length=16)] = Field(
        default_factory=dict, description="Node labels the pool's pods require."
    )
    tolerations: Annotated[list[Toleration], Field(max_length=16)] = Field(
        default_factory=list, description="Tolerations for tainted accelerator nodes."
    )
    profile: Annotated[StrictStr, Field(max_length=63, pattern=r"^[a-z0-9][-a-z0-9.]*$")] | None = (
        Field(
            None,
            description="Hardware profile name (e.g. mtt-s5000, h200) that seeds the pool's "
            "capacity model; learned online when absent, or when the name matches no profile "
            "(condition ProfilesKnown=False and an UnknownProfile event say so).",
        )
    )
    devices: Annotated[dict[ResourceName, DeviceCount], Field(max_length=8)] = Field(
        default_factory=dict,
        description="Other extended resources each replica takes on its node, by name, e.g. "
        "rdma/hca_shared_devices_a: 1 for an RDMA HCA: requested and limited in the engine "
        "container, and counted as the cards are when the operator looks for room.",
    )
    rdma_devices: Annotated[list[RdmaDevice], Field(max_length=16)] = Field(
        default_factory=list,
        description="RDMA devices of the pool's nodes that the KV transfer uses, e.g. mlx5_0 "
        "(Mooncake's device_name, SGLang's --disaggregation-ib-device; NIXL: UCX_NET_DEVICES, "
        "port 1 of each); every device the engine finds when empty.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @field_validator("rdma_devices")
    @classmethod
    def _unique_rdma_devices(cls, names: list[str]) -> list[str]:
        _check_unique(names, "rdmaDevices name")  # a list-type set: the apiserver refuses them too
        return names

    @model_validator(mode="after")
    def _devices_are_not_the_cards(self) -> "AcceleratorSpec":
        if self.resource_name in self.devices:
            raise ValueError(DEVICE_IS_CARD_MESSAGE)
        return self


class ReplicaBounds(SpecModel):
    """Inclusive bounds the autoscaler keeps a pool within."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.min <= self.max",
                    "replicas.min must be less than or equal to replicas.max",
                )
            ]
        }
    )

    min: RuleReplicas = Field(1, description="Fewest replicas.")
    max: Annotated[
        int, Field(ge=1, le=1000, json_schema_extra=INTEGER_LITERAL_RULE), INTEGER_LITERAL
    ] = Field(10, description="Most replicas.")

    @model_validator(mode="after")
    def _min_le_max(self) -> "ReplicaBounds":
        if self.min > self.max:
            raise ValueError("replicas.min must be less than or equal to replicas.max")
        return self


class EnvVar(SpecModel):
    """A literal environment variable for the engine container."""

    name: Annotated[StrictStr, Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN)]
    value: Annotated[StrictStr, Field(max_length=4096)] = ""


class ResourceAmounts(SpecModel):
    """CPU and memory for the engine container (the accelerator is set by `accelerator`)."""

    cpu: Quantity | None = None
    memory: Quantity | None = None


def _request_within_limit(resource: str) -> JsonDict:
    requested, limit = f"self.requests.{resource}", f"self.limits.{resource}"
    return cel(
        f"!has(self.requests) || !has(self.limits) || !has({requested}) || !has({limit}) || "
        f"quantity({requested}).compareTo(quantity({limit})) <= 0",
        f"requests.{resource} must be at most limits.{resource}: a container may not request "
        "more than its limit",
        f".requests.{resource}",
    )


class ContainerResources(SpecModel):
    """Requests and limits of the engine container, besides the accelerator."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _request_within_limit("cpu"),
                _request_within_limit("memory"),
            ]
        }
    )

    requests: ResourceAmounts | None = None
    limits: ResourceAmounts | None = None

    @model_validator(mode="after")
    def _requests_within_limits(self) -> "ContainerResources":
        if self.requests is None or self.limits is None:
            return self
        for resource in ("cpu", "memory"):
            requested = getattr(self.requests, resource)
            limit = getattr(self.limits, resource)
            if requested is None or limit is None:
                continue
            if quantity_value(requested) > quantity_value(limit):
                raise ValueError(
                    f"requests.{resource} must be at most limits.{resource}: a container "
                    f"may not request more than its limit ({requested} > {limit})"
                )
        return self


PASSTHROUGH_OBJECT: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
# A core/v1 object the apiserver checks when it gets the pod template, not here.
Passthrough = Annotated[dict[str, Any], Field(json_schema_extra=PASSTHROUGH_OBJECT)]


class PodTemplateOverrides(SpecModel):
    """Optional changes to the generated pod template."""

    image: Annotated[StrictStr, Field(min_length=1, max_length=512)] | None = Field(
        None,
        description="Engine image for this pool when it differs from spec.model.image "
        "(e.g. a MUSA build for Moore Threads cards).",
    )
    labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=32)] = Field(
        default_factory=dict, description="Extra pod labels."
    )
    annotations: Annotated[
        dict[LabelKey, Annotated[StrictStr, Field(max_length=4096)]], Field(max_length=32)
    ] = Field(default_factory=dict, description="Extra pod annotations.")
    env: Annotated[list[EnvVar], Field(max_length=64)] = Field(
        default_factory=list,
        description="Extra environment variables of the engine container.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    resources: ContainerResources | None = Field(
        None, description="CPU and memory requests and limits of the engine container."
    )
    scheduler_name: ShortText | None = Field(
        None, description="Scheduler for the pods, e.g. pd-mock-scheduler in simulated clusters."
    )
    service_account_name: ObjectName | None = Field(
        None,
        description="ServiceAccount the pods run as; the namespace's default when absent. Not "
        "for the router, which runs as its own.",
    )
    priority_class_name: ObjectName | None = Field(
        None, description="PriorityClass of the pods, e.g. to preempt batch work."
    )
    image_pull_secrets: Annotated[
        list[Annotated[StrictStr, Field(min_length=1, max_length=253)]], Field(max_length=8)
    ] = Field(
        default_factory=list,
        description="Names of Secrets in the PDDeployment's namespace to pull the images with.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    affinity: Passthrough | None = Field(
        None,
        description="Pod affinity (a core/v1 Affinity), besides the accelerator's "
        "nodeSelector, e.g. podAntiAffinity to keep a pool's replicas on separate nodes.",
    )
    topology_spread_constraints: Annotated[
        list[Passthrough],
        Field(max_length=8),
    ] = Field(
        default_factory=list,
        description="core/v1 TopologySpreadConstraints of the pool's pods; one without a "
        "labelSelector spreads this pool's pods (its selector labels are filled in).",
    )
    volumes: Annotated[
        list[Passthrough],
        Field(max_length=16),
    ] = Field(default_factory=list, description="Pod volumes (core/v1 Volume objects).")
    volume_mounts: Annotated[
        list[Passthrough],
        Field(max_length=16),
    ] = Field(default_factory=list, description="Engine container volume mounts (core/v1).")
    security_context: Passthrough | None = Field(
        None,
        description="Pod securityContext (core/v1 PodSecurityContext), merged key by key over "
        "the operator's (seccompProfile RuntimeDefault), e.g. runAsNonRoot and runAsUser where "
        "Pod Security restricted is enforced.",
    )
    container_security_context: Passthrough | None = Field(
        None,
        description="securityContext of the container (core/v1 SecurityContext), merged key by "
        "key over the operator's (allowPrivilegeEscalation false, capabilities drop ALL), e.g. "
        "capabilities.add [IPC_LOCK].",
    )

    # The child's server-side apply merges env by name and pull secrets by name: a repeated one
    # makes every apply of it fail.
    @field_validator("env")
    @classmethod
    def _unique_env(cls, env: list[EnvVar]) -> list[EnvVar]:
        _check_unique([var.name for var in env], "env name")
        return env

    @field_validator("image_pull_secrets")
    @classmethod
    def _unique_pull_secrets(cls, names: list[str]) -> list[str]:
        _check_unique(names, "imagePullSecrets name")
        return names


# The engine container's name, which a template patch addresses it by.
ENGINE_CONTAINER = "engine"
# Labels under this prefix select the pool's pods (the Deployment, the Services, the routers).
OWNED_LABEL_PREFIX = "pdoperator.io/"
_PATCH_DIRECTIVES_MESSAGE = (
    "patch directives ($patch, $retainKeys, ...) are not supported: write the fields' new "
    "values, or null to remove one"
)


def _directive(value: Any) -> str | None:
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.startswith("$"):
                return key
            found = _directive(item)
            if found:
                return found
    elif isinstance(value, list):
        for item in value:
            found = _directive(item)
            if found:
                return found
    return None


def _engine_patch_problem(engine: dict[str, Any], owned_resources: tuple[str, ...]) -> str | None:
    where = f"template.patch.spec.containers[{ENGINE_CONTAINER}]"
    for field in ("command", "args"):
        if field in engine:
            return (
                f"{where}.{field} cannot be patched: the operator builds the engine's command "
                "line; add arguments with spec.model.args"
            )
    if "resources" not in engine:
        return None
    resources = engine["resources"]
    if not isinstance(resources, dict) or any(
        resources.get(kind, {}) is None for kind in ("requests", "limits")
    ):
        return (
            f"{where}.resources cannot be removed: it carries the accelerator; change CPU and "
            "memory with template.resources"
        )
    for kind in ("requests", "limits"):
        amounts = resources.get(kind) or {}
        taken = sorted(name for name in owned_resources if name in amounts)
        if taken:
            return (
                f"{where}.resources.{kind}.{taken[0]} cannot be patched: set "
                "accelerator.perReplica for the cards and accelerator.devices for other devices"
            )
    return None


def pod_template_patch_problem(
    patch: dict[str, Any], owned_resources: tuple[str, ...]
) -> str | None:
    """Why a pool's template patch cannot be applied (None: it can): a patch must not break what
    the operator relies on (the selector labels, the engine's command line, its accelerator
    resources, the container itself). `owned_resources`: the pool's accelerator resources."""
    directive = _directive(patch)
    if directive:
        return f"template.patch: {directive}: {_PATCH_DIRECTIVES_MESSAGE}"
    unknown = sorted(set(patch) - {"metadata", "spec"})
    if unknown:
        return (
            f"template.patch.{unknown[0]}: a patch of the pod template has only metadata and spec"
        )
    metadata = patch.get("metadata", {})
    if not isinstance(metadata, dict) or set(metadata) - {"labels", "annotations"}:
        return "template.patch.metadata: only labels and annotations of the pods can be patched"
    labels = metadata.get("labels", {})
    if not isinstance(labels, dict):
        return "template.patch.metadata.labels cannot be removed: some select the pool's pods"
    owned = sorted(key for key in labels if str(key).startswith(OWNED_LABEL_PREFIX))
    if owned:
        return (
            f"template.patch.metadata.labels.{owned[0]} cannot be patched: {OWNED_LABEL_PREFIX} "
            "labels select the pool's pods"
        )
    spec = patch.get("spec", {})
    if not isinstance(spec, dict):
        return "template.patch.spec must be an object (a core/v1 PodSpec patch)"
    if "hostNetwork" in spec:
        return (
            "template.patch.spec.hostNetwork cannot be patched: set template.hostNetwork, which "
            "also sets the dnsPolicy host-network pods need"
        )
    containers = spec.get("containers", [])
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        return (
            "template.patch.spec.containers must be a list of containers, each merged by name "
            f"(the engine is {ENGINE_CONTAINER!r})"
        )
    for container in containers:
        if container.get("name") == ENGINE_CONTAINER:
            problem = _engine_patch_problem(container, owned_resources)
            if problem:
                return problem
    return None


# Tensor-parallel engines pass activations between their ranks through /dev/shm (NCCL, vLLM's
# shared-memory broadcast): a few GiB at 8 ranks. A bound keeps a runaway from taking the node's
# memory, which a memory-backed emptyDir would otherwise be allowed up to.
DEFAULT_SHM_SIZE = "16Gi"


class PoolTemplateOverrides(PodTemplateOverrides):
    """Optional changes to a pool's generated pod template."""

    shm_size: Quantity = Field(
        DEFAULT_SHM_SIZE,
        description="Size limit of the memory-backed /dev/shm the engine gets (it counts "
        "against the pod's memory); unused when volumeMounts mounts /dev/shm itself.",
    )
    automount_service_account_token: StrictBool = Field(
        False,
        description="Mount the ServiceAccount's API token into the engine pods; engines never "
        "call the Kubernetes API, so it is left out unless set true.",
    )
    host_network: StrictBool = Field(
        False,
        description="Run the pods in their node's network namespace (with dnsPolicy "
        "ClusterFirstWithHostNet), for RDMA NICs the pod network cannot reach. Needs Pod "
        "Security privileged; two engines on one node collide on their ports.",
    )
    ipc_lock: StrictBool = Field(
        False,
        description="Add the IPC_LOCK capability to the engine container, which RDMA memory "
        "registration needs under a low memlock limit; every other capability stays dropped. "
        "Needs Pod Security privileged.",
    )
    patch: Passthrough | None = Field(
        None,
        description="A strategic-merge patch of the pod template (metadata and spec) for what "
        "the API does not name: containers, volumes and env merge by name, objects key by key, "
        "other lists are replaced, null removes. The engine container is `engine`; its command, "
        "args and accelerator resources, and pdoperator.io labels, cannot be patched.",
    )

    @field_validator("patch")
    @classmethod
    def _patch_shape(cls, patch: dict[str, Any] | None) -> dict[str, Any] | None:
        if patch is not None:
            problem = pod_template_patch_problem(patch, owned_resources=())
            if problem:
                raise ValueError(problem)
        return patch


class PoolSpec(SpecModel):
    """One pool of a role: identical replicas on one kind of accelerator."""

    name: PoolName = Field(description="Pool name, unique within its role (a DNS label).")
    accelerator: AcceleratorSpec
    # A complete default: the apiserver checks defaults against the CEL rule before defaulting.
    replicas: ReplicaBounds = Field(
        default_factory=ReplicaBounds, json_schema_extra={"default": {"min": 1, "max": 10}}
    )
    template: PoolTemplateOverrides | None = None

    @model_validator(mode="after")
    def _patch_keeps_the_accelerator(self) -> "PoolSpec":
        patch = self.template.patch if self.template else None
        if patch is not None:
            owned = (self.accelerator.resource_name, *self.accelerator.devices)
            problem = pod_template_patch_problem(patch, owned_resources=owned)
            if problem:
                raise ValueError(problem)
        return self


class RoleSpec(SpecModel):
    """The pools of one role, in order of preference (the first is filled first)."""

    pools: Annotated[list[PoolSpec], Field(min_length=1, max_length=8)] = Field(
        description="Pools in order of preference; names unique.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("pools")
    @classmethod
    def _unique_names(cls, pools: list[PoolSpec]) -> list[PoolSpec]:
        _check_unique([pool.name for pool in pools], "pool name")
        return pools


class StepPolicy(SpecModel):
    """How fast one direction of scaling may move."""

    stabilization_seconds: Seconds = Field(
        description="How long a decision must hold before it is applied, in seconds."
    )
    max_step_replicas: Annotated[int, Field(ge=1, le=100), WHOLE_NUMBER] = Field(
        description="Most replicas added or removed per pool in one step."
    )
    max_step_percent: Annotated[int, Field(ge=1, le=1000), WHOLE_NUMBER] | None = Field(
        None,
        description="Also allow a step of this percentage of the pool's replicas, when that is "
        "more than maxStepReplicas (as the HPA's Percent policy with selectPolicy Max). "
        "scaleUp's default, 100, lets a pool double per decision.",
    )

    def step(self, current: int) -> int:
        """The most replicas a pool of `current` replicas may move in one step."""
        percent = self.max_step_percent
        by_share = math.ceil(current * percent / 100) if percent else 0
        return max(self.max_step_replicas, by_share)


# The short scale-down window of a steady load when the spec names none (capped by the long one).
STEADY_STABILIZATION_SECONDS = 60
STEADY_WINDOW_MESSAGE = (
    "scaleDown.steadyStabilizationSeconds must be at most stabilizationSeconds: lower it, or "
    f"leave it out for the lesser of {STEADY_STABILIZATION_SECONDS} and stabilizationSeconds"
)


class ScaleDownPolicy(StepPolicy):
    """How fast a pool may shrink: after a long window, or a short one while the load is steady."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.steadyStabilizationSeconds) || "
                    "self.steadyStabilizationSeconds <= self.stabilizationSeconds",
                    STEADY_WINDOW_MESSAGE,
                    ".steadyStabilizationSeconds",
                )
            ]
        }
    )

    stabilization_seconds: RuleSeconds = Field(
        description="How long a decision must hold before it is applied, in seconds."
    )
    steady_stabilization_seconds: RuleSeconds | None = Field(
        None,
        description="The window instead, in seconds (at most stabilizationSeconds), while the "
        "role's load has been steady and its latency under half the target for a whole "
        "stabilizationSeconds. Absent: 60 or stabilizationSeconds, whichever is less. Set it "
        "to stabilizationSeconds to always wait the long window.",
    )

    @property
    def steady_window_seconds(self) -> int:
        """The steady-load window in effect: the spec's, else 60; never over stabilizationSeconds.

        Admission refuses an explicit window over the long one; objects stored by older CRDs,
        whose default of 60 could sit over a shorter long window, are read capped (the window
        the policy always used for them) instead of stalling."""
        steady = self.steady_stabilization_seconds
        return min(
            STEADY_STABILIZATION_SECONDS if steady is None else steady, self.stabilization_seconds
        )


RulePercent = Annotated[
    int, Field(ge=1, le=10_000, json_schema_extra=INTEGER_LITERAL_RULE), INTEGER_LITERAL
]


class RatioGuardrail(SpecModel):
    """Bounds on prefill replicas as a percentage of decode replicas (4P2D is 200)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.minPercent <= self.maxPercent",
                    "prefillToDecodeRatio.minPercent must be less than or equal to maxPercent",
                )
            ]
        }
    )

    min_percent: RulePercent
    max_percent: RulePercent

    @model_validator(mode="after")
    def _min_le_max(self) -> "RatioGuardrail":
        if self.min_percent > self.max_percent:
            raise ValueError(
                "prefillToDecodeRatio.minPercent must be less than or equal to maxPercent"
            )
        return self


class SecretKeyRef(SpecModel):
    """A key of a Secret in the PDDeployment's namespace."""

    name: Annotated[StrictStr, Field(min_length=1, max_length=253)]
    key: Annotated[StrictStr, Field(min_length=1, max_length=253)]


class PrometheusSpec(SpecModel):
    """Where the SLO metrics are read from."""

    url: Annotated[StrictStr, Field(max_length=2048, pattern=r"^https?://")] = Field(
        description="Prometheus base URL, e.g. http://prometheus-operated.monitoring:9090."
    )
    bearer_token_secret_ref: SecretKeyRef | None = Field(
        None,
        description="Bearer token sent to the URL: a key of a Secret in the PDDeployment's "
        "namespace, read by the operator (get on secrets) and re-read every minute.",
    )
    ca_secret_ref: SecretKeyRef | None = Field(
        None,
        description="PEM CA bundle that signs the URL's certificate: a key of a Secret in the "
        "PDDeployment's namespace.",
    )


Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
WEEKDAYS: tuple[Weekday, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
CLOCK_TIME_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
ClockTime = Annotated[StrictStr, Field(max_length=5, pattern=CLOCK_TIME_PATTERN)]
PoolFloors = Annotated[dict[PoolName, RuleReplicas], Field(max_length=8)]


def _known_time_zone(name: str) -> str:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r}: use an IANA name such as UTC or Asia/Shanghai"
        ) from None
    return name


# An IANA name's shape ("UTC", "Asia/Shanghai", "Etc/GMT+8"): refused at admission when it
# cannot be one (a path, spaces); which names exist is checked by the models and the operator.
TIME_ZONE_PATTERN = r"^[A-Za-z][-+_A-Za-z0-9]*(/[A-Za-z0-9][-+_A-Za-z0-9]*)*$"
TimeZone = Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=TIME_ZONE_PATTERN)]


NO_FLOOR_MESSAGE = "a schedule needs a floor: prefill or decode replicas by pool name"


class ScheduleSpec(SpecModel):
    """A recurring window in which pools keep at least some replicas: a known peak, pre-warmed."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "(has(self.prefill) && self.prefill.size() > 0) || "
                    "(has(self.decode) && self.decode.size() > 0)",
                    NO_FLOOR_MESSAGE,
                )
            ]
        }
    )

    name: Annotated[StrictStr, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)] = (
        Field(description="Schedule name, unique (a DNS label); decisions it holds name it.")
    )
    time_zone: TimeZone = Field(
        "UTC", description="IANA time zone of start and end, e.g. Asia/Shanghai."
    )
    days: Annotated[list[Weekday], Field(min_length=1, max_length=7)] = Field(
        default_factory=lambda: list(WEEKDAYS),
        description="Days the window starts on (Mon..Sun); every day when absent.",
        json_schema_extra={"x-kubernetes-list-type": "set", "default": list(WEEKDAYS)},
    )
    start: ClockTime = Field(description='Local start time, "HH:MM".')
    end: ClockTime = Field(
        description='Local end time, "HH:MM"; at or before start, the next day (00:00 to 00:00 '
        "is a whole day)."
    )
    lead_seconds: Seconds | None = Field(
        None,
        description="How long before start the floors apply. Absent: the pool's model-load "
        "time (as measured, the hardware profile's estimate before that) plus one decision "
        "interval, so the replicas are Ready at start.",
    )
    prefill: PoolFloors = Field(
        default_factory=dict, description="Fewest replicas per prefill pool, by pool name."
    )
    decode: PoolFloors = Field(
        default_factory=dict, description="Fewest replicas per decode pool, by pool name."
    )

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, name: str) -> str:
        return _known_time_zone(name)

    @field_validator("start", "end", mode="before")
    @classmethod
    def _clock_time(cls, value: Any) -> Any:
        if isinstance(value, str) and not re.fullmatch(CLOCK_TIME_PATTERN, value):
            raise ValueError(f'want a 24-hour time "HH:MM", e.g. "09:00", got {value!r}')
        return value

    @field_validator("days")
    @classmethod
    def _unique_days(cls, days: list[Weekday]) -> list[Weekday]:
        if len(set(days)) < len(days):
            raise ValueError("each day at most once")
        return days

    @model_validator(mode="after")
    def _some_floor(self) -> "ScheduleSpec":
        if not self.prefill and not self.decode:
            raise ValueError(NO_FLOOR_MESSAGE)
        return self


def _default_scale_up() -> StepPolicy:
    # Doubling per decision, as the HPA's default: the demand sizes growth, and a step that
    # held a role in breach while a long-output load stepped up (15 -> 51 decode replicas, 4
    # per interval) served only a quarter of its requests in time.
    return StepPolicy(stabilization_seconds=0, max_step_replicas=4, max_step_percent=100)


SeasonPeriod = Literal["Day", "Week"]
SEASON_DAYS: dict[str, int] = {"Day": 1, "Week": 7}


class SeasonalSpec(SpecModel):
    """Pre-warming for load that comes back at the same time every day or week, read from the
    history Prometheus keeps of the pools' demand."""

    period: SeasonPeriod = Field(
        "Day", description="What repeats: Day (the same local time each day) or Week (each week)."
    )
    seasons: Annotated[int, Field(ge=1, le=8), WHOLE_NUMBER] = Field(
        3,
        description="Past periods that must each have shown a load for it to be expected again "
        "(the least of them is). Prometheus must keep that much history: its default retention "
        "(15 days) holds 14 days or 2 weeks.",
    )
    time_zone: TimeZone = Field(
        "UTC",
        description="IANA time zone whose local time the load follows, e.g. Asia/Shanghai: "
        "across a daylight-saving change, yesterday at 09:00 is 23 or 25 hours ago.",
    )

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, name: str) -> str:
        return _known_time_zone(name)

    @property
    def unit(self) -> str:
        """The seasons' unit in words: "day", "days", "week" or "weeks"."""
        return f"{self.period.lower()}{'s' if self.seasons > 1 else ''}"


def _default_scale_down() -> ScaleDownPolicy:
    return ScaleDownPolicy(
        stabilization_seconds=300, max_step_replicas=1, steady_stabilization_seconds=60
    )


class ScalingSpec(SpecModel):
    """The autoscaler's behaviour."""

    mode: ScalingMode = Field(
        "Active",
        description="Active applies decisions; Advisory records them only; "
        "Disabled leaves replicas alone; External takes each role's replicas from its PDPool "
        "(`<name>-prefill`, `<name>-decode`: the /scale target of an HPA, KEDA or GitOps), "
        "within replicas.min/max, free capacity and prefillToDecodeRatio.",
    )
    interval_seconds: Annotated[int, Field(ge=5, le=3600), WHOLE_NUMBER] = Field(
        30, description="Decision interval in seconds."
    )
    scale_up: StepPolicy = Field(
        default_factory=_default_scale_up,
        json_schema_extra={
            "default": {"stabilizationSeconds": 0, "maxStepReplicas": 4, "maxStepPercent": 100}
        },
    )
    scale_down: ScaleDownPolicy = Field(
        default_factory=_default_scale_down,
        json_schema_extra={
            "default": {
                "stabilizationSeconds": 300,
                "maxStepReplicas": 1,
                "steadyStabilizationSeconds": 60,
            }
        },
    )
    prefill_to_decode_ratio: RatioGuardrail | None = None
    schedules: Annotated[list[ScheduleSpec], Field(max_length=16)] = Field(
        default_factory=list,
        description="Windows in which pools keep more replicas (a floor over replicas.min), "
        "started early enough for their replicas to be Ready when the window opens.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    seasonal: SeasonalSpec | None = Field(
        None,
        description="Pools start replicas one model load ahead of a load that the last seasons "
        "all showed at this time of day (or week), scaled to how today compares with them so "
        "far. Absent: no pre-warming from history.",
    )
    prometheus: PrometheusSpec | None = Field(
        None, description="Metrics source; the operator's --prometheus-url when absent."
    )
    idle_seconds: Annotated[int, Field(ge=30, le=604800), WHOLE_NUMBER] | None = Field(
        None,
        description="Scale to zero: after this many seconds with no request at the router, "
        "prefill and decode go to zero together; the next request is held by the router's "
        "activator while both start, and served once both are Ready. Needs router.enabled and "
        "replicas.min 0 on every pool. Absent: pools never go idle.",
    )

    @field_validator("schedules")
    @classmethod
    def _unique_schedule_names(cls, schedules: list[ScheduleSpec]) -> list[ScheduleSpec]:
        _check_unique([schedule.name for schedule in schedules], "schedule name")
        return schedules


class DisruptionBudgetSpec(SpecModel):
    """Voluntary disruptions (node drains, evictions) of each pool's pods."""

    enabled: StrictBool = Field(
        True,
        description="One PodDisruptionBudget per pool: a drain or an eviction takes at most "
        "maxUnavailable of the pool's Ready replicas at a time. Set false to create none "
        "(the operator deletes the ones it made).",
    )
    max_unavailable: Annotated[int, Field(ge=1, le=1000), WHOLE_NUMBER] = Field(
        1,
        description="Most Ready replicas of one pool that evictions may take down at once. "
        "Replicas not Ready (loading a model, failing) never hold a drain up.",
    )


class TerminationSpec(SpecModel):
    """How a replica leaves its pool (a scale-down, a rollout, a node drain)."""

    drain_seconds: Annotated[int, Field(ge=0, le=3600), WHOLE_NUMBER] = Field(
        60,
        description="Longest time a replica being removed keeps serving the requests it "
        "already runs (decode streams, prefill KV hand-offs) while no new ones reach it; its "
        "engine is stopped as soon as it is idle. 0 stops it at once. Set it past the longest "
        "request you serve.",
    )


# The routers' own policy names, CamelCase on the wire (vllm-router and sglang-router both take
# cache_aware, power_of_two, round_robin, consistent_hash and random).
RoutingPolicy = Literal["CacheAware", "PowerOfTwo", "RoundRobin", "ConsistentHash", "Random"]


RouterCount = Annotated[
    int, Field(ge=1, le=100, json_schema_extra=INTEGER_LITERAL_RULE), INTEGER_LITERAL
]


class RouterReplicas(SpecModel):
    """Router replicas: fixed when min equals max, else scaled on CPU by an HPA."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.min <= self.max",
                    "router.replicas.min must be less than or equal to router.replicas.max",
                )
            ]
        }
    )

    min: RouterCount = Field(1, description="Fewest routers.")
    max: RouterCount = Field(1, description="Most routers.")

    @model_validator(mode="after")
    def _min_le_max(self) -> "RouterReplicas":
        if self.min > self.max:
            raise ValueError(
                "router.replicas.min must be less than or equal to router.replicas.max"
            )
        return self


class RouterSpec(SpecModel):
    """The PD router in front of the pools: the PDDeployment's one OpenAI-compatible endpoint."""

    enabled: StrictBool = Field(
        True,
        description="Run the engine's PD router (vllm-router for VLLM, sglang-router for SGLang) "
        "behind a Service named after the PDDeployment. False: no router and no endpoint.",
    )
    replicas: RouterReplicas = Field(
        default_factory=RouterReplicas, json_schema_extra={"default": {"min": 1, "max": 1}}
    )
    prefill_policy: RoutingPolicy = Field(
        "CacheAware",
        description="How a request picks its prefill replica; CacheAware sends a repeated "
        "prefix where its KV cache already is.",
    )
    decode_policy: RoutingPolicy = Field(
        "PowerOfTwo", description="How a request picks its decode replica: the less loaded of two."
    )
    args: Annotated[list[Annotated[StrictStr, Field(max_length=1024)]], Field(max_length=32)] = (
        Field(default_factory=list, description="Extra router arguments, appended last.")
    )
    template: PodTemplateOverrides | None = Field(
        None,
        description="Changes to the router's pods: image (the operator's pinned router for the "
        "engine when absent), resources (1 CPU and 1Gi requested when absent), scheduler, "
        "labels, env, securityContext and the rest as for a pool; the router keeps its API "
        "token (its discovery watches pods) and has no /dev/shm.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.serviceAccountName)",
                    "router.template.serviceAccountName cannot be set: the router runs as its "
                    "own ServiceAccount, whose Role lets it watch pods",
                )
            ]
        },
    )

    @field_validator("template")
    @classmethod
    def _own_service_account(
        cls, template: PodTemplateOverrides | None
    ) -> PodTemplateOverrides | None:
        if template is not None and template.service_account_name is not None:
            raise ValueError(
                "router.template.serviceAccountName cannot be set: the router runs as its own "
                "ServiceAccount, whose Role lets it watch pods"
            )
        return template


PlacementMode = Literal["Preferred", "Required"]


class PlacementSpec(SpecModel):
    """Where the pools' pods go relative to each other: one topology domain (a rack, an RDMA
    fabric) for the whole PDDeployment, so KV hand-offs stay on the fast fabric."""

    topology_key: LabelKey = Field(
        description="Node label whose value names a domain, e.g. a rack or RDMA-fabric label; "
        "every prefill and decode pod of this PDDeployment seeks the domain its other pods run in."
    )
    mode: PlacementMode = Field(
        "Preferred",
        description="Preferred: the scheduler favours that domain and spills over when it is "
        "full. Required: pods only run in that domain (nodes without the label never), and the "
        "autoscaler counts only that domain's free room.",
    )


class RolloutSpec(SpecModel):
    """How a change of what the engines run (image, engine arguments, model, KV transfer)
    rolls out: a new revision of both roles beside the old one, switched to when Ready."""

    progress_deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=86400,
        description="Seconds the new revision's pods may take to become Ready before the "
        "rollout reports Stalled (the old revision keeps serving); absent: the engines' whole "
        "startup window plus 10 minutes.",
    )


def _schedule_rule(role: Role, quantifier: str, check: str) -> str:
    """A CEL rule over every pool name `k` a schedule `s` names under `role` (its floor:
    `s.<role>[k]`): `check` holds for `quantifier` (all, exists) pool `p` of the role."""
    return (
        "!has(self.scaling) || !has(self.scaling.schedules) || self.scaling.schedules.all(s, "
        f"!has(s.{role}) || s.{role}.all(k, self.{role}.pools.{quantifier}(p, {check})))"
    )


def _schedule_rules(role: Role) -> list[JsonDict]:
    # Two rules, so that an unknown pool name is not also reported as a floor over its max.
    return [
        cel(
            _schedule_rule(role, "exists", "p.name == k"),
            f"every pool a schedule names under {role} must be a {role} pool",
            ".scaling.schedules",
        ),
        cel(
            _schedule_rule(
                role, "all", f"p.name != k || !has(p.replicas) || s.{role}[k] <= p.replicas.max"
            ),
            f"a schedule's {role} floor must not exceed that pool's replicas.max",
            ".scaling.schedules",
        ),
    ]


_IDLE_NEEDS_ZERO_MIN = "!has(self.scaling) || !has(self.scaling.idleSeconds) || " + " && ".join(
    f"self.{role}.pools.all(p, has(p.replicas) && has(p.replicas.min) && p.replicas.min == 0)"
    for role in ROLE_NAMES
)
IDLE_NEEDS_ZERO_MIN_MESSAGE = (
    "scaling.idleSeconds scales every pool to zero: set replicas.min to 0 on every prefill and "
    "decode pool, or remove idleSeconds"
)
_IDLE_NEEDS_ROUTER = (
    "!has(self.scaling) || !has(self.scaling.idleSeconds) || !has(self.router) || "
    "!has(self.router.enabled) || self.router.enabled"
)
IDLE_NEEDS_ROUTER_MESSAGE = (
    "scaling.idleSeconds needs the router (its activator holds the first request while the "
    "pools start): set router.enabled to true, or remove idleSeconds"
)


class PDDeploymentSpec(SpecModel):
    """A model served by a prefill role and a decode role, each with its own pools and SLO."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *_schedule_rules("prefill"),
                *_schedule_rules("decode"),
                cel(_IDLE_NEEDS_ZERO_MIN, IDLE_NEEDS_ZERO_MIN_MESSAGE, ".scaling.idleSeconds"),
                cel(_IDLE_NEEDS_ROUTER, IDLE_NEEDS_ROUTER_MESSAGE, ".router.enabled"),
            ]
        }
    )

    model: ModelSpec
    kv_transfer: KVTransferSpec = Field(
        default_factory=KVTransferSpec, json_schema_extra=EMPTY_OBJECT_DEFAULT
    )
    slo: SLOSpec
    prefill: RoleSpec
    decode: RoleSpec
    scaling: ScalingSpec = Field(
        default_factory=ScalingSpec, json_schema_extra=EMPTY_OBJECT_DEFAULT
    )
    disruption_budget: DisruptionBudgetSpec = Field(
        default_factory=DisruptionBudgetSpec, json_schema_extra=EMPTY_OBJECT_DEFAULT
    )
    termination: TerminationSpec = Field(
        default_factory=TerminationSpec, json_schema_extra=EMPTY_OBJECT_DEFAULT
    )
    router: RouterSpec = Field(default_factory=RouterSpec, json_schema_extra=EMPTY_OBJECT_DEFAULT)
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, json_schema_extra=EMPTY_OBJECT_DEFAULT
    )
    placement: PlacementSpec | None = Field(
        None,
        description="Keep prefill and decode in one topology domain; absent: anywhere.",
    )

    def pools(self, role: Role) -> list[PoolSpec]:
        """The pools of a role, in order of preference."""
        return self.prefill.pools if role == "prefill" else self.decode.pools

    @field_validator("router")
    @classmethod
    def _idle_needs_router(cls, router: RouterSpec, info: ValidationInfo) -> RouterSpec:
        scaling = info.data.get("scaling")
        if scaling is not None and scaling.idle_seconds is not None and not router.enabled:
            raise ValueError(IDLE_NEEDS_ROUTER_MESSAGE)
        return router

    @field_validator("scaling")
    @classmethod
    def _schedules_name_pools(cls, scaling: ScalingSpec, info: ValidationInfo) -> ScalingSpec:
        every = [p for role in ROLE_NAMES if role in info.data for p in info.data[role].pools]
        if scaling.idle_seconds is not None and any(pool.replicas.min for pool in every):
            raise ValueError(IDLE_NEEDS_ZERO_MIN_MESSAGE)
        for index, schedule in enumerate(scaling.schedules):
            for role in ROLE_NAMES:
                if role not in info.data:
                    continue  # the role itself is invalid, and said so
                pools = {pool.name: pool for pool in info.data[role].pools}
                for name, floor in getattr(schedule, role).items():
                    where = f"schedules[{index}].{role}.{name}"
                    if name not in pools:
                        raise ValueError(
                            f"{where}: no {role} pool is named {name!r}; "
                            f"the {role} pools are {', '.join(pools)}"
                        )
                    if floor > pools[name].replicas.max:
                        raise ValueError(
                            f"{where}: {floor} is above the pool's replicas.max "
                            f"{pools[name].replicas.max}; lower the floor or raise replicas.max"
                        )
        return scaling

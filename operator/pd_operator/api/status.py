"""The PDDeployment status: written by the operator only."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from pd_operator.api.spec import Role

ConditionStatus = Literal["True", "False", "Unknown"]
LimitedBy = Literal[
    "none",
    "capacity",
    "ratio",
    "rate",
    "bounds",
    "metrics",
    "warmup",
    "schedule",
    "forecast",
    "fabric",
]


class StatusModel(BaseModel):
    """Base of the status models: camelCase on the wire; unknown keys kept out."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Condition(StatusModel):
    """A condition in the metav1.Condition shape."""

    type: str = Field(max_length=316)
    status: ConditionStatus
    observed_generation: int | None = None
    last_transition_time: str = Field(description="RFC 3339 time of the last status change.")
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = Field("", max_length=32768)


class PoolStatus(StatusModel):
    """Observed and desired replicas of one pool."""

    role: Role
    name: str
    replicas: int = 0
    ready_replicas: int = 0
    desired_replicas: int = 0
    unschedulable_replicas: int = Field(0, description="Pods with PodScheduled=False.")


class ReplicaSummary(StatusModel):
    """Ready/desired replicas per role as text, for `kubectl get` columns."""

    prefill: str = ""
    decode: str = ""


class RouterStatus(StatusModel):
    """Replicas of the PD router."""

    replicas: int = 0
    ready_replicas: int = 0
    desired_replicas: int = 0


class ObservedSignals(StatusModel):
    """The SLO signals last read from Prometheus."""

    ttft_milliseconds: int | None = None
    itl_milliseconds: int | None = None
    kv_transfer_milliseconds: int | None = Field(
        None, description="Mean KV hand-off from prefill to decode inside the TTFT."
    )
    requests_per_second: float | None = None
    sample_time: str | None = None


class Decision(StatusModel):
    """The autoscaler's last decision and what limited it."""

    time: str
    prefill_replicas: int
    decode_replicas: int
    reason: str
    limited_by: LimitedBy = "none"


class ExternalScaling(StatusModel):
    """One role in mode External: what its PDPool asks and what the operator runs."""

    role: Role
    pd_pool: str = Field(max_length=63, description="The role's PDPool.")
    requested_replicas: int | None = Field(
        None,
        description="The PDPool's spec.replicas; absent while it does not exist or is not this "
        "PDDeployment's (replicas then hold).",
    )
    replicas: int = Field(
        0,
        description="Replicas the operator runs for the role, all pools together: the request "
        "within replicas.min/max, free capacity and prefillToDecodeRatio.",
    )
    limited_by: LimitedBy = Field("none", description="What made replicas differ from the request.")
    message: str = Field("", max_length=1024)


class RolloutStatus(StatusModel):
    """The last rollout across roles: a new revision of both roles, switched to once Ready."""

    revision: str = Field(max_length=63, description="The engines' revision the spec asks for.")
    previous_revision: str | None = Field(
        None, max_length=63, description="The revision it replaces, serving until it is Ready."
    )
    state: Literal["Progressing", "Complete", "Stalled"]
    message: str = Field("", max_length=1024)
    started_at: str | None = Field(None, description="RFC 3339 time the rollout began.")


class PDDeploymentStatus(StatusModel):
    """Status of a PDDeployment."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    pools: list[PoolStatus] = Field(default_factory=list)
    replica_summary: ReplicaSummary | None = None
    endpoint: str | None = Field(
        None, description="In-cluster URL of the OpenAI API (the router's Service)."
    )
    router: RouterStatus | None = None
    rollout: RolloutStatus | None = None
    external_scaling: list[ExternalScaling] = Field(
        default_factory=list,
        description="Mode External: each role's PDPool request and what the operator runs.",
    )
    observed: ObservedSignals | None = None
    last_decision: Decision | None = None
    policy_memory: str | None = Field(
        None,
        max_length=65536,
        description="The autoscaler's memory as JSON (internal): stabilization windows, capacity "
        "per replica learned so far, warm-up. Read back after an operator restart.",
    )

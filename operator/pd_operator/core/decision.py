"""What one autoscaling decision reads and returns (see `core.policy.decide`)."""

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from pd_operator.api.spec import PDDeploymentSpec, Role
from pd_operator.api.status import LimitedBy
from pd_operator.core.capacity import FreeCapacity
from pd_operator.core.children import PoolKey
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.signals import RoleSignals


@dataclass(frozen=True)
class PoolObservation:
    """A pool's replicas as observed now."""

    replicas: int  # what the pool's Deployment asks for
    ready: int = 0
    unschedulable: int = 0  # pods with PodScheduled=False, reason Unschedulable
    scheduled: int | None = None  # pods bound to a node; None: all but the unschedulable
    nodes: frozenset[str] = frozenset()  # the nodes its pods are bound to


@dataclass(frozen=True)
class Observation:
    """Everything one decision reads: signals per role, pools, free capacity."""

    signals: Mapping[Role, RoleSignals]
    pools: Mapping[PoolKey, PoolObservation]
    # The node view (`core.capacity.free_capacity`); None: unknown, replicas are not limited
    # by it, and unschedulable pods are left alone (a cluster autoscaler may act on them).
    capacity: FreeCapacity | None = None

    def room(self, spec: PDDeploymentSpec) -> FreeCapacity | None:
        """The free capacity this PDDeployment may grow on (`FreeCapacity.in_domain`)."""
        if self.capacity is None:
            return None
        return self.capacity.in_domain(spec, running_nodes(self.pools))


def running_nodes(pools: Mapping[PoolKey, PoolObservation]) -> set[str]:
    """The nodes the pools' pods are bound to."""
    return {node for pool in pools.values() for node in pool.nodes}


@dataclass(frozen=True)
class PoolDecision:
    """The decision for one pool, with its reason."""

    role: Role
    pool: str
    current_replicas: int
    ready_replicas: int
    desired_replicas: int
    limited_by: LimitedBy
    reason: str
    capacity_per_replica: float | None  # tokens/s within the SLO; None until known


@dataclass(frozen=True)
class Decision:
    """Desired replicas of every pool, why, what limited them, and the policy's new memory."""

    time: float
    replicas: Mapping[PoolKey, int]  # what `reconcile.plan_children(decisions=...)` takes
    pools: tuple[PoolDecision, ...]
    reason: str
    limited_by: LimitedBy
    state: PolicyState

    def role_replicas(self, role: Role) -> int:
        """Desired replicas of a role, all pools together."""
        return sum(n for (r, _), n in self.replicas.items() if r == role)


# The fields of status.lastDecision (`api.status.Decision`).
LAST_DECISION_FIELDS = ("time", "prefillReplicas", "decodeReplicas", "reason", "limitedBy")


@dataclass(frozen=True)
class ScaleRecord:
    """A decision that changed a pool's replicas, kept on the pool's Deployment by the apply
    that changes them: an operator stopped before status reported it finishes it after a
    restart (status.lastDecision and the ScaledUp/ScaledDown event)."""

    role: Role
    pool: str
    from_replicas: int
    to_replicas: int
    last_decision: Mapping[str, Any]  # status.lastDecision of that decision

    @property
    def time(self) -> str:
        """When it was decided (RFC 3339, as status.lastDecision.time)."""
        return str(self.last_decision["time"])

    def to_json(self) -> str:
        """The annotation's compact form."""
        fields = {
            "role": self.role,
            "pool": self.pool,
            "from": self.from_replicas,
            "to": self.to_replicas,
            **self.last_decision,
        }
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "ScaleRecord | None":
        """Read `to_json`'s form back; None for anything else (a hand-edited annotation)."""
        try:
            data = json.loads(text)
            if data["role"] not in get_args(Role) or not isinstance(data["time"], str):
                return None
            return cls(
                role=data["role"],
                pool=str(data["pool"]),
                from_replicas=int(data["from"]),
                to_replicas=int(data["to"]),
                last_decision={name: data[name] for name in LAST_DECISION_FIELDS},
            )
        except (ValueError, TypeError, KeyError):  # TypeError: not an object
            return None


@dataclass(frozen=True, eq=False)
class DecidedReplicas(Mapping[PoolKey, int]):
    """The replicas to apply (a mapping, compared as one), with the record of each pool whose
    replicas the decision changes."""

    replicas: Mapping[PoolKey, int]
    records: Mapping[PoolKey, ScaleRecord] = field(default_factory=dict)

    def __getitem__(self, key: PoolKey) -> int:
        return self.replicas[key]

    def __iter__(self) -> Iterator[PoolKey]:
        return iter(self.replicas)

    def __len__(self) -> int:
        return len(self.replicas)

"""What one autoscaling decision reads and returns (see `core.policy.decide`)."""

from collections.abc import Mapping
from dataclasses import dataclass

from pd_operator.api.spec import Role
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


@dataclass(frozen=True)
class Observation:
    """Everything one decision reads: signals per role, pools, free capacity."""

    signals: Mapping[Role, RoleSignals]
    pools: Mapping[PoolKey, PoolObservation]
    # The node view (`core.capacity.free_capacity`); None: unknown, replicas are not limited
    # by it, and unschedulable pods are left alone (a cluster autoscaler may act on them).
    capacity: FreeCapacity | None = None


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

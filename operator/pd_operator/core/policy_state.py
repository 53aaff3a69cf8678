"""The autoscaler's memory between decisions: small, plain data that the caller stores.

`decide` takes a `PolicyState` and returns a new one; nothing is kept in process memory, so an
operator restart (or the offline simulator) resumes exactly where the last decision left off.
`to_dict`/`from_dict` give a JSON-ready form, e.g. for an annotation.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

from pd_operator.api.spec import Role

# How a pool's capacity estimate was obtained. "lower-bound": only seen while latency was well
# under target, so the true capacity is at least this; it may justify scaling down, never up.
CapacityBasis = Literal["profile", "observed", "lower-bound"]


def pool_key(role: Role, pool: str) -> str:
    """The state key of a pool, e.g. "decode/h200"."""
    return f"{role}/{pool}"


@dataclass(frozen=True)
class PoolMemory:
    """What the policy remembers about one pool."""

    # Recommended replicas before stabilization, for the windows: runs of equal values as
    # (first, last decision time in unix seconds, replicas), oldest first.
    recommendations: tuple[tuple[float, float, int], ...] = ()
    # When the policy first decided for this pool: before a full scale-down window has been
    # seen, the window is not known to hold only lower recommendations.
    since: float | None = None
    # Tokens per second one replica serves within the SLO (prompt tokens for prefill,
    # generated tokens for decode); None until seeded or learned.
    capacity_per_replica: float | None = None
    # This pool's own learned capacity / profile seed where its own signals taught it
    # (`core.learning.PoolEvidence`); None: the role's factor.
    capacity_factor: float | None = None
    load_seconds: float | None = None  # scale-up to Ready, learned from past scale-ups
    # The last up-decision whose replicas are not all Ready yet: when, to how many, and when
    # they are expected to be Ready.
    scaled_up_at: float | None = None
    scaled_up_to: int | None = None
    ready_by: float | None = None
    # Ready replicas over the last SLO window, as (since, ready) runs, oldest first: signals
    # over the window come from these replicas, not only from those Ready now.
    ready_runs: tuple[tuple[float, int], ...] = ()
    # The last shed, and how long a steady load must last before the next one (None: the
    # spec's steady window): doubled each time a shed is undone within a load time.
    shed_at: float | None = None
    shed_wait: float | None = None


@dataclass(frozen=True)
class RoleMemory:
    """What the policy remembers about one role."""

    capacity_basis: CapacityBasis | None = None
    # Learned capacity / profile seed (see `core.learning.RoleCapacity.factor`).
    capacity_factor: float | None = None
    latency_ratio_at_scale_up: float | None = None  # observed/target at the last up-decision
    demand_at_scale_up: float | None = None  # tokens/s at the last up-decision
    ready_at_scale_up: int | None = None  # Ready replicas of the role at the last up-decision
    # A breach (observed/target) that a scale-up did not lower: not one replicas fix.
    futile_ratio: float | None = None
    no_traffic_since: float | None = None
    unavailable_since: float | None = None
    stuck_since: float | None = None  # requests held, none finished
    # Moving averages of the running requests per Ready replica (the batch) and of the square
    # of its change from one decision to the next, and the last sample: how much the batch
    # swings (`batch_dispersion`).
    running_mean: float | None = None
    running_change_square_mean: float | None = None
    running_last: float | None = None
    # Decode: moving averages of the KV tokens and of the sequences holding them, one sample
    # per decision (`core.policy._decode_context`): their ratio is the context a sequence holds.
    kv_tokens_mean: float | None = None
    kv_sequences_mean: float | None = None
    # One (time, demand tokens/s, latency/target) sample per decision over the last scale-down
    # window, oldest first (None where unreadable): whether the load has been steady.
    recent: tuple[tuple[float, float | None, float | None], ...] = ()

    def context_tokens(self) -> float | None:
        """Tokens of context a running decode sequence holds on average (prompt and answer so
        far); None until the KV cache has shown it."""
        tokens, sequences = self.kv_tokens_mean, self.kv_sequences_mean
        return tokens / sequences if tokens and sequences else None

    def batch_dispersion(self) -> float:
        """How much the running requests swing, as variance over mean (1 for Poisson arrivals;
        bursty traffic more); 1 until samples show a mean.

        The variance is half the mean square change between successive samples (Allan's), not
        the spread around the long-run mean: a ramp or a wave the feed-forward follows is no
        swing it must leave room for (measured around the mean, a ramp from 0 to 900
        sequences read as 240 and sized decode at 15 replicas for a load 4 carried).
        """
        mean, change = self.running_mean, self.running_change_square_mean
        if mean is None or change is None or mean <= 0:
            return 1.0
        return max(1.0, change / 2 / mean)


@dataclass(frozen=True)
class PolicyState:
    """The policy's memory for one PDDeployment."""

    pools: Mapping[str, PoolMemory] = field(default_factory=dict)
    roles: Mapping[str, RoleMemory] = field(default_factory=dict)

    def pool(self, role: Role, name: str) -> PoolMemory:
        """The memory of a pool (empty when new)."""
        return self.pools.get(pool_key(role, name), PoolMemory())

    def role(self, role: Role) -> RoleMemory:
        """The memory of a role (empty when new)."""
        return self.roles.get(role, RoleMemory())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "pools": {key: _fields(memory) for key, memory in sorted(self.pools.items())},
            "roles": {key: _fields(memory) for key, memory in sorted(self.roles.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PolicyState":
        """Read `to_dict`'s form back; unknown keys are ignored, bad values raise ValueError."""
        try:
            pools = {
                str(key): _pool_memory(value) for key, value in (data.get("pools") or {}).items()
            }
            roles = {
                str(key): _role_memory(value) for key, value in (data.get("roles") or {}).items()
            }
        except (TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"unreadable policy state: {error}") from error
        return cls(pools=pools, roles=roles)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in (PoolMemory, RoleMemory)
}


def _fields(memory: PoolMemory | RoleMemory) -> dict[str, Any]:
    """A memory's fields, plain. Not `dataclasses.asdict`: its deep copies were a third of an
    autoscaler cycle at 500 objects (the samples of `RoleMemory.recent`)."""
    return {name: _plain(getattr(memory, name)) for name in _FIELD_NAMES[type(memory)]}


def _plain(value: Any) -> Any:
    """Tuples as lists, so the form is exactly what JSON gives back."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number: {value!r}")
    return float(value)


def _pool_memory(data: Mapping[str, Any]) -> PoolMemory:
    known = {f.name for f in fields(PoolMemory)} - {
        "recommendations",
        "scaled_up_to",
        "ready_runs",
    }
    values = {name: _number(data.get(name)) for name in known}
    history = tuple(
        (_time(first), _time(last), _count(replicas))
        for first, last, replicas in data.get("recommendations") or ()
    )
    ready = tuple((_time(since), _count(count)) for since, count in data.get("ready_runs") or ())
    target = data.get("scaled_up_to")
    return PoolMemory(
        recommendations=history,
        scaled_up_to=None if target is None else _count(target),
        ready_runs=ready,
        **values,
    )


def _time(value: Any) -> float:
    number = _number(value)
    if number is None:
        raise ValueError("a time is missing")
    return number


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a replica count: {value!r}")
    return value


def _role_memory(data: Mapping[str, Any]) -> RoleMemory:
    basis = data.get("capacity_basis")
    if basis is not None and basis not in get_args(CapacityBasis):
        raise ValueError(f"unknown capacity basis {basis!r}")
    known = {f.name for f in fields(RoleMemory)} - {
        "capacity_basis",
        "ready_at_scale_up",
        "recent",
    }
    ready = data.get("ready_at_scale_up")
    recent = tuple(
        (_time(at), _number(demand), _number(ratio))
        for at, demand, ratio in data.get("recent") or ()
    )
    return RoleMemory(
        capacity_basis=basis,
        ready_at_scale_up=None if ready is None else _count(ready),
        recent=recent,
        **{name: _number(data.get(name)) for name in known},
    )

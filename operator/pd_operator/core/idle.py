"""Coupled scale to zero (`spec.scaling.idleSeconds`): both roles go to zero together after that
long without a request at the router, and come back together when one arrives.

The router's activator (`pd_operator.activator`) counts the requests it receives and holds the
ones that arrive while no engine serves. At zero there are no engine metrics at all, so the
activator's series are the only signal: any new request, any request in flight and any request
held is traffic. The rule runs after the policy (`core.policy.decide`) and overrides its
replicas only in three cases:

* idle long enough, nothing in flight or held: every pool to zero, in one decision, so that
  prefill never stays up with its decode gone (or the reverse) while a request needs both;
* at zero with a request held (or any traffic): each role back to at least one replica,
  together, in one decision;
* awake: no role below one replica (the policy may ask for 0 with `replicas.min: 0`; a role at
  zero while the other serves would fail every request).

Unknown traffic (the activator's series missing) is never idleness: awake pools stay up; pools
at zero stay there, and the condition says that a held request cannot be seen.
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace

from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.children import ROLES, PoolKey
from pd_operator.core.decision import Decision
from pd_operator.core.signals import RouterTraffic


@dataclass(frozen=True)
class IdleMemory:
    """What the rule remembers between decisions (the autoscaler's, not persisted: after a
    restart the idle time starts again, which only delays a scale to zero)."""

    requests_total: float | None = None  # the counter as last read
    active_at: float | None = None  # when traffic was last seen


@dataclass(frozen=True)
class IdleOutcome:
    """The replicas after the rule, whether the object is at zero, and why."""

    replicas: Mapping[PoolKey, int]
    memory: IdleMemory
    scaled_to_zero: bool  # every pool asked to be at zero
    reason: str  # what the rule did ("" when it left the policy's replicas alone)
    traffic_known: bool


def apply_idle(
    spec: PDDeploymentSpec,
    traffic: RouterTraffic | None,
    current: Mapping[PoolKey, int],
    decided: Mapping[PoolKey, int],
    *,
    memory: IdleMemory,
    now: float,
) -> IdleOutcome:
    """The replicas to apply once the idle rule has had its say. `current`: what each pool
    runs now; `decided`: what the policy asked for; `traffic` None: not read."""
    idle_seconds = spec.scaling.idle_seconds
    at_zero = all(n == 0 for n in current.values())
    if idle_seconds is None:
        return IdleOutcome(dict(decided), memory, False, "", traffic is not None)
    if traffic is None:
        # Unknown is not idle; at zero, nothing can be woken.
        active = IdleMemory(memory.requests_total, now)
        if at_zero:
            zero = {key: 0 for key in decided}
            why = "at zero: no activator metrics from the router, so a held request is not seen"
            return IdleOutcome(zero, active, True, why, False)
        return IdleOutcome(_awake(spec, decided), active, False, "", False)
    new_requests = (
        memory.requests_total is not None and traffic.requests_total != memory.requests_total
    )
    busy = traffic.pending > 0 or traffic.in_flight > 0 or new_requests
    active_at = now if busy or memory.active_at is None else memory.active_at
    remembered = IdleMemory(traffic.requests_total, active_at)
    if at_zero:
        if busy:
            held = round(traffic.pending)
            why = f"waking from zero: {held} request(s) held at the router, both roles start"
            return IdleOutcome(_awake(spec, decided), remembered, False, why, True)
        zero = {key: 0 for key in decided}
        return IdleOutcome(zero, remembered, True, "at zero: no request at the router", True)
    quiet = now - active_at
    if quiet >= idle_seconds:
        zero = {key: 0 for key in decided}
        why = f"no request at the router for {quiet:.0f}s (idleSeconds {idle_seconds}): to zero"
        return IdleOutcome(zero, remembered, True, why, True)
    return IdleOutcome(_awake(spec, decided), remembered, False, "", True)


def _awake(spec: PDDeploymentSpec, decided: Mapping[PoolKey, int]) -> dict[PoolKey, int]:
    """The policy's replicas with each role at one replica or more (its first pool, the
    preferred one, takes the one)."""
    replicas = dict(decided)
    for role in ROLES:
        pools = spec.pools(role)
        if pools and sum(replicas.get((role, p.name), 0) for p in pools) == 0:
            first = (role, pools[0].name)
            replicas[first] = max(1, replicas.get(first, 0))
    return replicas


def with_idle(decision: Decision, idle: IdleOutcome) -> Decision:
    """The policy's decision with the rule's replicas, and its reason where it acted."""
    if not idle.reason and idle.replicas == decision.replicas:
        return decision
    pools = tuple(
        pool
        if idle.replicas.get((pool.role, pool.pool), pool.desired_replicas) == pool.desired_replicas
        else replace(
            pool,
            desired_replicas=idle.replicas[(pool.role, pool.pool)],
            reason=idle.reason or f"{pool.role}: at least one replica while the other role serves",
        )
        for pool in decision.pools
    )
    return replace(
        decision,
        replicas=dict(idle.replicas),
        pools=pools,
        reason=idle.reason or decision.reason,
    )

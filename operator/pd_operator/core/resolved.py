"""A PDDeployment's spec resolved once per generation: what the scaling rules look up in it.

Every decision reads each pool's profiles and each role's SLO target many times over; they
change only with the spec. The autoscaler keeps one `ResolvedSpec` per parsed spec
(`handlers.autoscaler.Tracked`) and the offline replay one per run, so `core.policy.decide`
and `core.learning` look nothing up by name.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pd_operator.api.spec import (
    PERCENTILE_SHARES,
    ROLE_NAMES,
    LatencyTarget,
    PDDeploymentSpec,
    Role,
)
from pd_operator.core.hardware import HARDWARE_PROFILES, HardwareProfile, ModelProfile
from pd_operator.core.histogram_bounds import exported_bounds
from pd_operator.core.profiles import model_profile_for
from pd_operator.core.signals import LATENCY_NAMES

Profiles = tuple[HardwareProfile, ModelProfile]


@dataclass(frozen=True)
class RoleTerms:
    """What one role is scaled on, and its pools' profiles."""

    target: LatencyTarget
    share: float  # the target's percentile as a share of requests (P99: 0.99)
    latency_name: str  # the latency it scales on, in reasons and logs: TTFT, ITL
    # The bounds of the histogram its latency percentile is read from, as the engines export
    # it (`core.histogram_bounds`): where a reading may lie (`core.signals.bucket_of`).
    latency_buckets: tuple[float, ...]
    # Per pool name: the pool's card and the model, or None when either has no profile (its
    # capacity is learned online).
    profiles: Mapping[str, Profiles | None]


@dataclass(frozen=True)
class ResolvedSpec:
    """A spec with its profiles and per-role terms looked up; build it with `resolve`."""

    spec: PDDeploymentSpec
    model: ModelProfile | None
    roles: Mapping[Role, RoleTerms]

    def role(self, role: Role) -> RoleTerms:
        """The role's SLO target, latency name and pool profiles."""
        return self.roles[role]

    def profiles(self, role: Role, pool: str) -> Profiles | None:
        """The pool's card and the model, when both have a profile; None: learn online."""
        return self.roles[role].profiles[pool]


def resolve(
    spec: PDDeploymentSpec,
    bounds: Callable[[PDDeploymentSpec, Role], tuple[float, ...]] = exported_bounds,
) -> ResolvedSpec:
    """Look up what the scaling rules read from `spec`: once per generation, not per decision.
    `bounds` says what each role's latency histogram resolves (the offline replay's engines
    may export others than the spec's would)."""
    model = model_profile_for(spec.model.name)
    roles: dict[Role, RoleTerms] = {}
    for role in ROLE_NAMES:
        target = spec.slo.target(role)
        profiles: dict[str, Profiles | None] = {}
        for pool in spec.pools(role):
            hardware = HARDWARE_PROFILES.get(pool.accelerator.profile or "")
            profiles[pool.name] = None if hardware is None or model is None else (hardware, model)
        roles[role] = RoleTerms(
            target=target,
            share=PERCENTILE_SHARES[target.percentile],
            latency_name=LATENCY_NAMES[role],
            latency_buckets=bounds(spec, role),
            profiles=profiles,
        )
    return ResolvedSpec(spec, model, roles)

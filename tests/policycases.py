"""Builders shared by the tests of the autoscaling policy's `decide` (`tests/unit/test_policy_*.py`,
and the decision tests in test_schedules.py, test_seasonal.py and test_decode_utilisation.py):
specs, signals and observations, a calibrated state, and a loop that applies each decision."""

import copy
from typing import Any

from pd_operator.api import parse_pddeployment
from pd_operator.api.spec import PDDeploymentSpec, Role
from pd_operator.core.capacity import FreeCapacity, free_capacity
from pd_operator.core.hardware import HARDWARE_PROFILES
from pd_operator.core.learning import seed_capacity
from pd_operator.core.observe import NodeSummary
from pd_operator.core.perfmodel import kv_capacity_tokens
from pd_operator.core.policy import Decision, Observation, PoolObservation, decide
from pd_operator.core.policy_state import PolicyState, PoolMemory, RoleMemory
from pd_operator.core.profiles import model_profile_for
from pd_operator.core.resolved import resolve
from pd_operator.core.signals import NO_TRAFFIC, Reading, RoleSignals
from pd_operator.core.tuning import TUNING
from pdcases import minimal

T0 = 1_000_000.0
INTERVAL = 30.0
ROLES: tuple[Role, Role] = ("prefill", "decode")


def spec_of(changes: dict[str, Any] | None = None) -> PDDeploymentSpec:
    """The minimal PDDeployment (TTFT 1 s, ITL 20 ms, pools p and d, 1..10) with changes."""
    document = minimal()
    for path, value in (changes or {}).items():
        node = document["spec"]
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[int(last) if last.isdigit() else last] = copy.deepcopy(value)
    return parse_pddeployment(document).spec


SPEC = spec_of()
# GLM-4.5 on 8-card S5000 (prefill) and H200 (decode) replicas, TTFT 6 s: the profiles known.
PROFILED_CHANGES: dict[str, Any] = {
    "model.name": "zai-org/GLM-4.5-FP8",
    "prefill.pools.0.accelerator": {
        "resourceName": "mthreads.com/gpu",
        "perReplica": 8,
        "profile": "mtt-s5000",
    },
    "decode.pools.0.accelerator": {
        "resourceName": "nvidia.com/gpu",
        "perReplica": 8,
        "profile": "h200",
    },
    "slo.ttft.targetMilliseconds": 6000,
}
PROFILED = spec_of(PROFILED_CHANGES)


def on_nodes(group: str) -> dict[str, Any]:
    """An accelerator of 8 cards per replica on the nodes labelled g=`group`."""
    return {"resourceName": "g/pu", "perReplica": 8, "nodeSelector": {"g": group}}


TWO_PREFILL_POOLS = spec_of(
    {
        "prefill.pools": [
            {"name": "a", "accelerator": on_nodes("a")},
            {"name": "b", "accelerator": on_nodes("b"), "replicas": {"min": 0, "max": 10}},
        ],
        "decode.pools.0.accelerator": on_nodes("d"),
    }
)


LONG_WINDOW_ONLY = spec_of(
    {
        "scaling.scaleDown": {
            "stabilizationSeconds": 300,
            "maxStepReplicas": 1,
            "steadyStabilizationSeconds": 300,
        }
    }
)


def target_seconds(spec: PDDeploymentSpec, role: Role) -> float:
    return (spec.slo.ttft if role == "prefill" else spec.slo.itl).target_milliseconds / 1000


def signals(
    spec: PDDeploymentSpec,
    role: Role,
    now: float,
    *,
    ratio: float | None = None,
    tokens: float | None = None,
    queue: float = 0.0,
    running: float = 0.0,
    kv: float = 0.3,
    cached: float = 0.0,
) -> RoleSignals:
    """One role's signals: latency at `ratio` x target, `tokens`/s of work, 1000-token prompts,
    `cached` of the prompt tokens found in the prefix cache."""
    latency = NO_TRAFFIC if ratio is None else Reading.of(ratio * target_seconds(spec, role))
    work = NO_TRAFFIC if not tokens else Reading.of(tokens)
    common: dict[str, Any] = {
        "sample_time": now,
        "queue_depth": Reading.of(queue),
        "running_requests": Reading.of(running),
        "requests_per_second": Reading.of((tokens or 0) / 1000) if tokens else NO_TRAFFIC,
        "prompt_tokens_per_second": work,
    }
    if role == "prefill":
        found = Reading.of(cached * tokens) if tokens else NO_TRAFFIC
        return RoleSignals(ttft_seconds=latency, cached_prompt_tokens_per_second=found, **common)
    return RoleSignals(
        itl_seconds=latency,
        generation_tokens_per_second=work,
        kv_cache_usage=Reading.of(kv),
        **common,
    )


def observe(
    spec: PDDeploymentSpec,
    now: float,
    replicas: dict[tuple[Role, str], int | PoolObservation],
    capacity: FreeCapacity | None = None,
    **per_role: dict[str, Any],
) -> Observation:
    """Signals from `per_role` (kwargs of `signals`; a role left out is healthy and idle-ish),
    replicas as counts (all Ready) or PoolObservations."""
    pools = {
        key: value if isinstance(value, PoolObservation) else PoolObservation(value, value)
        for key, value in replicas.items()
    }
    healthy = {"ratio": 0.6, "tokens": 300.0}
    return Observation(
        {role: signals(spec, role, now, **per_role.get(role, healthy)) for role in ROLES},
        pools,
        capacity,
    )


def calibrated(
    spec: PDDeploymentSpec, per_replica: dict[Role, float], since: float | None = None
) -> PolicyState:
    """A state whose capacity estimates are calibrated (as after running near the SLO)."""
    pools = {
        f"{role}/{pool.name}": PoolMemory(capacity_per_replica=per_replica[role], since=since)
        for role in ROLES
        for pool in spec.pools(role)
    }
    return PolicyState(pools, {role: RoleMemory(capacity_basis="observed") for role in ROLES})


def replicas(decision: Decision | None, role: Role = "prefill", pool: str = "p") -> int:
    assert decision is not None
    return decision.replicas[(role, pool)]


def limit(decision: Decision | None, role: Role = "prefill", pool: str = "p") -> str:
    assert decision is not None
    return next(d.limited_by for d in decision.pools if (d.role, d.pool) == (role, pool))


def gpu_nodes(**groups: int) -> FreeCapacity:
    """A ledger of 8-card nodes: `a=2` is two free nodes labelled g=a."""
    nodes = [
        NodeSummary(f"{group}{i}", {"g": group}, (), {"g/pu": "8"}, ready=True)
        for group, count in groups.items()
        for i in range(count)
    ]
    return free_capacity(nodes, [])


def run(
    spec: PDDeploymentSpec,
    state: PolicyState,
    start: dict[tuple[Role, str], int],
    steps: int,
    *,
    now: float = T0,
    **per_role: dict[str, Any],
) -> list[Decision]:
    """Decide every INTERVAL from `now` with fixed signals, applying each decision (pods Ready
    at once)."""
    current, decisions = dict(start), []
    for _ in range(steps):
        decision = decide(spec, observe(spec, now, dict(current), **per_role), state, now)
        assert decision is not None
        decisions.append(decision)
        current.update(decision.replicas)
        state, now = decision.state, now + INTERVAL
    return decisions


def plant_latency_ratio(utilisation: float) -> float:
    """Latency / target of replicas running at `utilisation` of their SLO capacity: a base
    latency, a queueing rise, 1.0 at full SLO capacity, saturating at 130%."""
    return 0.3 / (1 - 0.7 * min(utilisation, 1.3))


def kv_share(running: float, context: int) -> float:
    """The KV cache share `running` sequences of `context` tokens hold in one of PROFILED's
    decode replicas: what its engine reports (the mean over replicas, per replica)."""
    pool = PROFILED.pools("decode")[0]
    hardware = HARDWARE_PROFILES[pool.accelerator.profile or ""]
    model = model_profile_for(PROFILED.model.name)
    assert model is not None
    return running * context / kv_capacity_tokens(hardware, model, pool.accelerator.per_replica)


def seed(role: Role, prompt: int) -> float:
    pool = PROFILED.pools(role)[0]
    value = seed_capacity(
        resolve(PROFILED), role, pool, prompt, prompt_length_cv2=TUNING.prompt_length_cv2
    )
    assert value is not None
    return value

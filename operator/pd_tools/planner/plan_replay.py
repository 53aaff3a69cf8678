"""Capacity plans checked against their own trace: replayed, and grown until the replay holds.

The planner (`core.planner`) sizes pools with queueing formulas: requests arrive at the trace's
mean rate as a Poisson stream. Real traffic comes in bursts that such a stream does not have.
On 10 minutes of Azure's code trace, held to P99 TTFT 6 s and ITL 20 ms, it plans one H20
prefill replica at a predicted 1,443 ms; replayed, 29% of the requests meet the TTFT target on
it. Cards bought on that plan would miss the SLO from the first day.

`replay_plan` replays the trace through the engine simulator with a plan's pools fixed, as a
bought fleet is: no autoscaler. While the share of requests meeting a role's target is under
the plan's share, it adds one replica to each role that misses, and replays again. The shares
count only the requests an idle deployment serves in time (`SimResult.attainment`), as the
planner leaves out the ones no size serves. A role of two pools (a mixed-vendor plan) grows
the pool whose added replica gains the most attainment per cost, each option replayed.

Bursts can make another mix the cheapest one. `cheapest_replayed` plans every subset of the
candidates, and replays and grows the plans from the cheapest up, until the next one's
queueing-model cost (a lower bound: replays only add replicas) is no cheaper than the
cheapest plan a replay confirmed. Growth stops at the candidates' `max` cards, once a plan
costs as much as the best confirmed one, or at MAX_REPLAYS replays in all.
"""

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import cast

from pd_operator.api.document import parse_pddeployment
from pd_operator.api.spec import ROLE_NAMES, Role
from pd_operator.core.hardware import ModelProfile
from pd_tools.planner.sizing import (
    DEFAULT_LINK_BYTES_PER_SECOND,
    MAX_REPLICAS,
    Candidate,
    Plan,
    PoolPlan,
    Target,
    TokenPrices,
    Workload,
    deployment_document,
    evaluate,
    plan,
)
from pd_tools.replay.baselines import StaticPeak
from pd_tools.replay.cluster import Cluster
from pd_tools.replay.offline import simulate
from pd_tools.replay.results import SimResult
from pd_tools.workloads.traces import Request

# Replays one search may run in all; each is one pass of the simulator over the trace's window.
MAX_REPLAYS = 48
# The document a replay deploys only needs a valid name; it reaches no cluster.
REPLAY_NAME = "plan-replay"


@dataclass(frozen=True)
class Replayed:
    """One replay of fixed pools: the shares of the feasible requests meeting each target."""

    pools: tuple[PoolPlan, ...]
    ttft: float
    itl: float
    both: float

    def met(self, role: Role) -> float:
        return self.ttft if role == "prefill" else self.itl

    def short_roles(self, share: float) -> list[Role]:
        """The roles to grow: those whose target fewer than `share` of the requests met; or,
        where each role meets it but not both together, the one that met it least."""
        short = [role for role in ROLE_NAMES if self.met(role) < share]
        if short or self.both >= share:
            return short
        return [min(ROLE_NAMES, key=self.met)]


@dataclass(frozen=True)
class PlanReplay:
    """One plan after its replays, and the replays that led to it (the first: as planned)."""

    plan: Plan
    steps: tuple[Replayed, ...]
    requests: int
    infeasible: int  # requests that miss a target even on an idle deployment
    rejected: int = 0  # requests over the model's context length, refused by every plan

    @property
    def feasible(self) -> int:
        return self.requests - self.infeasible - self.rejected

    @property
    def met(self) -> bool:
        return self.steps[-1].both >= self.plan.target.share

    @property
    def grown(self) -> bool:
        return self.steps[-1].pools != self.steps[0].pools


@dataclass(frozen=True)
class ReplaySearch:
    """The cheapest plan the replays confirmed (or the best they reached), and the search."""

    chosen: PlanReplay
    planned: Replayed  # the queueing model's cheapest plan, replayed as it was planned
    mixes: int  # plans replayed
    replays: int  # simulator runs in all

    @property
    def met(self) -> bool:
        return self.chosen.met

    def to_dict(self) -> dict[str, object]:
        return {
            "requests": self.chosen.requests,
            "infeasible": self.chosen.infeasible,
            "rejected": self.chosen.rejected,
            "met": self.met,
            "mixes": self.mixes,
            "replays": self.replays,
            "planned": _step_dict(self.planned),
            "steps": [_step_dict(step) for step in self.chosen.steps],
        }


class _Budget:
    """Replays left to a search."""

    def __init__(self, replays: int) -> None:
        self.left = replays
        self.used = 0

    def spend(self, replays: int = 1) -> bool:
        if replays > self.left:
            return False
        self.left -= replays
        self.used += replays
        return True


def cheapest_replayed(
    workload: Workload,
    target: Target,
    model: ModelProfile,
    candidates: Sequence[Candidate],
    requests: Sequence[Request],
    *,
    model_name: str,
    prices: TokenPrices | None = None,
    progress: Callable[[Replayed], None] | None = None,
    link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND,
) -> ReplaySearch | None:
    """The cheapest plan whose replay of `requests` meets the target's share; None when the
    queueing model finds no plan at all (`core.planner.no_plan_reason` says why)."""
    ordered = _mixes(
        workload,
        target,
        model,
        candidates,
        prices=prices or TokenPrices(),
        link_bytes_per_second=link_bytes_per_second,
    )
    if not ordered:
        return None
    budget = _Budget(MAX_REPLAYS)
    best: PlanReplay | None = None
    tried: list[PlanReplay] = []
    for candidate_plan in ordered:
        bound = best.plan.cost_per_hour if best is not None else math.inf
        if candidate_plan.cost_per_hour >= bound - 1e-9 or budget.left < 1:
            break
        checked = replay_plan(
            candidate_plan,
            requests,
            model,
            model_name=model_name,
            progress=progress,
            budget=budget,
            below_cost=bound,
        )
        if checked is None:
            break  # the budget ran out before its first replay
        tried.append(checked)
        if checked.met and checked.plan.cost_per_hour < bound:
            best = checked
    chosen = best or max(tried, key=lambda r: r.steps[-1].both)
    return ReplaySearch(chosen, tried[0].steps[0], mixes=len(tried), replays=budget.used)


def _mixes(
    workload: Workload,
    target: Target,
    model: ModelProfile,
    candidates: Sequence[Candidate],
    *,
    prices: TokenPrices,
    link_bytes_per_second: float,
) -> list[Plan]:
    """The queueing model's cheapest plan for every subset of the candidates per role (each
    role's pools from one subset's plan, the other role's from another's), within the
    candidates' `max` cards, cheapest first."""
    found = [
        planned
        for size in range(len(candidates), 0, -1)
        for subset in itertools.combinations(candidates, size)
        if (
            planned := plan(
                workload,
                target,
                model,
                subset,
                prices=prices,
                link_bytes_per_second=link_bytes_per_second,
            )
        )
        is not None
    ]
    if not found:
        return []
    # The plan of all the candidates (first) knows which prompts even the fastest card misses.
    base = found[0]
    per_role = {
        role: {tuple(p for p in f.pools if p.role == role) for f in found} for role in ROLE_NAMES
    }
    plans = []
    for prefill, decode in itertools.product(per_role["prefill"], per_role["decode"]):
        pools = prefill + decode
        if not _within_limits(pools):
            continue
        ttft_ms, itl_ms = evaluate(
            workload, target, model, pools, link_bytes_per_second=link_bytes_per_second
        )
        plans.append(replace(base, pools=pools, ttft_ms=ttft_ms, itl_ms=itl_ms))
    return sorted(plans, key=lambda p: p.cost_per_hour)


def _within_limits(pools: Sequence[PoolPlan]) -> bool:
    """The cards of each type (`max`, counted by profile as the planner does) hold the pools of
    both roles on it."""
    used: dict[str, int] = {}
    limits: dict[str, int] = {}
    for pool in pools:
        name = pool.candidate.hardware.name
        used[name] = used.get(name, 0) + pool.cards
        if pool.candidate.max_cards is not None:
            limits[name] = min(limits.get(name, pool.candidate.max_cards), pool.candidate.max_cards)
    return all(cards <= limits.get(name, cards) for name, cards in used.items())


def replay_plan(
    planned: Plan,
    requests: Sequence[Request],
    model: ModelProfile,
    *,
    model_name: str,
    progress: Callable[[Replayed], None] | None = None,
    budget: _Budget | None = None,
    below_cost: float = math.inf,
) -> PlanReplay | None:
    """Replay `requests` through `planned`'s pools, growing them until the plan's share holds,
    while they cost under `below_cost` per hour and `budget` lasts. `model_name` is
    `spec.model.name` of the deployment replayed; `progress` hears each step. None: the
    budget allowed no replay."""
    if not requests:
        raise ValueError("a plan is replayed on a trace's requests, and there are none")
    budget = budget or _Budget(MAX_REPLAYS)
    share = planned.target.share

    def replayed(pools: tuple[PoolPlan, ...]) -> tuple[Replayed, SimResult]:
        result = _run(replace(planned, pools=pools), requests, model, model_name)
        step = _replayed(pools, result)
        if progress:
            progress(step)
        return step, result

    if not budget.spend():
        return None
    step, first = replayed(planned.pools)
    steps = [step]
    while roles := steps[-1].short_roles(share):
        pools = steps[-1].pools
        for role in roles:
            options = _one_more(pools, role)
            if len(options) > 1 and budget.spend(len(options)):
                tried = [replayed(option)[0] for option in options]
                pools = max(tried, key=lambda r: _gain(r, steps[-1], role)).pools
            elif options:
                pools = options[0]
        cost = sum(p.cost_per_hour for p in pools)
        if pools == steps[-1].pools or cost >= below_cost - 1e-9 or not budget.spend():
            break  # at the limits, no cheaper than a confirmed plan, or out of replays
        steps.append(replayed(pools)[0])
    final = steps[-1].pools
    ttft_ms, itl_ms = evaluate(
        planned.workload,
        planned.target,
        model,
        final,
        link_bytes_per_second=planned.link_bytes_per_second,
    )
    return PlanReplay(
        replace(planned, pools=final, ttft_ms=ttft_ms, itl_ms=itl_ms),
        tuple(steps),
        requests=first.requests,
        infeasible=first.infeasible,
        rejected=first.rejected,
    )


def _one_more(pools: tuple[PoolPlan, ...], role: Role) -> list[tuple[PoolPlan, ...]]:
    """For each pool of `role` with room: the pools with one more replica there. A candidate's
    `max` counts its cards in both roles."""
    out = []
    for index, pool in enumerate(pools):
        if pool.role != role or pool.replicas + 1 > MAX_REPLICAS:
            continue
        grown = (*pools[:index], replace(pool, replicas=pool.replicas + 1), *pools[index + 1 :])
        if _within_limits(grown):
            out.append(grown)
    return out


def _gain(tried: Replayed, before: Replayed, role: Role) -> float:
    """Attainment `role` gained per unit of added cost per hour."""
    added = sum(p.cost_per_hour for p in tried.pools) - sum(p.cost_per_hour for p in before.pools)
    return (tried.met(role) - before.met(role)) / max(added, 1e-9)


def _run(
    sized: Plan, requests: Sequence[Request], model: ModelProfile, model_name: str
) -> SimResult:
    document = deployment_document(sized, name=REPLAY_NAME, model_name=model_name)
    spec = parse_pddeployment(document).spec
    fixed = StaticPeak({(cast(Role, p.role), p.name): p.replicas for p in sized.pools}, name="plan")
    # The replay hands KV over the fabric the plan was sized for.
    cluster = replace(Cluster.fitting(spec), link_bytes_per_second=sized.link_bytes_per_second)
    return simulate(spec, requests, fixed, model=model, cluster=cluster)


def _replayed(pools: tuple[PoolPlan, ...], result: SimResult) -> Replayed:
    feasible = [o for o in result.outcomes if o.feasible]
    n = max(1, len(feasible))
    return Replayed(
        pools,
        ttft=sum(o.ttft_ok for o in feasible) / n,
        itl=sum(o.itl_ok for o in feasible) / n,
        both=sum(o.ttft_ok and o.itl_ok for o in feasible) / n,
    )


def _step_dict(step: Replayed) -> dict[str, object]:
    return {
        "pools": {f"{p.role}/{p.candidate.hardware.name}": p.replicas for p in step.pools},
        "ttft": step.ttft,
        "itl": step.itl,
        "both": step.both,
    }


def _pools_words(pools: Sequence[PoolPlan]) -> str:
    return ", ".join(f"{p.role} {p.candidate.hardware.name} x{p.replicas}" for p in pools)


def step_line(step: Replayed) -> str:
    """One replay in words: the pools, and the shares meeting each target."""
    return (
        f"{_pools_words(step.pools)}: TTFT met by {step.ttft:.1%}, ITL by {step.itl:.1%}, "
        f"both by {step.both:.1%}"
    )


def replay_table(search: ReplaySearch) -> str:
    """What the replays found, to print under the chosen plan's table."""
    chosen = search.chosen
    refused = (
        f"; {chosen.rejected:,} over the model's context length refused" if chosen.rejected else ""
    )
    lines = [
        f"replayed {chosen.requests:,} requests on fixed pools ({search.replays} "
        f"replays of {search.mixes} mix{'es' if search.mixes > 1 else ''}; shares of the "
        f"{chosen.feasible:,} an idle deployment serves in time, target "
        f"{chosen.plan.target.share:.1%}{refused}):",
        f"  as planned  {step_line(search.planned)}",
    ]
    last = chosen.steps[-1]
    if last.pools != search.planned.pools:
        lines.append(f"  chosen      {step_line(last)}")
        lines.append(
            "the queueing model (the mean rate, Poisson arrivals) planned too few replicas: "
            "the table above is the cheapest plan the replay confirmed"
        )
    return "\n".join(lines)


def replay_shortfall(search: ReplaySearch) -> str:
    """Why no replayed plan meets its share, and what to change."""
    last = search.chosen.steps[-1]
    why = (
        f"after {search.replays} replays"
        if search.replays >= MAX_REPLAYS
        else "with the candidates at their limits"
    )
    return (
        f"no replayed plan meets the share {why}; the closest: {step_line(last)}. Allow more "
        "cards (--candidate PROFILE:max=N), add a candidate, or lower --share"
    )

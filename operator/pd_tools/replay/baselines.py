"""Autoscaling policies the offline simulator runs: the operator's own and the baselines.

Every policy sees a `View` at its own interval and answers replicas per pool. `pd-operator`
calls `core.policy.decide` unchanged; the others re-implement the documented control laws of
the systems in /work/shared/CONTEXT.md ("What the best existing systems do") from their
defaults, with per-replica capacity taken from the same performance-model seeds the operator
uses (`core.learning.seed_capacity`), which is what Dynamo's offline profiles provide.
"""

import itertools
import math
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from pd_operator.api.spec import PDDeploymentSpec, PoolSpec, Role
from pd_operator.core.children import PoolKey
from pd_operator.core.decision import Observation
from pd_operator.core.learning import seed_capacity
from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.resolved import ResolvedSpec
from pd_operator.core.seasonal import HORIZON_SECONDS, season_starts, seasons_from_history
from pd_operator.core.signals import LATENCY_NAMES
from pd_tools.replay.offline_metrics import WindowStats
from pd_tools.workloads.traces import Request

ROLES: tuple[Role, Role] = ("prefill", "decode")
# Baselines size for demand at this share of the profiled capacity, as the operator does
# (core.control_law.TARGET_UTILISATION), so differences come from the loops, not the margin.
UTILISATION = 0.8
# Samples of served history past the deepest season dropped at once (not one per decision).
SEASON_PRUNE_SAMPLES = 1000


@dataclass(frozen=True)
class Frontend:
    """What a router/frontend counts over a window: arrivals and their mean lengths."""

    rate_rps: float
    mean_input_tokens: float
    mean_output_tokens: float
    cached_fraction: float
    # Hindsight only: replica-seconds per second of prefill work on the first prefill pool,
    # from each prompt's own length (the L**2 term makes the mean prompt a poor stand-in).
    prefill_busy: float | None = None


@dataclass(frozen=True)
class View:
    """Everything a policy may read at one decision."""

    now: float
    resolved: ResolvedSpec  # the run's spec, resolved once per run (`core.resolved`)
    observation: Observation  # exactly what the operator would pass to `decide`
    stats: Mapping[Role, WindowStats]
    frontend: Frontend
    replicas: Mapping[PoolKey, int]  # what each pool asks for now
    room: Mapping[PoolKey, int]  # most replicas each pool could have (bounds and nodes)

    @property
    def spec(self) -> PDDeploymentSpec:
        return self.resolved.spec


class Policy(Protocol):
    name: str
    interval_s: float
    warm_up: bool  # False: new replicas serve at once (the oracle)
    # A policy may also say why it made its last decision in a `reason` attribute (str); the
    # simulator records it with each scale change (`SimResult.reasons`).

    def decide(self, view: View) -> Mapping[PoolKey, int]: ...


def demand_tokens(frontend: Frontend, role: Role) -> float:
    """Tokens/s a role must serve: uncached prompt tokens (prefill) or output tokens (decode)."""
    if role == "prefill":
        return frontend.rate_rps * frontend.mean_input_tokens * (1 - frontend.cached_fraction)
    return frontend.rate_rps * frontend.mean_output_tokens


def per_replica(resolved: ResolvedSpec, role: Role, pool: PoolSpec, prompt_tokens: float) -> float:
    """Tokens/s one replica serves within the SLO, from the profiles (Dynamo's offline profile)."""
    prompt = max(1, round(prompt_tokens))
    value = seed_capacity(resolved, role, pool, prompt)
    if value is None or value <= 0:
        raise ValueError(f"pool {role}/{pool.name} needs a known hardware and model profile")
    return value


def fill(
    resolved: ResolvedSpec,
    role: Role,
    demand: float,
    prompt_tokens: float,
    room: Mapping[PoolKey, int],
    *,
    utilisation: float = UTILISATION,
) -> dict[PoolKey, int]:
    """Replicas per pool for `demand` tokens/s, pools filled in preference order."""
    left = demand / utilisation
    out: dict[PoolKey, int] = {}
    for pool in resolved.spec.pools(role):
        key = (role, pool.name)
        most = room.get(key, pool.replicas.max)
        each = per_replica(resolved, role, pool, prompt_tokens)
        n = max(pool.replicas.min, min(most, math.ceil(max(0.0, left) / each - 1e-9)))
        out[key] = n
        left -= n * each
    return out


def _clamp(spec: PDDeploymentSpec, key: PoolKey, value: int, room: Mapping[PoolKey, int]) -> int:
    pool = next(p for p in spec.pools(key[0]) if p.name == key[1])
    return max(pool.replicas.min, min(room.get(key, pool.replicas.max), value))


@dataclass
class OperatorPolicy:
    """The operator's policy: `core.policy.decide` with its state carried between calls."""

    interval_s: float
    name: str = "pd-operator"
    warm_up: bool = True
    state: PolicyState = field(default_factory=PolicyState)
    reason: str = ""  # the decision's reason, as the PDDeployment's status would show it
    clock_s: float = 0.0  # Unix time of the replay's second 0, for schedules
    # What each role served (times, tokens/s) at each decision: the history Prometheus would
    # keep, which `spec.scaling.seasonal` reads. Kept only with seasonal on.
    served: dict[Role, tuple[list[float], list[float]]] = field(default_factory=dict)

    def decide(self, view: View) -> Mapping[PoolKey, int]:
        observation = view.observation
        seasonal = view.spec.scaling.seasonal
        if seasonal is not None:
            wall = season_starts(
                self.clock_s + view.now, seasonal.period, seasonal.seasons, seasonal.time_zone
            )
            observation = self._with_seasons(view, [start - self.clock_s for start in wall])
        decision = decide(
            view.resolved, observation, self.state, view.now, wall_clock=self.clock_s + view.now
        )
        if decision is None:
            self.reason = "scaling is Disabled"
            return view.replicas
        self.state, self.reason = decision.state, decision.reason
        return decision.replicas

    def _with_seasons(self, view: View, starts: list[float]) -> Observation:
        """The observation with each role's seasons from `starts` (replay seconds) read from
        the history kept so far, as the operator reads them from Prometheus; then today's
        sample joins the history."""
        signals = dict(view.observation.signals)
        for role, read in signals.items():
            times, values = self.served.setdefault(role, ([], []))
            found = seasons_from_history(times, values, starts)
            signals[role] = replace(read, seasons=found)
            served = (
                read.prompt_tokens_per_second
                if role == "prefill"
                else read.generation_tokens_per_second
            ).rate_or_zero()
            if served is not None:
                times.append(view.now)
                values.append(served)
            # Prometheus' retention: nothing older than the deepest season is read again.
            old = bisect_left(times, min(starts) - HORIZON_SECONDS)
            if old > SEASON_PRUNE_SAMPLES:
                del times[:old], values[:old]
        return replace(view.observation, signals=signals)


@dataclass
class StaticPeak:
    """Fixed replicas sized once for the trace's busiest minute (what most clusters run)."""

    replicas: Mapping[PoolKey, int]
    name: str = "static-peak"
    interval_s: float = 3600.0
    warm_up: bool = True
    reason: str = "fixed at the size for the trace's busiest minute"

    def decide(self, view: View) -> Mapping[PoolKey, int]:
        return self.replicas


@dataclass
class HPA:
    """Kubernetes HPA, one metric per role (as AIBrix and llm-d's KEDA setups use).

    Defaults from CONTEXT.md (KEDA/HPA): 15 s sync, 10% tolerance, 300 s scale-down
    stabilization (the highest recommendation in the window wins); scale-up at most x2 or +4
    pods per 60 s, whichever is more. Metrics, one per role as in llm-d's KEDA guide: prefill
    scales on in-flight requests (waiting + running) per ready pod against what one replica
    holds within the TTFT target at `UTILISATION` of its profiled capacity (Little's law);
    decode on mean KV-cache usage against 0.8. Served tokens/s would be a poor metric: it
    saturates at capacity, so it never shows the queue behind a full pool.
    """

    name: str = "hpa"
    interval_s: float = 15.0
    warm_up: bool = True
    reason: str = ""
    tolerance: float = 0.1
    down_window_s: float = 300.0
    up_period_s: float = 60.0
    history: dict[PoolKey, list[tuple[float, int]]] = field(default_factory=dict)
    ups: dict[PoolKey, list[tuple[float, int]]] = field(default_factory=dict)

    def decide(self, view: View) -> Mapping[PoolKey, int]:
        out = dict(view.replicas)
        words = []
        for role in ROLES:
            pools = view.spec.pools(role)
            ready_total = sum(view.observation.pools[(role, p.name)].ready for p in pools)
            metric = "in-flight requests per pod" if role == "prefill" else "KV-cache usage"
            for pool in pools:
                key = (role, pool.name)
                current = view.replicas[key]
                ready = view.observation.pools[key].ready
                ratio = _hpa_ratio(view, role, pool, ready_total)
                if ratio is None or ready == 0:
                    words.append(f"{role}/{pool.name}: no {metric} reading, hold")
                    continue  # HPA skips a scale when the metric is missing
                raw = current if abs(ratio - 1) <= self.tolerance else math.ceil(ready * ratio)
                out[key] = self._limit(view, key, current, raw)
                limited = f" (limited to {out[key]})" if out[key] != raw else ""
                words.append(f"{role}/{pool.name}: {metric} {ratio:.2f}x target -> {raw}{limited}")
        self.reason = "; ".join(words)
        return out

    def _limit(self, view: View, key: PoolKey, current: int, raw: int) -> int:
        now = view.now
        history = [(t, r) for t, r in self.history.get(key, []) if t > now - self.down_window_s]
        history.append((now, raw))
        self.history[key] = history
        value = raw
        if raw < current:
            value = min(current, max(r for _, r in history))
        ups = [(t, n) for t, n in self.ups.get(key, []) if t > now - self.up_period_s]
        if value > current:
            base = current - sum(n for _, n in ups)
            most = max(2 * base, base + 4)
            value = max(current, min(value, most))
            ups.append((now, value - current))
        self.ups[key] = ups
        return _clamp(view.spec, key, value, view.room)


KV_USAGE_TARGET = 0.8


def _hpa_ratio(view: View, role: Role, pool: PoolSpec, ready_total: int) -> float | None:
    """Metric per pod over its target, or None when unreadable."""
    signals = view.observation.signals.get(role)
    if signals is None or ready_total == 0:
        return None
    if role == "decode":
        usage = signals.kv_cache_usage.rate_or_zero()
        return None if usage is None else usage / KV_USAGE_TARGET
    waiting = signals.queue_depth.rate_or_zero()
    running = signals.running_requests.rate_or_zero()
    if waiting is None or running is None:
        return None
    prompt = view.frontend.mean_input_tokens or 1.0
    ttft_s = view.spec.slo.ttft.target_milliseconds / 1000
    per_pod = UTILISATION * per_replica(view.resolved, role, pool, prompt) * ttft_s / prompt
    return (waiting + running) / ready_total / max(per_pod, 1.0)


def _arima_forecast(history: Sequence[float]) -> float:
    """ARIMA(1,1,0): AR(1) on first differences fitted by least squares; constant if short."""
    if len(history) < 3:
        return history[-1] if history else 0.0
    diffs = [b - a for a, b in itertools.pairwise(history)]
    x, y = diffs[:-1], diffs[1:]
    denominator = sum(v * v for v in x)
    phi = sum(a * b for a, b in zip(x, y, strict=True)) / denominator if denominator else 0.0
    phi = max(-0.99, min(0.99, phi))
    return max(0.0, history[-1] + phi * diffs[-1])


@dataclass
class DynamoSLA:
    """NVIDIA Dynamo's SLA planner (CONTEXT.md).

    Predictive loop every 180 s: forecast the next interval's request rate and mean lengths
    (`predictor` "constant" = last value, or "arima" = ARIMA(1,1,0)), then replicas =
    ceil(predicted demand / per-replica capacity at the SLO) from offline profiles, within the
    cards the nodes have left (Dynamo's one GPU budget for P+D). Reactive loop every 5 s: +1
    replica on a role whose *average* TTFT/ITL exceeds its target, -1 when under half of it
    (Dynamo reads frontend averages).
    """

    predictor: str = "constant"
    name: str = "dynamo-sla"
    interval_s: float = 5.0
    warm_up: bool = True
    reason: str = ""
    predict_every_s: float = 180.0
    last_predict: float = -math.inf
    rates: list[float] = field(default_factory=list)
    last_reactive: dict[Role, float] = field(default_factory=dict)

    def decide(self, view: View) -> Mapping[PoolKey, int]:
        out = dict(view.replicas)
        if view.now - self.last_predict >= self.predict_every_s - 1e-9:
            self.last_predict = view.now
            self.rates.append(view.frontend.rate_rps)
            rate = _arima_forecast(self.rates) if self.predictor == "arima" else self.rates[-1]
            predicted = Frontend(
                rate,
                view.frontend.mean_input_tokens,
                view.frontend.mean_output_tokens,
                view.frontend.cached_fraction,
            )
            prompt = view.frontend.mean_input_tokens or 1
            for role in ROLES:
                # Dynamo sizes at the profile's capacity at the SLO, without a headroom margin.
                out.update(
                    fill(
                        view.resolved,
                        role,
                        demand_tokens(predicted, role),
                        prompt,
                        view.room,
                        utilisation=1.0,
                    )
                )
            self.reason = (
                f"predictive ({self.predictor}): {rate:.2f} requests/s forecast, sized at the "
                "profiles' capacity at the SLO"
            )
            return out
        words = []
        for role in ROLES:
            stats = view.stats.get(role)
            mean = stats.mean_latency_s if stats else None
            if mean is None:
                continue  # NaN at zero traffic: Dynamo holds
            target = view.spec.slo.target(role)
            ratio = mean / (target.target_milliseconds / 1000)
            step = 1 if ratio > 1 else -1 if ratio < 0.5 else 0
            if step == 0:
                continue
            pool = view.spec.pools(role)[0 if step > 0 else -1]
            key = (role, pool.name)
            out[key] = _clamp(view.spec, key, view.replicas[key] + step, view.room)
            name = LATENCY_NAMES[role]
            words.append(f"reactive: {role} mean {name} {ratio:.2f}x target, {step:+d}")
        self.reason = "; ".join(words)
        return out


@dataclass
class LlmdSLO:
    """llm-d's SLO-aware control law (CONTEXT.md).

    s = max(P90 TTFT / target, P90 TPOT / target); scale up when s > 0.55, down when s < 0.40,
    at most 4 pods per 60 s up and 1 pod per 120 s down. Each role uses its own latency (TTFT
    for prefill, TPOT for decode): with disaggregation the max picks which role breaches.
    """

    name: str = "llm-d-slo"
    interval_s: float = 15.0
    warm_up: bool = True
    reason: str = ""
    up_at: float = 0.55
    down_at: float = 0.40
    up_pods: int = 4
    up_period_s: float = 60.0
    down_period_s: float = 120.0
    ups: dict[Role, list[tuple[float, int]]] = field(default_factory=dict)
    last_down: dict[Role, float] = field(default_factory=dict)

    def decide(self, view: View) -> Mapping[PoolKey, int]:
        out = dict(view.replicas)
        words = []
        for role in ROLES:
            stats = view.stats.get(role)
            if stats is None or stats.p90_latency_s is None:
                continue
            target = view.spec.slo.target(role)
            s = stats.p90_latency_s / (target.target_milliseconds / 1000)
            name = "TTFT" if role == "prefill" else "TPOT"
            words.append(
                f"{role}: P90 {name} {s:.2f}x target "
                + (
                    "(up above 0.55)"
                    if s > self.up_at
                    else "(down under 0.40)"
                    if s < self.down_at
                    else "(hold)"
                )
            )
            pools = view.spec.pools(role)
            ups = [(t, n) for t, n in self.ups.get(role, []) if t > view.now - self.up_period_s]
            self.ups[role] = ups
            if s > self.up_at:
                allowed = self.up_pods - sum(n for _, n in ups)
                current = sum(view.replicas[(role, p.name)] for p in pools)
                want = min(allowed, max(1, math.ceil(current * (s / self.up_at - 1))))
                for pool in pools:
                    key = (role, pool.name)
                    grown = _clamp(view.spec, key, view.replicas[key] + max(0, want), view.room)
                    want -= grown - view.replicas[key]
                    ups.append((view.now, grown - view.replicas[key]))
                    out[key] = grown
            elif s < self.down_at and (
                view.now - self.last_down.get(role, -math.inf) >= self.down_period_s
            ):
                for pool in reversed(pools):
                    key = (role, pool.name)
                    shrunk = _clamp(view.spec, key, view.replicas[key] - 1, view.room)
                    if shrunk < view.replicas[key]:
                        out[key] = shrunk
                        self.last_down[role] = view.now
                        break
        self.reason = "; ".join(words)
        return out


class Arrivals:
    """Requests sorted by arrival with prefix sums: any window's frontend counts in O(log n)."""

    def __init__(
        self, requests: Sequence[Request], prefill_s: Callable[[Request], float] | None = None
    ) -> None:
        self.times = [r.arrival_s for r in requests]
        self._sums = [(0, 0, 0)]
        self._busy = [0.0]
        for r in requests:
            i, o, c = self._sums[-1]
            self._sums.append((i + r.input_tokens, o + r.output_tokens, c + r.cached_tokens))
            self._busy.append(self._busy[-1] + (prefill_s(r) if prefill_s else 0.0))
        self._has_busy = prefill_s is not None

    def between(self, start: float, end: float) -> Frontend:
        """Arrivals in [start, end): rate and mean lengths."""
        low, high = bisect_left(self.times, start), bisect_left(self.times, end)
        count = high - low
        if count <= 0 or end <= start:
            return Frontend(0.0, 0.0, 0.0, 0.0)
        inputs, outputs, cached = (
            b - a for a, b in zip(self._sums[low], self._sums[high], strict=True)
        )
        busy = (self._busy[high] - self._busy[low]) / (end - start) if self._has_busy else None
        return Frontend(
            count / (end - start), inputs / count, outputs / count, cached / inputs, busy
        )


def hindsight_demand(resolved: ResolvedSpec, frontend: Frontend, role: Role) -> float:
    """Tokens/s to size a role for, using the per-prompt prefill work when it is known."""
    if role == "prefill" and frontend.prefill_busy is not None:
        first = resolved.spec.pools("prefill")[0]
        return frontend.prefill_busy * per_replica(
            resolved, "prefill", first, frontend.mean_input_tokens or 1
        )
    return demand_tokens(frontend, role)


def started_replicas(
    schedule: Sequence[Mapping[PoolKey, int]], interval_s: float, lead_s: float, now: float
) -> dict[PoolKey, int]:
    """Per pool, the most replicas wanted by any interval of `schedule` (`schedule[k]` holds
    from `k * interval_s`; the last entry to the end) that has not ended by `now` and whose
    replicas are started by then, `lead_s` before it begins. With `lead_s` 0: the current
    interval's entry."""
    first = max(0, math.floor(now / interval_s + 1e-9))
    last = math.floor((now + lead_s) / interval_s + 1e-9)
    out: dict[PoolKey, int] = {}
    for index in range(min(first, len(schedule) - 1), min(last, len(schedule) - 1) + 1):
        for key, count in schedule[index].items():
            out[key] = max(out.get(key, 0), count)
    return out


@dataclass
class Prescient:
    """A perfect forecast under the real model-load time: `schedule[k]` holds what the minute
    from `k * period_s` needs, and each of its replicas starts `lead_s` (the model load) before
    that minute, so that it serves from the minute's first second; a replica stays while a
    minute it was started for has not ended (`started_replicas`).
    `replay.oracle_search.prescient_schedule` finds the schedule; the docs say how. It decides
    every second, so that a start is never late."""

    schedule: Sequence[Mapping[PoolKey, int]]
    lead_s: float
    name: str = "prescient"
    interval_s: float = 1.0
    period_s: float = 60.0
    warm_up: bool = True
    reason: str = "the schedule a perfect forecast finds, started one model load ahead"

    def __post_init__(self) -> None:
        if not self.schedule:
            raise ValueError("the prescient policy needs a schedule of at least one interval")

    def decide(self, view: View) -> Mapping[PoolKey, int]:
        return started_replicas(self.schedule, self.period_s, self.lead_s, view.now)


@dataclass
class Oracle:
    """Hindsight bound: a replica schedule found with perfect knowledge of the trace.

    `schedule[k]` holds from `k * interval_s` (the last entry to the end): per interval, the
    fewest replicas per pool with which the simulated requests meet the SLO, ready at once
    (no warm-up, no stabilization, no step limits). `replay.oracle_search.oracle_schedule`
    finds it by searching against the simulator; the docs say how.
    """

    schedule: Sequence[Mapping[PoolKey, int]]
    name: str = "oracle"
    interval_s: float = 60.0
    warm_up: bool = False
    reason: str = "the hindsight schedule: the fewest replicas that meet the SLO this minute"

    def __post_init__(self) -> None:
        if not self.schedule:
            raise ValueError("the oracle needs a schedule of at least one interval")

    def decide(self, view: View) -> Mapping[PoolKey, int]:
        index = math.floor(view.now / self.interval_s + 1e-9)
        return self.schedule[max(0, min(len(self.schedule) - 1, index))]

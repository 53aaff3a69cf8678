"""What Prometheus would say about a simulated deployment: scrapes, rates and quantiles.

The offline simulator does not run Prometheus; it scrapes the engine's counters and histograms
at the scrape interval and evaluates the operator's queries over the rate window the same way
Prometheus does: `histogram_quantile(q, sum by (le) (rate(X_bucket[w])))` with linear
interpolation inside a bucket, `sum(rate(counter[w]))` for token rates, `sum`/`avg` of the
newest gauge sample. A series that no scraped pod exports is "no series" (unavailable), and a
quantile over a window without observations is NaN, which the adapter reads as no traffic.
"""

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from pd_operator.api.spec import PERCENTILE_SHARES, PDDeploymentSpec, Role
from pd_operator.core.signals import (
    NO_TRAFFIC,
    PoolSignals,
    Reading,
    RoleSignals,
    hand_off_seconds,
    unavailable,
)
from pd_tools.enginesim.engine import Histogram, Instance, PDEngine, State


@dataclass(frozen=True)
class PoolScrape:
    """One pool's share of a role's scrape: its latency histogram and the tokens it served
    (prompt tokens for prefill, generated for decode)."""

    pods: int
    buckets: tuple[int, ...]
    served_tokens: int


@dataclass(frozen=True)
class RoleScrape:
    """One scrape of one role, summed over its pods (counters over every pod ever, as a
    `sum(rate())` over series that stop when a pod goes away adds nothing for it)."""

    pods: int  # pods that answered the scrape (Ready or draining)
    buckets: tuple[int, ...]  # cumulative latency histogram (TTFT for prefill, ITL for decode)
    bounds: tuple[float, ...]
    latency_sum: float
    prompt_tokens: int
    cached_tokens: int  # prompt tokens found in the prefix cache (vLLM's prefix_cache_hits)
    generation_tokens: int
    waiting: int
    running: int
    kv_usage_sum: float
    # (sum, count) of the queue-time, prefill-time and KV-transfer histograms: every pod's
    # of the role (the transfer's are on decode, where it is recorded).
    queue_time: tuple[float, int] = (0.0, 0)
    prefill_time: tuple[float, int] = (0.0, 0)
    kv_transfer: tuple[float, int] = (0.0, 0)
    pools: dict[str, PoolScrape] = field(default_factory=dict)  # empty: not scraped per pool


@dataclass(frozen=True)
class Scrape:
    time_s: float
    roles: dict[Role, RoleScrape]


def _scraped(instance: Instance) -> bool:
    return instance.state in (State.READY, State.DRAINING)


def scrape(engine: PDEngine, time_s: float, pool_of: Callable[[str], str] | None = None) -> Scrape:
    """Read every instance's /metrics at `time_s` (the engine must be advanced to it); with
    `pool_of` (an instance's name to its pool's), each pool's share as well."""
    roles: dict[Role, RoleScrape] = {}
    for role in ("prefill", "decode"):
        members = [i for i in engine.instances() if i.role.value == role]
        live = [i for i in members if _scraped(i)]
        bounds: tuple[float, ...] = (
            engine.buckets.ttft_s if role == "prefill" else (engine.buckets.itl_s)
        )
        totals = [0] * (len(bounds) + 1)
        latency_sum = 0.0
        for instance in members:
            histogram = instance.ttft if role == "prefill" else instance.itl
            for index, count in enumerate(histogram.cumulative()):
                totals[index] += count
            latency_sum += histogram.sum
        roles[role] = RoleScrape(
            pods=len(live),
            buckets=tuple(totals),
            bounds=bounds,
            latency_sum=latency_sum,
            prompt_tokens=sum(i.prompt_tokens_total for i in members),
            cached_tokens=sum(i.prefix_cache_hits_total for i in members),
            generation_tokens=sum(i.generation_tokens_total for i in members),
            waiting=sum(i.waiting for i in live),
            running=sum(i.running for i in live),
            kv_usage_sum=sum(i.kv_usage for i in live),
            queue_time=_sum_count(i.queue_time for i in members),
            prefill_time=_sum_count(i.prefill_time for i in members),
            kv_transfer=_sum_count(i.kv_transfer for i in members),
            pools=_pool_scrapes(role, members, len(bounds), pool_of) if pool_of else {},
        )
    return Scrape(time_s, roles)


def _pool_scrapes(
    role: Role, members: Sequence[Instance], width: int, pool_of: Callable[[str], str]
) -> dict[str, PoolScrape]:
    pods: dict[str, int] = {}
    buckets: dict[str, list[int]] = {}
    served: dict[str, int] = {}
    for instance in members:
        pool = pool_of(instance.name)
        pods[pool] = pods.get(pool, 0) + _scraped(instance)
        totals = buckets.setdefault(pool, [0] * (width + 1))
        histogram = instance.ttft if role == "prefill" else instance.itl
        for index, count in enumerate(histogram.cumulative()):
            totals[index] += count
        served[pool] = served.get(pool, 0) + (
            instance.prompt_tokens_total if role == "prefill" else instance.generation_tokens_total
        )
    return {pool: PoolScrape(pods[pool], tuple(buckets[pool]), served[pool]) for pool in pods}


def _sum_count(histograms: Iterable[Histogram]) -> tuple[float, int]:
    total, count = 0.0, 0
    for histogram in histograms:
        total += histogram.sum
        count += histogram.count
    return total, count


def _mean(a: tuple[float, int], b: tuple[float, int]) -> Reading:
    """A histogram's mean over the window between two scrapes."""
    count = b[1] - a[1]
    return Reading.of(max(0.0, (b[0] - a[0]) / count)) if count > 0 else NO_TRAFFIC


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[int]) -> float:
    """Prometheus' histogram_quantile over cumulative counts (last entry: +Inf); NaN if empty."""
    total = cumulative[-1]
    if total <= 0:
        return math.nan
    rank = q * total
    index = next(i for i, c in enumerate(cumulative) if c >= rank)
    if index == len(bounds):
        return bounds[-1]  # in the +Inf bucket: Prometheus answers the highest finite bound
    lower = bounds[index - 1] if index > 0 else 0.0
    below = cumulative[index - 1] if index > 0 else 0
    inside = cumulative[index] - below
    if inside <= 0:
        return bounds[index]
    return lower + (bounds[index] - lower) * (rank - below) / inside


@dataclass(frozen=True)
class WindowStats:
    """One role over the rate window: what the baselines read besides `RoleSignals`."""

    p90_latency_s: float | None  # None: no observation in the window
    mean_latency_s: float | None


def _pick(scrapes: Sequence[Scrape], now: float, window_s: float) -> tuple[Scrape, Scrape] | None:
    newest = [s for s in scrapes if s.time_s <= now]
    if len(newest) < 2:
        return None
    last = newest[-1]
    # The oldest sample inside the window, as rate() uses; at least the one before `last`.
    inside = [s for s in newest[:-1] if s.time_s >= last.time_s - window_s - 1e-9]
    first = inside[0] if inside else newest[-2]
    return first, last


def role_signals(
    spec: PDDeploymentSpec, scrapes: Sequence[Scrape], now: float, window_s: float
) -> dict[Role, RoleSignals]:
    """The operator's `RoleSignals` per role from the scrapes up to `now`."""
    pair = _pick(scrapes, now, window_s)
    if pair is None:
        return {}
    first, last = pair
    span = last.time_s - first.time_s
    out: dict[Role, RoleSignals] = {}
    for role in ("prefill", "decode"):
        a, b = first.roles[role], last.roles[role]
        if b.pods == 0:
            missing = unavailable("no series: no pod of the role is scraped")
            out[role] = RoleSignals(
                sample_time=last.time_s, ttft_seconds=missing, itl_seconds=missing
            )
            continue
        target = spec.slo.target(role)
        delta = [y - x for x, y in zip(a.buckets, b.buckets, strict=True)]
        value = histogram_quantile(PERCENTILE_SHARES[target.percentile], b.bounds, delta)
        latency = NO_TRAFFIC if math.isnan(value) else Reading.of(value)
        requests = delta[-1] / span
        mean = (b.latency_sum - a.latency_sum) / delta[-1] if delta[-1] > 0 else math.nan
        mean_latency = NO_TRAFFIC if math.isnan(mean) else Reading.of(mean)
        # The connector's transfers are recorded on decode, the TTFT on prefill.
        queue = _mean(a.queue_time, b.queue_time)
        hand_off = hand_off_seconds(
            mean_latency,
            queue,
            _mean(a.prefill_time, b.prefill_time),
            _mean(first.roles["decode"].kv_transfer, last.roles["decode"].kv_transfer),
        )
        out[role] = RoleSignals(
            sample_time=last.time_s,
            ttft_seconds=latency if role == "prefill" else unavailable("decode has no TTFT"),
            itl_seconds=latency if role == "decode" else unavailable("prefill has no ITL"),
            queue_depth=Reading.of(b.waiting),
            running_requests=Reading.of(b.running),
            kv_cache_usage=Reading.of(b.kv_usage_sum / b.pods),
            requests_per_second=Reading.of(requests),
            prompt_tokens_per_second=Reading.of((b.prompt_tokens - a.prompt_tokens) / span),
            cached_prompt_tokens_per_second=Reading.of((b.cached_tokens - a.cached_tokens) / span),
            generation_tokens_per_second=Reading.of(
                (b.generation_tokens - a.generation_tokens) / span
            ),
            mean_latency_seconds=mean_latency,
            kv_transfer_seconds=hand_off if role == "prefill" else unavailable("decode"),
            queue_seconds=queue if role == "prefill" else unavailable("decode"),
            pools=_pool_signals(a, b, PERCENTILE_SHARES[target.percentile], span),
        )
    return out


def _pool_signals(a: RoleScrape, b: RoleScrape, q: float, span: float) -> dict[str, PoolSignals]:
    """Each pool scraped now (a pool with no pod left has no series), as its own queries by
    the `pool` label read it."""
    out = {}
    for pool, now in b.pools.items():
        if now.pods == 0:
            continue
        before = a.pools.get(pool)
        start = before.buckets if before else (0,) * len(now.buckets)
        delta = [y - x for x, y in zip(start, now.buckets, strict=True)]
        value = histogram_quantile(q, b.bounds, delta)
        served = now.served_tokens - (before.served_tokens if before else 0)
        out[pool] = PoolSignals(
            NO_TRAFFIC if math.isnan(value) else Reading.of(value), Reading.of(served / span)
        )
    return out


def window_stats(scrapes: Sequence[Scrape], now: float, window_s: float) -> dict[Role, WindowStats]:
    """P90 and mean latency per role over the window (llm-d reads P90, Dynamo averages)."""
    pair = _pick(scrapes, now, window_s)
    out: dict[Role, WindowStats] = {}
    for role in ("prefill", "decode"):
        if pair is None:
            out[role] = WindowStats(None, None)
            continue
        a, b = pair[0].roles[role], pair[1].roles[role]
        delta = [y - x for x, y in zip(a.buckets, b.buckets, strict=True)]
        p90 = histogram_quantile(0.9, b.bounds, delta)
        count = delta[-1]
        mean = (b.latency_sum - a.latency_sum) / count if count else None
        out[role] = WindowStats(None if math.isnan(p90) else p90, mean)
    return out

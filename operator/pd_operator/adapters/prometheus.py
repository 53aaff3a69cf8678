"""Reads the SLO signals of every PDDeployment from Prometheus, a few grouped queries per cycle.

Results are tri-state (`core.signals.Reading`): a value; no traffic (a latency percentile over a
window without requests); or unavailable (the query failed, timed out, or found no series for
the object). Unknown is never zero.
"""

import math
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from pd_operator.adapters import promql
from pd_operator.core.seasonal import HORIZON_SECONDS, STEP_SECONDS, Season, season_starts
from pd_operator.core.signals import (
    NO_TRAFFIC,
    NOT_READ,
    PoolSignals,
    Reading,
    RoleSignals,
    RouterTraffic,
    hand_off_seconds,
    unavailable,
)

RoleKey = tuple[str, str, str]  # (namespace, PDDeployment name, role)
QUERY_TIMEOUT_SECONDS = 5
NO_SERIES = "no series: "  # how an unavailable reading says its query found nothing
QUERY_THREADS = 4  # queries of one cycle in flight at once
# A refused connection or a 503 is tried three times within half a second: prometheus-api-client's
# own backoff (2 s, then 4 s) would outlast the autoscaler's read deadline and hide the cause.
RETRY = Retry(total=2, backoff_factor=0.2, status_forcelist=(408, 429, 500, 502, 503, 504))
# The rate window of the demand history seasonal forecasts read (`core.seasonal`).
SEASON_RATE_WINDOW_SECONDS = 60
# Signals an engine may lack with nothing misconfigured (prefix caching off, an older
# version): a missing series is read as unavailable, never reported as a failing query.
OPTIONAL_SIGNALS = frozenset(
    {"cached_prompt_tokens_per_second", "connector_mean", "queue_mean", "prefill_mean"}
)
# Reads that only make up `RoleSignals.kv_transfer_seconds` (`signals.hand_off_seconds`).
HAND_OFF_PARTS = ("queue_mean", "prefill_mean", "connector_mean")
# Read per pool (`signals.PoolSignals`): each role's latency percentile, and the token counter
# it serves, whose pools are summed for the role's own reading (no query of its own for that).
POOL_LATENCY = "pool_latency_seconds"
SERVED_COUNTER = {"prefill": "prompt_tokens_per_second", "decode": "generation_tokens_per_second"}
PER_POOL = frozenset({POOL_LATENCY, *SERVED_COUNTER.values()})


@dataclass(frozen=True)
class SignalTarget:
    """What to read for one PDDeployment."""

    namespace: str
    name: str
    engine: str  # spec.model.engine
    ttft_percentile: str
    itl_percentile: str
    window_seconds: int
    # `spec.scaling.seasonal`: (period, seasons, time zone); None: no history to read.
    seasonal: tuple[str, int, str] | None = None
    # `spec.scaling.idleSeconds`: read the router's traffic (its activator's series).
    router_traffic: bool = False
    # A role has more than one pool: read each pool's latency and served tokens too
    # (`core.signals.PoolSignals`); two more queries in a cycle where any object asks.
    several_pools: bool = False


@dataclass
class ReadReport:
    """What one read cycle did: the queries sent, failures, and the adapter per engine."""

    queries: int = 0
    errors: list[str] = field(default_factory=list)
    adapters: dict[str, str] = field(default_factory=dict)  # engine -> adapter name
    failing_queries: dict[RoleKey, str] = field(default_factory=dict)  # no series: the query


class PrometheusReader:
    """Grouped, tri-state reads through prometheus-api-client."""

    def __init__(
        self,
        url: str,
        *,
        bearer_token: str | None = None,
        ca_path: str | None = None,
        timeout_seconds: int = QUERY_TIMEOUT_SECONDS,
    ) -> None:
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else None
        session = requests.Session()
        if ca_path:
            session.verify = ca_path
        self._client = PrometheusConnect(
            url=url, headers=headers, session=session, timeout=timeout_seconds, retry=RETRY
        )
        self.url = url
        self._pool = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="prometheus-query")

    def _query(self, text: str, report: ReadReport) -> list[dict[str, Any]] | None:
        return self._query_all([text], report)[0]

    def _query_all(
        self, texts: Sequence[str], report: ReadReport
    ) -> list[list[dict[str, Any]] | None]:
        """Several queries at once, results in order; the report is updated here, not in
        the pool's threads."""
        outcomes = list(self._pool.map(self._send, texts))
        report.queries += len(texts)
        for text, (_, error) in zip(texts, outcomes, strict=True):
            if error is not None:
                report.errors.append(f"{text}: {error}")
        return [result for result, _ in outcomes]

    def _send(self, text: str) -> tuple[list[dict[str, Any]] | None, Exception | None]:
        try:
            result: list[dict[str, Any]] = self._client.custom_query(text)
            return result, None
        except (PrometheusApiClientException, requests.RequestException, ValueError) as error:
            return None, error

    def by_label(self, text: str, label: str) -> dict[str, float] | None:
        """An instant query's values by one label (series without it, or NaN, left out); None
        when the query failed."""
        result, error = self._send(text)
        if error is not None or result is None:
            return None
        values = {}
        for series in result:
            value = float(series["value"][1])
            name = series["metric"].get(label)
            if name and not math.isnan(value):
                values[name] = value
        return values

    def close(self) -> None:
        """Stop the query threads."""
        self._pool.shutdown(wait=False)

    def read(
        self, targets: Sequence[SignalTarget], now: float | None = None
    ) -> tuple[dict[RoleKey, RoleSignals], ReadReport]:
        """Signals per (namespace, name, role) for every target; the report says how it went."""
        now = time.time() if now is None else now
        report = ReadReport()
        present = self._query(promql.detection_query(), report)
        if present is None:
            reason = f"Prometheus at {self.url} unavailable: {report.errors[-1]}"
            return all_signals(targets, now, unavailable(reason)), report
        names = {series["metric"].get("__name__", "") for series in present}
        signals: dict[RoleKey, RoleSignals] = {}
        idle = [t for t in targets if t.router_traffic]
        # Read before the engines': at zero no engine series exist, and this is what wakes.
        traffic = self._read_router_traffic(report) if idle else {}
        for engine in sorted({t.engine for t in targets}):
            group = [t for t in targets if t.engine == engine]
            adapter = promql.detect(names, engine)
            if adapter is None:
                wanted = ", ".join(a.itl_histogram for a in promql.ADAPTERS[engine])
                reading = unavailable(f"no {engine} latency series ({wanted})")
                signals |= all_signals(group, now, reading)
                continue
            report.adapters[engine] = adapter.name
            signals |= self._read_engine(adapter, group, now, report)
            seasonal = [t for t in group if t.seasonal is not None]
            if seasonal:
                seasons = self._read_seasons(adapter, seasonal, now, report)
                for key, found in seasons.items():
                    signals[key] = replace(signals[key], seasons=found)
        for target in idle:
            read = traffic.get((target.namespace, target.name))
            for role in ("prefill", "decode"):
                key = (target.namespace, target.name, role)
                signals[key] = replace(signals[key], router_traffic=read)
        return signals, report

    def _read_router_traffic(self, report: ReadReport) -> dict[tuple[str, str], RouterTraffic]:
        """Every PDDeployment's activator series in one query; an object without all three
        (no activator scraped yet) is left out: its traffic is unknown."""
        result = self._query(promql.router_traffic_query(), report)
        values: dict[tuple[str, str], dict[str, float]] = {}
        for series in result or []:
            labels = series["metric"]
            value = float(series["value"][1])
            if not math.isfinite(value) or value < 0:
                continue
            key = (labels.get("namespace", ""), labels.get("deployment", ""))
            values.setdefault(key, {})[labels.get("__name__", "")] = value
        wanted = (promql.ACTIVATOR_REQUESTS, promql.ACTIVATOR_PENDING, promql.ACTIVATOR_IN_FLIGHT)
        return {
            key: RouterTraffic(*(found[name] for name in wanted))
            for key, found in values.items()
            if all(name in found for name in wanted)
        }

    def _read_seasons(
        self,
        adapter: promql.EngineMetrics,
        targets: Sequence[SignalTarget],
        now: float,
        report: ReadReport,
    ) -> dict[RoleKey, tuple[Season, ...]]:
        """What each role served from this local time one, two, ... periods ago onwards: one
        grouped range query per role and season start, for every target at once (targets of
        the same period and time zone share their starts)."""
        counters = {"prefill": adapter.prompt_tokens, "decode": adapter.generation_tokens}
        starts = {t: season_starts(now, *t.seasonal) for t in targets if t.seasonal is not None}
        jobs = [
            (role, promql.counter_rate_query(counter, SEASON_RATE_WINDOW_SECONDS), start)
            for role, counter in counters.items()
            if counter
            for start in sorted({s for found in starts.values() for s in found})
        ]
        results = list(
            self._pool.map(
                lambda job: self._send_range(job[1], job[2], job[2] + HORIZON_SECONDS), jobs
            )
        )
        report.queries += len(jobs)
        found: dict[tuple[RoleKey, float], Season] = {}
        for (role, query, start), (result, error) in zip(jobs, results, strict=True):
            if error is not None:
                report.errors.append(f"{query} (range from {start:.0f}): {error}")
                continue
            for series in result or []:
                labels = series["metric"]
                if labels.get("role") != role:
                    continue
                key = (labels.get("namespace", ""), labels.get("deployment", ""), role)
                found[(key, start)] = tuple(
                    (float(t) - start, float(v))
                    for t, v in series["values"]
                    if math.isfinite(float(v)) and float(v) >= 0
                )
        return {
            (t.namespace, t.name, role): tuple(
                found.get(((t.namespace, t.name, role), s), ()) for s in target_starts
            )
            for t, target_starts in starts.items()
            for role in counters
        }

    def _send_range(
        self, text: str, start: float, end: float
    ) -> tuple[list[dict[str, Any]] | None, Exception | None]:
        try:
            result: list[dict[str, Any]] = self._client.custom_query_range(
                text,
                start_time=datetime.fromtimestamp(start, UTC),
                end_time=datetime.fromtimestamp(end, UTC),
                step=f"{STEP_SECONDS}s",
            )
            return result, None
        except (PrometheusApiClientException, requests.RequestException, ValueError) as error:
            return None, error

    def _read_engine(
        self,
        adapter: promql.EngineMetrics,
        targets: Sequence[SignalTarget],
        now: float,
        report: ReadReport,
    ) -> dict[RoleKey, RoleSignals]:
        values: dict[RoleKey, dict[str, Any]] = {}  # RoleSignals fields by name

        # (signal, roles, query, keys): planned first, then sent concurrently, since each
        # query waits on Prometheus and none depends on another.
        jobs: list[tuple[str, tuple[str, ...], str, list[tuple[str, str]]]] = []
        # Per-pool reads only where some object has a role of several pools.
        pooled = any(t.several_pools for t in targets)

        def keys_where(**match: Any) -> list[tuple[str, str]]:
            return [
                (t.namespace, t.name)
                for t in targets
                if all(getattr(t, k) == v for k, v in match.items())
            ]

        for role, histogram, signal, field_name in (
            ("prefill", adapter.ttft_histogram, "ttft_seconds", "ttft_percentile"),
            ("decode", adapter.itl_histogram, "itl_seconds", "itl_percentile"),
        ):
            for percentile, window in sorted({(getattr(t, field_name), t.window_seconds)
                                              for t in targets}):  # fmt: skip
                keys = keys_where(**{field_name: percentile, "window_seconds": window})
                for per_pool in (False, True) if pooled else (False,):
                    query = promql.quantile_query(
                        histogram, role, percentile, window, per_pool=per_pool
                    )
                    jobs.append((POOL_LATENCY if per_pool else signal, (role,), query, keys))
        for window in sorted({t.window_seconds for t in targets}):
            keys = keys_where(window_seconds=window)
            for role in ("prefill", "decode"):
                histogram = adapter.ttft_histogram if role == "prefill" else adapter.itl_histogram
                jobs.append(("requests_per_second", (role,),
                             promql.request_rate_query(histogram, role, window), keys))  # fmt: skip
                jobs.append(("mean_latency_seconds", (role,),
                             promql.mean_query(histogram, role, window), keys))  # fmt: skip
            for signal, counter in (
                ("prompt_tokens_per_second", adapter.prompt_tokens),
                ("generation_tokens_per_second", adapter.generation_tokens),
            ):
                if counter:
                    query = promql.counter_rate_query(counter, window, per_pool=pooled)
                    jobs.append((signal, ("prefill", "decode"), query, keys))
            if adapter.cached_prompt_tokens:
                query = promql.counter_rate_query(adapter.cached_prompt_tokens, window)
                jobs.append(("cached_prompt_tokens_per_second", ("prefill",), query, keys))
            if adapter.kv_transfer:
                query = promql.transfer_mean_query(adapter.kv_transfer, window)
                jobs.append(("connector_mean", ("prefill",), query, keys))
            for part, timer in (
                ("queue_mean", adapter.queue_time),
                ("prefill_mean", adapter.prefill_time),
            ):
                if timer:
                    query = promql.mean_query(timer, "prefill", window)
                    jobs.append((part, ("prefill",), query, keys))
        all_keys = keys_where()
        for signal, gauge, aggregate in (
            ("queue_depth", adapter.waiting, "sum"),
            ("running_requests", adapter.running, "sum"),
            ("kv_cache_usage", adapter.kv_usage, "avg"),
        ):
            if gauge:
                jobs.append((signal, ("prefill", "decode"),
                             promql.gauge_query(gauge, aggregate), all_keys))  # fmt: skip

        results = self._query_all([query for _, _, query, _ in jobs], report)
        pools: dict[RoleKey, dict[str, dict[str, Reading]]] = {}  # PoolSignals fields by pool
        for (signal, roles, query, keys), result in zip(jobs, results, strict=True):
            for role in roles:
                found = _found(signal, role, result, pools)
                if found is None:
                    continue
                for namespace, name in keys:
                    key = (namespace, name, role)
                    reading = found.get(key)
                    if result is None:
                        reading = unavailable(f"query failed: {query}")
                    elif reading is None:
                        reading = unavailable(f"{NO_SERIES}{query}")
                        if signal not in OPTIONAL_SIGNALS:
                            report.failing_queries.setdefault(key, query)
                    values.setdefault(key, {})[signal] = reading
        for (_, _, role), read in values.items():
            queue, compute, connector = (read.pop(part, NOT_READ) for part in HAND_OFF_PARTS)
            if role == "prefill":
                ttft_mean = read.get("mean_latency_seconds", NOT_READ)
                read["kv_transfer_seconds"] = hand_off_seconds(ttft_mean, queue, compute, connector)
                read["queue_seconds"] = queue
        role_keys = [(t.namespace, t.name, r) for t in targets for r in ("prefill", "decode")]
        return {
            key: RoleSignals(
                sample_time=now, pools=_pool_signals(pools.get(key, {})), **values.get(key, {})
            )
            for key in role_keys
        }


def _found(
    signal: str,
    role: str,
    result: list[dict[str, Any]] | None,
    pools: dict[RoleKey, dict[str, dict[str, Reading]]],
) -> dict[RoleKey, Reading] | None:
    """One query's readings of one role by object, and (into `pools`) by pool where the query
    is per pool; None for a query read only per pool."""
    if signal not in PER_POOL or (not result and signal != POOL_LATENCY):
        return _by_role(result, role) if result is not None else {}
    per_pool = _by_pool(result or [], role)
    if signal in (POOL_LATENCY, SERVED_COUNTER[role]):
        field_name = "latency_seconds" if signal == POOL_LATENCY else "served"
        for key, readings in per_pool.items():
            for pool, reading in readings.items():
                pools.setdefault(key, {}).setdefault(pool, {})[field_name] = reading
    if signal == POOL_LATENCY:
        return None
    return {key: _sum(readings.values()) for key, readings in per_pool.items()}


def _by_pool(result: list[dict[str, Any]], role: str) -> dict[RoleKey, dict[str, Reading]]:
    """The series of one role by object and pool (a series without the label: pool "")."""
    found: dict[RoleKey, dict[str, Reading]] = {}
    for series in result:
        labels = series["metric"]
        if labels.get("role") == role:
            key = (labels.get("namespace", ""), labels.get("deployment", ""), role)
            found.setdefault(key, {})[labels.get("pool", "")] = _reading(series["value"][1])
    return found


def _sum(readings: Iterable[Reading]) -> Reading:
    """Rates of an object's pools, summed (one that is not a value is left out)."""
    values = [r.value for r in readings if r.value is not None]
    return Reading.of(sum(values)) if values else unavailable("no pool's rate is a value")


def _pool_signals(found: dict[str, dict[str, Reading]]) -> dict[str, PoolSignals]:
    """Named pools with both reads (series without the `pool` label are no pool)."""
    return {
        pool: PoolSignals(read["latency_seconds"], read["served"])
        for pool, read in found.items()
        if pool and "latency_seconds" in read and "served" in read
    }


def _reading(raw: str) -> Reading:
    value = float(raw)
    # NaN: a percentile of a window without requests; that is no traffic, not zero latency.
    if math.isnan(value):
        return NO_TRAFFIC
    return Reading.of(max(0.0, value)) if math.isfinite(value) else unavailable(f"value {raw}")


def _by_role(result: list[dict[str, Any]], role: str) -> dict[RoleKey, Reading]:
    """The series of one role, keyed by object (queries group by namespace, deployment, role)."""
    return {
        (series["metric"].get("namespace", ""), series["metric"].get("deployment", ""), role): (
            _reading(series["value"][1])
        )
        for series in result
        if series["metric"].get("role") == role
    }


def all_signals(
    targets: Iterable[SignalTarget], now: float, reading: Reading
) -> dict[RoleKey, RoleSignals]:
    """The same reading for every signal of every target (a failure that hides everything)."""
    every = RoleSignals(
        sample_time=now,
        ttft_seconds=reading,
        itl_seconds=reading,
        queue_depth=reading,
        running_requests=reading,
        kv_cache_usage=reading,
        requests_per_second=reading,
        prompt_tokens_per_second=reading,
        cached_prompt_tokens_per_second=reading,
        generation_tokens_per_second=reading,
        kv_transfer_seconds=reading,
    )
    return {(t.namespace, t.name, role): every for t in targets for role in ("prefill", "decode")}

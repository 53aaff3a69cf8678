"""The autoscaler loop: one cycle serves every due PDDeployment with a few grouped queries.

Each cycle reads the SLO signals of all due objects from Prometheus (grouped queries, tri-state
results; every server at once, its objects decided as soon as it answers, or with unavailable
metrics once the read deadline passed), the free accelerator capacity from the watched nodes and
pods, and asks `core.policy.decide` for the replicas of every pool. The reconciler applies the
decisions (mode Active) and writes what the autoscaler saw and decided into status; the
autoscaler never writes to the API itself, so status has one writer and nothing fights.
"""

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import Gauge

from pd_operator.adapters import metrics
from pd_operator.adapters.cache import ClusterCache, ObjectKey, Snapshot
from pd_operator.adapters.credentials import (
    NO_CREDENTIALS,
    Credentials,
    CredentialsError,
    FileCredentials,
    PrometheusReaders,
    ReaderFactory,
    ReaderKey,
    SecretCache,
    secret_credentials,
    spec_url_problem,
)
from pd_operator.adapters.prometheus import (
    NO_SERIES,
    PrometheusReader,
    ReadReport,
    RoleKey,
    SignalTarget,
)
from pd_operator.api import InvalidSpecError, PDDeployment, parse_pddeployment
from pd_operator.api.spec import PDDeploymentSpec, PrometheusSpec
from pd_operator.core.capacity import FreeCapacity, free_capacity
from pd_operator.core.children import ROLES, PoolKey
from pd_operator.core.decision import (
    DecidedReplicas,
    Decision,
    Observation,
    ScaleRecord,
)
from pd_operator.core.naming import deployment_name
from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.reconcile import ANNOTATION_LAST_SCALE, all_pools, pool_observations
from pd_operator.core.scaling_view import (
    ScalingOutcome,
    damp_churn,
    finish_scales,
    policy_memory_json,
    scaling_outcome,
    transition_events,
    unreported_scales,
)
from pd_operator.core.signals import RoleSignals, unavailable
from pd_operator.core.status import ScalingView

logger = logging.getLogger(__name__)

# A Prometheus that has not answered a cycle's reads within this long gives unavailable metrics
# for that cycle. Under the 5 s minimum interval less the 1 s tick, so that a hung one never
# stretches another object's cycle; a healthy one answers the grouped queries for 500 objects
# in well under a second (docs/benchmarks.md).
READ_DEADLINE_SECONDS = 3.0
Due = tuple[ObjectKey, PDDeployment, Snapshot]


def _named_secrets(namespace: str, prometheus: PrometheusSpec | None) -> frozenset[tuple[str, str]]:
    refs = (prometheus.bearer_token_secret_ref, prometheus.ca_secret_ref) if prometheus else ()
    return frozenset((namespace, ref.name) for ref in refs if ref is not None)


def _remembered(key: ObjectKey, snapshot: Snapshot) -> PolicyState:
    """The policy memory that status kept, after an operator restart (empty when none)."""
    text = (snapshot.pdd.get("status") or {}).get("policyMemory")
    if not text:
        return PolicyState()
    try:
        return PolicyState.from_dict(json.loads(text))
    except (ValueError, AttributeError) as error:  # JSONDecodeError is a ValueError
        logger.warning("%s/%s: status.policyMemory ignored: %s", *key, error)
        return PolicyState()


def _recorded_scales(pdd: PDDeployment, snapshot: Snapshot) -> list[str]:
    """The scale records kept on the object's pool Deployments."""
    found = []
    for role, pool in all_pools(pdd):
        name = deployment_name(pdd.metadata.name, role, pool.name)
        deployment = snapshot.children.get(("apps/v1", "Deployment", name)) or {}
        text = (deployment.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_LAST_SCALE)
        if text:
            found.append(text)
    return found


def _reported(status: Mapping[str, Any], known: ScalingView | None) -> str | None:
    """The time of the newest decision status shows, or will once the reconciler writes what
    this operator decided."""
    times = [
        decision["time"]
        for decision in (status.get("lastDecision"), known.last_decision if known else None)
        if decision and decision.get("time")
    ]
    return max(times, default=None)


def _as_written(status: Mapping[str, Any], known: ScalingView | None) -> Mapping[str, Any]:
    """Status with the conditions of the view last kept, which the reconciler writes (or has
    written): a transition decided in an earlier cycle, while its object waited in the queue,
    is not announced again."""
    if known is None:
        return status
    conditions = [
        {"type": c.type, "status": "Unknown" if c.status is None else str(c.status)}
        for c in known.conditions
    ]
    return {**status, "conditions": conditions}


def _status_fields(view: ScalingView) -> tuple[Any, ...]:
    return view.observed, view.last_decision, view.conditions


class Autoscaler:
    """Decides replicas for every PDDeployment whose interval is due."""

    def __init__(
        self,
        cache: ClusterCache,
        enqueue: Callable[[list[ObjectKey]], None],
        *,
        default_prometheus_url: str | None = None,
        default_credentials: FileCredentials | None = None,
        secrets: SecretCache | None = None,
        allow_link_local: bool = False,
        readers: ReaderFactory = PrometheusReader,
        clock: Callable[[], float] = time.time,
        read_deadline_seconds: float = READ_DEADLINE_SECONDS,
    ) -> None:
        self.cache = cache
        self.enqueue = enqueue
        self.default_prometheus_url = default_prometheus_url
        self.default_credentials = default_credentials  # for the default URL only
        self.secrets = secrets  # None: Secrets are not read, a reference makes metrics unavailable
        self.allow_link_local = allow_link_local  # for URLs from specs
        self.readers = PrometheusReaders(readers)
        self.clock = clock
        self.read_deadline_seconds = read_deadline_seconds
        self._lock = threading.Lock()
        self._states: dict[ObjectKey, PolicyState] = {}
        self._last_run: dict[ObjectKey, float] = {}
        self._decisions: dict[ObjectKey, Mapping[PoolKey, int]] = {}
        self._views: dict[ObjectKey, ScalingView] = {}
        self._parsed: dict[ObjectKey, tuple[tuple[str, int], PDDeployment | None]] = {}
        self._no_series_since: dict[ObjectKey, dict[str, float]] = {}
        # The pools each object exports series for, so that a pool's go when it leaves the spec.
        self._exported_pools: dict[ObjectKey, set[PoolKey]] = {}
        # What each object reads through and which Secrets it names, so that readers and
        # cached Secrets nobody uses any more are dropped.
        self._sources: dict[ObjectKey, tuple[ReaderKey | None, frozenset[tuple[str, str]]]] = {}
        self.last_report = ReadReport()

    # The reconciler's side: what to apply and what to write into status.
    def decisions_for(self, key: ObjectKey) -> Mapping[PoolKey, int] | None:
        """Replicas to apply for an Active PDDeployment (None: nothing decided yet)."""
        with self._lock:
            return self._decisions.get(key)

    def view_for(self, key: ObjectKey) -> ScalingView | None:
        """Status fields and events; the events are handed out once."""
        with self._lock:
            view = self._views.get(key)
            if view is None:
                return None
            handed = ScalingView(
                observed=view.observed,
                last_decision=view.last_decision,
                policy_memory=view.policy_memory,
                conditions=list(view.conditions),
            )
            handed.events, view.events = view.events, []
            return handed

    def _parse(self, key: ObjectKey, body: Mapping[str, Any]) -> PDDeployment | None:
        """The validated object, parsed again only when its spec changed (a new generation):
        validation is most of a cycle's CPU when hundreds of objects are due."""
        meta = body["metadata"]
        version = (str(meta.get("uid")), int(meta.get("generation") or 0))
        cached = self._parsed.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        try:
            pdd: PDDeployment | None = parse_pddeployment(dict(body))
        except InvalidSpecError:
            pdd = None
        self._parsed[key] = (version, pdd)
        return pdd

    def _source(self, namespace: str, pdd: PDDeployment) -> tuple[str | None, Credentials]:
        """The URL and credentials of an object's Prometheus; raises CredentialsError.

        The operator's own token and CA go to its default URL only, never to a URL from a spec.
        """
        prometheus = pdd.spec.scaling.prometheus
        if prometheus is None:
            url = self.default_prometheus_url
            if url is None or self.default_credentials is None:
                return url, NO_CREDENTIALS
            return url, self.default_credentials.current()
        problem = spec_url_problem(prometheus.url, allow_link_local=self.allow_link_local)
        if problem:
            raise CredentialsError(problem)
        token_ref, ca_ref = prometheus.bearer_token_secret_ref, prometheus.ca_secret_ref
        if token_ref is None and ca_ref is None:
            return prometheus.url, NO_CREDENTIALS
        if self.secrets is None:
            raise CredentialsError(
                "spec.scaling.prometheus: this operator was started without access to Secrets"
            )
        return prometheus.url, secret_credentials(self.secrets, namespace, token_ref, ca_ref)

    def cycle(self) -> int:
        """One pass over every due PDDeployment; returns how many were due."""
        began = time.monotonic()
        now = self.clock()
        due: list[Due] = []
        keys = self.cache.pdd_keys()
        if len(self._parsed) > len(keys):
            self._drop_deleted(set(keys))
        for key in keys:
            body = self.cache.pdd(key)
            pdd = self._parse(key, body) if body is not None else None
            if pdd is None:
                continue  # gone, or invalid: the reconciler reports it
            scaling = pdd.spec.scaling
            if scaling.mode in ("Disabled", "External"):  # External: the reconciler decides
                self._forget(key)
                continue
            if now - self._last_run.get(key, 0.0) < scaling.interval_seconds:
                continue
            # Only a due object's children, pods and nodes are copied: the loop runs every tick.
            snapshot = self.cache.snapshot(key)
            if snapshot is not None:
                due.append((key, pdd, snapshot))
        if not due:
            return 0
        capacity = free_capacity(self.cache.nodes(), self.cache.all_pods())
        for batch, signals in self._read(due, now):
            changed = [
                key
                for key, pdd, snapshot in batch
                if self._decide(key, pdd, snapshot, signals=signals, capacity=capacity, now=now)
            ]
            # Only objects with something new to apply or write; one hand-over per Prometheus,
            # as soon as it answered.
            if changed:
                self.enqueue(changed)
        metrics.DECISION_CYCLE_SECONDS.observe(time.monotonic() - began)
        return len(due)

    def _decide(
        self,
        key: ObjectKey,
        pdd: PDDeployment,
        snapshot: Snapshot,
        *,
        signals: Mapping[RoleKey, RoleSignals],
        capacity: FreeCapacity,
        now: float,
    ) -> bool:
        """Decide one object; True when there is something new to apply or write."""
        observation = Observation(
            signals={role: signals[(key[0], key[1], role)] for role in ROLES},
            pools=pool_observations(pdd, snapshot.children, snapshot.pods),
            capacity=capacity,
        )
        state = self._states.get(key) or _remembered(key, snapshot)
        decision = decide(pdd.spec, observation, state, now)
        if decision is None:
            return False
        return self._record(
            key, pdd=pdd, snapshot=snapshot, observation=observation, decision=decision, now=now
        )

    def _read(
        self, due: list[Due], now: float
    ) -> Iterator[tuple[list[Due], dict[RoleKey, RoleSignals]]]:
        """Grouped reads, one set of queries per Prometheus server and credentials in use, all
        at once: each server's objects come as soon as it answered (within the read deadline;
        unavailable after it), the objects without a usable server first."""
        groups: dict[ReaderKey, list[Due]] = {}
        targets: dict[ReaderKey, list[SignalTarget]] = {}
        unread: list[Due] = []
        signals: dict[RoleKey, RoleSignals] = {}
        for entry in due:
            key, pdd, _ = entry
            spec = pdd.spec
            seasonal = spec.scaling.seasonal
            target = SignalTarget(
                key[0], key[1], spec.model.engine, spec.slo.ttft.percentile,
                spec.slo.itl.percentile, spec.slo.window_seconds,
                seasonal=(
                    (seasonal.period, seasonal.seasons, seasonal.time_zone) if seasonal else None
                ),
            )  # fmt: skip
            named = _named_secrets(key[0], spec.scaling.prometheus)
            try:
                url, credentials = self._source(key[0], pdd)
            except CredentialsError as error:
                url, problem = None, str(error)
            else:
                problem = "no Prometheus URL: set spec.scaling.prometheus.url"
            if url is None:
                self._sources[key] = (None, named)
                missing = unavailable(problem)
                for role in ROLES:
                    signals[(key[0], key[1], role)] = RoleSignals(
                        sample_time=now, ttft_seconds=missing, itl_seconds=missing
                    )
                unread.append(entry)
                continue
            self._sources[key] = ((url, credentials), named)
            groups.setdefault((url, credentials), []).append(entry)
            targets.setdefault((url, credentials), []).append(target)
        live = set(self.cache.pdd_keys())
        self._sources = {k: v for k, v in self._sources.items() if k in live}
        self.readers.retain(k for k, _ in self._sources.values() if k is not None)
        if self.secrets is not None:
            self.secrets.retain(name for _, names in self._sources.values() for name in names)
        if unread:
            yield unread, signals
        report = ReadReport()
        try:
            for reader_key, read, part in self.readers.read(
                targets, now, self.read_deadline_seconds
            ):
                report.queries += part.queries
                report.errors += part.errors
                report.failing_queries |= part.failing_queries
                yield groups[reader_key], read
        finally:
            metrics.PROMETHEUS_QUERIES.inc(report.queries)
            self.last_report = report

    def _record(
        self,
        key: ObjectKey,
        *,
        pdd: PDDeployment,
        snapshot: Snapshot,
        observation: Observation,
        decision: Decision,
        now: float,
    ) -> bool:
        """Keep what the reconciler should write; True when it differs from the last time."""
        spec = pdd.spec
        active = spec.scaling.mode == "Active"
        previous_status = snapshot.pdd.get("status") or {}
        with self._lock:
            known = self._views.get(key)
        # Decisions applied by an operator stopped before it wrote status: reported now.
        unreported = unreported_scales(
            _recorded_scales(pdd, snapshot), _reported(previous_status, known)
        )
        finished, adopted = finish_scales(previous_status, unreported)
        outcome = scaling_outcome(
            spec,
            observation,
            decision,
            no_series=self._no_series(key, observation, now),
            now=now,
            memory=False,  # serialised below, only when status will be written
        )
        view = outcome.view
        steps = {
            pool_key: (observation.pools[pool_key].replicas, wanted)
            for pool_key, wanted in decision.replicas.items()
            if wanted != observation.pools[pool_key].replicas
        }
        damp_churn(view, finished, now, scaled=active and bool(steps))
        advisory = spec.scaling.mode == "Advisory"
        view.events = adopted + transition_events(
            _as_written(previous_status, known), view, decision, observation, advisory=advisory
        )
        before = (known.last_decision if known else None) or previous_status.get("lastDecision")
        with self._lock:
            last = self._decisions.get(key)
        _log_decision(key, decision, steps, before, last, advisory=advisory)
        self._update_metrics(key, spec, outcome, decision, observation)
        decided: DecidedReplicas | None = None
        if active:
            records = {
                (role, pool): ScaleRecord(role, pool, old, new, dict(view.last_decision or {}))
                for (role, pool), (old, new) in steps.items()
            }
            decided = DecidedReplicas(dict(decision.replicas), records)
        with self._lock:
            previous = self._views.get(key)
            changed = (
                previous is None
                or bool(view.events)
                or _status_fields(previous) != _status_fields(view)
                or self._decisions.get(key) != decided
            )
            self._states[key] = decision.state
            self._last_run[key] = now
            if changed:
                if previous is not None:  # events not yet handed to the reconciler
                    view.events = previous.events + view.events
                if view.policy_memory is None:
                    view.policy_memory = policy_memory_json(decision)
                self._views[key] = view
            if decided is None:
                self._decisions.pop(key, None)
            else:
                self._decisions[key] = decided
        return changed

    def _update_metrics(
        self,
        key: ObjectKey,
        spec: PDDeploymentSpec,
        outcome: ScalingOutcome,
        decision: Decision,
        observation: Observation,
    ) -> None:
        for role, met in zip(ROLES, outcome.slo_met, strict=True):
            labels = (key[0], key[1], role)
            _set_or_remove(metrics.SLO_MET, labels, None if met is None else float(met))
            _set(metrics.METRICS_AVAILABLE, labels, 0 if role in outcome.missing else 1)
            signals = observation.signals[role]
            latency = signals.ttft_seconds if role == "prefill" else signals.itl_seconds
            _set_or_remove(metrics.OBSERVED_LATENCY, labels, latency.value)
            target = spec.slo.ttft if role == "prefill" else spec.slo.itl
            _set(metrics.LATENCY_TARGET, labels, target.target_milliseconds / 1000)
        _set(metrics.CAPACITY_AVAILABLE, key, 0 if outcome.capacity_short else 1)
        for pool_key, seen in observation.pools.items():
            values = (seen.replicas, seen.ready, decision.replicas.get(pool_key, seen.replicas))
            for state, value in zip(metrics.POOL_STATES, values, strict=True):
                _set(metrics.POOL_REPLICAS, (*key, *pool_key, state), value)
        exported = set(observation.pools)
        with self._lock:
            gone = self._exported_pools.get(key, set()) - exported
            self._exported_pools[key] = exported
        _remove_pools(key, gone)
        current = sum(p.replicas for p in observation.pools.values())
        wanted = sum(decision.replicas.values())
        direction = "up" if wanted > current else "down" if wanted < current else "hold"
        metrics.DECISIONS.labels(direction=direction, limited_by=decision.limited_by).inc()

    def _no_series(
        self, key: ObjectKey, observation: Observation, now: float
    ) -> dict[str, float | None]:
        """The roles whose latency query found no series, with since when their pods have been
        Ready without it (None: no pod Ready)."""
        since = self._no_series_since.setdefault(key, {})
        found: dict[str, float | None] = {}
        for role in ROLES:
            signals = observation.signals[role]
            latency = signals.ttft_seconds if role == "prefill" else signals.itl_seconds
            if not (latency.reason or "").startswith(NO_SERIES):
                since.pop(role, None)
                continue
            if any(p.ready for (r, _), p in observation.pools.items() if r == role):
                found[role] = since.setdefault(role, now)
            else:
                since.pop(role, None)
                found[role] = None
        return found

    def _drop_deleted(self, live: set[ObjectKey]) -> None:
        """Forget what was kept for objects that no longer exist."""
        for key in [k for k in self._parsed if k not in live]:
            self._forget(key)
            self._parsed.pop(key, None)

    def _forget(self, key: ObjectKey) -> None:
        with self._lock:
            self._states.pop(key, None)
            self._last_run.pop(key, None)
            self._decisions.pop(key, None)
            self._views.pop(key, None)
            self._no_series_since.pop(key, None)
            pools = self._exported_pools.pop(key, set())
        # A deleted (or no longer scaled) object's series would otherwise keep their last
        # values, and an alert on them would fire for an object that is not there.
        _remove_pools(key, pools)
        for role in ROLES:
            for gauge in metrics.ROLE_GAUGES:
                _remove(gauge, (key[0], key[1], role))
        _remove(metrics.CAPACITY_AVAILABLE, key)


def _log_decision(
    key: ObjectKey,
    decision: Decision,
    steps: Mapping[PoolKey, tuple[int, int]],
    before: Mapping[str, Any] | None,
    last: Mapping[PoolKey, int] | None,
    *,
    advisory: bool,
) -> None:
    """One INFO line for a decision that changes a pool's replicas or what limits them, once:
    not again while the same replicas wait to be applied (`last`, the replicas decided before;
    in Advisory mode, the role totals of `before`, the decision status shows). The first
    decision's limit is in status; a steady decision logs nothing."""
    if last is not None:
        steps = {pool: step for pool, step in steps.items() if last.get(pool) != step[1]}
    elif before is not None and all(
        before.get(f"{role}Replicas") == decision.role_replicas(role) for role in ROLES
    ):
        steps = {}
    limit_was = before.get("limitedBy") if before else None
    limit_changed = limit_was is not None and limit_was != decision.limited_by
    if not steps and not limit_changed:
        return
    changes = [f"{role}/{pool} {old} -> {new}" for (role, pool), (old, new) in steps.items()]
    if limit_changed:
        changes.append(f"limitedBy {limit_was} -> {decision.limited_by}")
    logger.info(
        "scaling %s/%s%s: %s: %s",
        *key,
        " (advisory)" if advisory else "",
        ", ".join(changes),
        decision.reason,
    )


# The series this module exports, by gauge and labels: `Gauge.labels` costs more than the
# `set` itself, and a cycle sets about 16 series per object. Only `_remove` removes them.
_SERIES: dict[tuple[Gauge, tuple[str, ...]], Gauge] = {}


def _set(gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
    series = _SERIES.get((gauge, labels))
    if series is None:
        series = _SERIES[(gauge, labels)] = gauge.labels(*labels)
    series.set(value)


def _set_or_remove(gauge: Gauge, labels: tuple[str, ...], value: float | None) -> None:
    """Set a gauge's series, or remove it for an unknown value (absent, not 0)."""
    if value is None:
        _remove(gauge, labels)
    else:
        _set(gauge, labels, value)


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    _SERIES.pop((gauge, labels), None)
    with contextlib.suppress(KeyError):  # never exported
        gauge.remove(*labels)


def _remove_pools(key: ObjectKey, pools: set[PoolKey]) -> None:
    for pool_key in pools:
        for state in metrics.POOL_STATES:
            _remove(metrics.POOL_REPLICAS, (*key, *pool_key, state))

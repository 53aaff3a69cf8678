"""The autoscaler loop: one cycle serves every due PDDeployment with a few grouped queries.

Each cycle reads the SLO signals of all due objects from Prometheus (grouped queries, tri-state
results), the free accelerator capacity from the watched nodes and pods, and asks
`core.policy.decide` for the replicas of every pool. The reconciler applies the decisions (mode
Active) and writes what the autoscaler saw and decided into status; the autoscaler never writes
to the API itself, so status has one writer and nothing fights.
"""

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
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
from pd_operator.core.capacity import free_capacity
from pd_operator.core.children import ROLES, PoolKey
from pd_operator.core.decision import Decision, Observation, PoolObservation
from pd_operator.core.naming import deployment_name
from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.reconcile import all_pools, current_replicas
from pd_operator.core.scaling_view import (
    ScalingOutcome,
    damp_churn,
    scaling_outcome,
    transition_events,
)
from pd_operator.core.signals import RoleSignals, unavailable
from pd_operator.core.status import ScalingView

logger = logging.getLogger(__name__)


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


def _status_fields(view: ScalingView) -> tuple[Any, ...]:
    return view.observed, view.last_decision, view.conditions


def _pool_observations(pdd: PDDeployment, snapshot: Snapshot) -> dict[PoolKey, PoolObservation]:
    replicas = current_replicas(pdd, snapshot.children)
    observed = {}
    for role, pool in all_pools(pdd):
        name = deployment_name(pdd.metadata.name, role, pool.name)
        deployment = snapshot.children.get(("apps/v1", "Deployment", name)) or {}
        status = deployment.get("status") or {}
        pods = [p for p in snapshot.pods if p.role == role and p.pool == pool.name]
        observed[(role, pool.name)] = PoolObservation(
            replicas=replicas[(role, pool.name)],
            ready=status.get("readyReplicas", 0),
            unschedulable=sum(p.unschedulable and not p.terminating for p in pods),
        )
    return observed


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
    ) -> None:
        self.cache = cache
        self.enqueue = enqueue
        self.default_prometheus_url = default_prometheus_url
        self.default_credentials = default_credentials  # for the default URL only
        self.secrets = secrets  # None: Secrets are not read, a reference makes metrics unavailable
        self.allow_link_local = allow_link_local  # for URLs from specs
        self.readers = PrometheusReaders(readers)
        self.clock = clock
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

    def _reader(self, key: ReaderKey) -> PrometheusReader:
        return self.readers.get(*key)

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
        """One pass over every due PDDeployment; returns how many were decided."""
        began = time.monotonic()
        now = self.clock()
        due: list[tuple[ObjectKey, PDDeployment, Snapshot]] = []
        keys = self.cache.pdd_keys()
        if len(self._parsed) > len(keys):
            self._drop_deleted(set(keys))
        for key in keys:
            body = self.cache.pdd(key)
            pdd = self._parse(key, body) if body is not None else None
            if pdd is None:
                continue  # gone, or invalid: the reconciler reports it
            scaling = pdd.spec.scaling
            if scaling.mode == "Disabled":
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
        signals = self._read(due, now)
        capacity = free_capacity(self.cache.nodes(), self.cache.all_pods())
        changed: list[ObjectKey] = []
        for key, pdd, snapshot in due:
            observation = Observation(
                signals={role: signals[(key[0], key[1], role)] for role in ROLES},
                pools=_pool_observations(pdd, snapshot),
                capacity=capacity,
            )
            state = self._states.get(key) or _remembered(key, snapshot)
            decision = decide(pdd.spec, observation, state, now)
            if decision is None:
                continue
            if self._record(
                key,
                pdd=pdd,
                snapshot=snapshot,
                observation=observation,
                decision=decision,
                now=now,
            ):
                changed.append(key)
        # Only objects with something new to apply or write; one hand-over for all of them.
        if changed:
            self.enqueue(changed)
        metrics.DECISION_CYCLE_SECONDS.observe(time.monotonic() - began)
        return len(due)

    def _read(
        self, due: list[tuple[ObjectKey, PDDeployment, Snapshot]], now: float
    ) -> dict[RoleKey, RoleSignals]:
        """Grouped reads, one set of queries per Prometheus server and credentials in use."""
        by_reader: dict[ReaderKey, list[SignalTarget]] = {}
        signals: dict[RoleKey, RoleSignals] = {}
        for key, pdd, _ in due:
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
                continue
            self._sources[key] = ((url, credentials), named)
            by_reader.setdefault((url, credentials), []).append(target)
        live = set(self.cache.pdd_keys())
        self._sources = {k: v for k, v in self._sources.items() if k in live}
        report = ReadReport()
        for reader_key, targets in by_reader.items():
            read, part = self._reader(reader_key).read(targets, now)
            signals |= read
            report.queries += part.queries
            report.errors += part.errors
            report.failing_queries |= part.failing_queries
        self.readers.retain(k for k, _ in self._sources.values() if k is not None)
        if self.secrets is not None:
            self.secrets.retain(name for _, names in self._sources.values() for name in names)
        metrics.PROMETHEUS_QUERIES.inc(report.queries)
        self.last_report = report
        return signals

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
        previous_status = snapshot.pdd.get("status") or {}
        outcome = scaling_outcome(
            spec,
            observation,
            decision,
            no_series=self._no_series(key, observation, now),
            now=now,
        )
        view = outcome.view
        damp_churn(view, previous_status, now)
        view.events = transition_events(
            previous_status, view, decision, observation, advisory=spec.scaling.mode == "Advisory"
        )
        self._update_metrics(key, spec, outcome, decision, observation)
        decided = dict(decision.replicas) if spec.scaling.mode == "Active" else None
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
            metrics.METRICS_AVAILABLE.labels(*labels).set(0 if role in outcome.missing else 1)
            signals = observation.signals[role]
            latency = signals.ttft_seconds if role == "prefill" else signals.itl_seconds
            _set_or_remove(metrics.OBSERVED_LATENCY, labels, latency.value)
            target = spec.slo.ttft if role == "prefill" else spec.slo.itl
            metrics.LATENCY_TARGET.labels(*labels).set(target.target_milliseconds / 1000)
        metrics.CAPACITY_AVAILABLE.labels(namespace=key[0], pddeployment=key[1]).set(
            0 if outcome.capacity_short else 1
        )
        for pool_key, seen in observation.pools.items():
            values = (seen.replicas, seen.ready, decision.replicas.get(pool_key, seen.replicas))
            for state, value in zip(metrics.POOL_STATES, values, strict=True):
                metrics.POOL_REPLICAS.labels(*key, *pool_key, state).set(value)
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


def _set_or_remove(gauge: Gauge, labels: tuple[str, ...], value: float | None) -> None:
    """Set a gauge's series, or remove it for an unknown value (absent, not 0)."""
    if value is None:
        _remove(gauge, labels)
    else:
        gauge.labels(*labels).set(value)


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):  # never exported
        gauge.remove(*labels)


def _remove_pools(key: ObjectKey, pools: set[PoolKey]) -> None:
    for pool_key in pools:
        for state in metrics.POOL_STATES:
            _remove(metrics.POOL_REPLICAS, (*key, *pool_key, state))

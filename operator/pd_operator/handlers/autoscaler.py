"""The autoscaler loop: one cycle serves every due PDDeployment with a few grouped queries.

Each cycle reads the SLO signals of all due objects from Prometheus (grouped queries, tri-state
results), the free accelerator capacity from the watched nodes and pods, and asks
`core.policy.decide` for the replicas of every pool. The reconciler applies the decisions (mode
Active) and writes what the autoscaler saw and decided into status; the autoscaler never writes
to the API itself, so status has one writer and nothing fights.
"""

import calendar
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

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
)
from pd_operator.adapters.prometheus import (
    NO_SERIES,
    PrometheusReader,
    ReadReport,
    RoleKey,
    SignalTarget,
)
from pd_operator.api import InvalidSpecError, PDDeployment, parse_pddeployment
from pd_operator.api.spec import PrometheusSpec
from pd_operator.core import reasons
from pd_operator.core.capacity import free_capacity
from pd_operator.core.children import ROLES, PoolKey
from pd_operator.core.decision import Decision, Observation, PoolObservation
from pd_operator.core.naming import deployment_name
from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.reconcile import EventSpec, all_pools, current_replicas
from pd_operator.core.signals import Reading, ReadingKind, RoleSignals, unavailable
from pd_operator.core.status import ConditionSpec, ScalingView

logger = logging.getLogger(__name__)


def _iso(unix_seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_seconds))


def _milliseconds(signals: RoleSignals | None, attribute: str) -> int | None:
    reading = getattr(signals, attribute, None) if signals else None
    if reading is None or reading.kind is not ReadingKind.VALUE or reading.value is None:
        return None
    return round(float(reading.value) * 1000)


# Status is rewritten at least this often while values drift within the tolerance below.
REFRESH_SECONDS = 300.0
# Observed values that moved less than this (relative) are not worth a status write.
OBSERVED_TOLERANCE = 0.05


def _close(new: Any, old: Any) -> bool:
    if isinstance(new, int | float) and isinstance(old, int | float):
        return abs(new - old) <= OBSERVED_TOLERANCE * max(abs(new), abs(old), 1e-9)
    return bool(new == old)


def _age_seconds(stamp: str | None, now: float) -> float:
    if not stamp:
        return float("inf")
    return now - calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def _damp_churn(view: ScalingView, previous: Mapping[str, Any], now: float) -> None:
    """Keep what status already says when nothing that matters changed, so that a steady
    object costs no status write per cycle: the decision counts when its replicas or its limit
    change; observed values when they move by more than the tolerance; both at least every
    REFRESH_SECONDS."""
    old_decision, new_decision = previous.get("lastDecision"), view.last_decision
    if old_decision and new_decision:
        same = all(
            old_decision.get(k) == new_decision.get(k)
            for k in ("prefillReplicas", "decodeReplicas", "limitedBy")
        )
        if same and _age_seconds(old_decision.get("time"), now) < REFRESH_SECONDS:
            view.last_decision = dict(old_decision)
    old_observed, new_observed = previous.get("observed"), view.observed
    if old_observed and new_observed:
        keys = (set(old_observed) | set(new_observed)) - {"sampleTime"}
        same = all(_close(new_observed.get(k), old_observed.get(k)) for k in keys)
        if same and _age_seconds(old_observed.get("sampleTime"), now) < REFRESH_SECONDS:
            view.observed = dict(old_observed)
            # The memory changes with every decision (its windows hold times); it is written
            # when status is written for another reason, and read back after a restart.
            if view.last_decision == old_decision and previous.get("policyMemory"):
                view.policy_memory = previous["policyMemory"]


def _named_secrets(namespace: str, prometheus: PrometheusSpec | None) -> frozenset[tuple[str, str]]:
    refs = (prometheus.bearer_token_secret_ref, prometheus.ca_secret_ref) if prometheus else ()
    return frozenset((namespace, ref.name) for ref in refs if ref is not None)


def _metrics_configured(
    missing: Mapping[str, Reading],
    observation: Observation,
    lacking_since: Mapping[str, float],
    grace_seconds: float,
    now: float,
) -> ConditionSpec:
    """False when a role's latency query has found no series for longer than `grace_seconds`
    although pods of the role are Ready: the engines run, so Prometheus does not scrape them
    or their labels do not match. (A new target needs a scrape and a rate window first.)"""
    problems, waiting = [], []
    for role, reading in missing.items():
        if not (reading.reason or "").startswith(NO_SERIES):
            continue  # an error or an outage, not a query that finds nothing
        ready = sum(p.ready for (r, _), p in observation.pools.items() if r == role)
        if not ready or now - lacking_since.get(role, now) < grace_seconds:
            waiting.append(role)
        else:
            problems.append(f"{role}: {ready} pods Ready but {reading.reason}")
    if problems:
        message = "; ".join(problems) + (
            ". Check that Prometheus scrapes the pods and relabels pdoperator.io/deployment and "
            "pdoperator.io/role to the labels deployment and role (docs/observability.md), and "
            "that spec.model.engine names the engine that serves them"
        )
        return ConditionSpec(
            reasons.METRICS_CONFIGURED, False, reasons.METRICS_MISCONFIGURED, message[:1024]
        )
    if waiting:
        return ConditionSpec(
            reasons.METRICS_CONFIGURED,
            None,
            reasons.NO_READY_PODS,
            f"no series yet for {', '.join(waiting)}: its pods are not Ready or just started",
        )
    return ConditionSpec(reasons.METRICS_CONFIGURED, True, reasons.AS_EXPECTED, "")


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
        readers: ReaderFactory = PrometheusReader,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self.enqueue = enqueue
        self.default_prometheus_url = default_prometheus_url
        self.default_credentials = default_credentials  # for the default URL only
        self.secrets = secrets  # None: Secrets are not read, a reference makes metrics unavailable
        self.readers = PrometheusReaders(readers)
        self.clock = clock
        self._lock = threading.Lock()
        self._states: dict[ObjectKey, PolicyState] = {}
        self._last_run: dict[ObjectKey, float] = {}
        self._decisions: dict[ObjectKey, Mapping[PoolKey, int]] = {}
        self._views: dict[ObjectKey, ScalingView] = {}
        self._parsed: dict[ObjectKey, tuple[tuple[str, int], PDDeployment | None]] = {}
        self._no_series_since: dict[ObjectKey, dict[str, float]] = {}
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
            snapshot = self.cache.snapshot(key)
            if snapshot is None:
                continue
            pdd = self._parse(key, snapshot.pdd)
            if pdd is None:
                continue  # the reconciler reports it
            scaling = pdd.spec.scaling
            if scaling.mode == "Disabled":
                self._forget(key)
                continue
            if now - self._last_run.get(key, 0.0) >= scaling.interval_seconds:
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
                failing=self.last_report.failing_queries,
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
            target = SignalTarget(
                key[0], key[1], spec.model.engine, spec.slo.ttft.percentile,
                spec.slo.itl.percentile, spec.slo.window_seconds,
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
        failing: Mapping[RoleKey, str],
        now: float,
    ) -> bool:
        """Keep what the reconciler should write; True when it differs from the last time."""
        spec = pdd.spec
        prefill, decode = observation.signals["prefill"], observation.signals["decode"]
        ttft_ms = _milliseconds(prefill, "ttft_seconds")
        itl_ms = _milliseconds(decode, "itl_seconds")
        rps = prefill.requests_per_second.rate_or_zero()
        view = ScalingView(
            observed={  # unknown values are left out, never written as 0
                key: value
                for key, value in (
                    ("ttftMilliseconds", ttft_ms),
                    ("itlMilliseconds", itl_ms),
                    ("requestsPerSecond", round(rps, 3) if rps is not None else None),
                    ("sampleTime", _iso(now)),
                )
                if value is not None
            },
            last_decision={
                "time": _iso(now),
                "prefillReplicas": decision.role_replicas("prefill"),
                "decodeReplicas": decision.role_replicas("decode"),
                "reason": decision.reason[:1024],
                "limitedBy": decision.limited_by,
            },
            policy_memory=json.dumps(decision.state.to_dict(), separators=(",", ":")),
        )
        slo_met = [
            None if ms is None else ms <= target
            for ms, target in (
                (ttft_ms, spec.slo.ttft.target_milliseconds),
                (itl_ms, spec.slo.itl.target_milliseconds),
            )
        ]
        latencies = {"prefill": prefill.ttft_seconds, "decode": decode.itl_seconds}
        missing = {r: s for r, s in latencies.items() if s.kind is ReadingKind.UNAVAILABLE}
        if missing:
            detail = "; ".join(f"{role}: {reading.reason}" for role, reading in missing.items())
            view.conditions.append(
                ConditionSpec(reasons.METRICS_AVAILABLE, False, reasons.METRICS_UNAVAILABLE, detail)
            )
        else:
            view.conditions.append(
                ConditionSpec(reasons.METRICS_AVAILABLE, True, reasons.AS_EXPECTED, "")
            )
        lacking_since = self._lacking_series(key, observation, failing, now)
        grace = spec.slo.window_seconds + spec.scaling.interval_seconds
        view.conditions.append(_metrics_configured(missing, observation, lacking_since, grace, now))
        if None in slo_met:
            view.conditions.append(
                ConditionSpec(reasons.SLO_MET, None, reasons.METRICS_UNAVAILABLE, "latency unknown")
            )
        else:
            met = all(slo_met)
            # Words, not the numbers (those are in status.observed): a message that changed
            # with every sample would cost a status write every cycle.
            message = "; ".join(
                f"{name} {'within' if ok else 'above'} its {target} ms target"
                for name, ok, target in (
                    ("TTFT", slo_met[0], spec.slo.ttft.target_milliseconds),
                    ("ITL", slo_met[1], spec.slo.itl.target_milliseconds),
                )
            )
            view.conditions.append(
                ConditionSpec(
                    reasons.SLO_MET,
                    met,
                    reasons.WITHIN_SLO if met else reasons.SLO_VIOLATED,
                    message,
                )
            )
        capacity_short = decision.limited_by == "capacity"
        view.conditions.append(
            ConditionSpec(
                reasons.CAPACITY_AVAILABLE,
                not capacity_short,
                reasons.CAPACITY_EXHAUSTED if capacity_short else reasons.AS_EXPECTED,
                decision.reason if capacity_short else "",
            )
        )
        _damp_churn(view, snapshot.pdd.get("status") or {}, now)
        view.events = self._transition_events(snapshot, view, decision, observation)
        self._update_metrics(
            key,
            slo_met=slo_met,
            missing=missing,
            capacity_short=capacity_short,
            decision=decision,
            observation=observation,
        )
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

    def _transition_events(
        self,
        snapshot: Snapshot,
        view: ScalingView,
        decision: Decision,
        observation: Observation,
    ) -> list[EventSpec]:
        """Events for changes only: a scale step, or a condition turning bad."""
        before = {
            c["type"]: c.get("status")
            for c in (snapshot.pdd.get("status") or {}).get("conditions") or []
        }
        events = []
        for spec, reason in (
            (reasons.SLO_MET, reasons.EVENT_SLO_VIOLATED),
            (reasons.METRICS_AVAILABLE, reasons.EVENT_METRICS_UNAVAILABLE),
            (reasons.METRICS_CONFIGURED, reasons.EVENT_METRICS_MISCONFIGURED),
            (reasons.CAPACITY_AVAILABLE, reasons.EVENT_CAPACITY_EXHAUSTED),
        ):
            condition = next(c for c in view.conditions if c.type == spec)
            if condition.status is False and before.get(spec) != "False":
                events.append(EventSpec("Warning", reason, condition.message))
        mode = (
            ""
            if snapshot.pdd["spec"].get("scaling", {}).get("mode") != "Advisory"
            else " (advisory)"
        )
        for (role, pool), desired in decision.replicas.items():
            current = observation.pools[(role, pool)].replicas
            if desired != current:
                reason = reasons.EVENT_SCALED_UP if desired > current else reasons.EVENT_SCALED_DOWN
                events.append(
                    EventSpec(
                        "Normal",
                        reason,
                        f"{role} pool {pool}: {current} -> {desired}{mode}: {decision.reason}"[
                            :1024
                        ],
                    )
                )
        return events

    def _update_metrics(
        self,
        key: ObjectKey,
        *,
        slo_met: list[bool | None],
        missing: Mapping[str, Any],
        capacity_short: bool,
        decision: Decision,
        observation: Observation,
    ) -> None:
        for role, met in zip(ROLES, slo_met, strict=True):
            labels = {"namespace": key[0], "pddeployment": key[1], "role": role}
            if met is None:
                with contextlib.suppress(KeyError):  # unknown is absent, not 0 or 1
                    metrics.SLO_MET.remove(*labels.values())
            else:
                metrics.SLO_MET.labels(**labels).set(1 if met else 0)
            metrics.METRICS_AVAILABLE.labels(**labels).set(0 if role in missing else 1)
        metrics.CAPACITY_AVAILABLE.labels(namespace=key[0], pddeployment=key[1]).set(
            0 if capacity_short else 1
        )
        current = sum(p.replicas for p in observation.pools.values())
        wanted = sum(decision.replicas.values())
        direction = "up" if wanted > current else "down" if wanted < current else "hold"
        metrics.DECISIONS.labels(direction=direction, limited_by=decision.limited_by).inc()

    def _lacking_series(
        self,
        key: ObjectKey,
        observation: Observation,
        failing: Mapping[RoleKey, str],
        now: float,
    ) -> dict[str, float]:
        """Since when each role has had Ready pods but no series (roles without: absent)."""
        since = self._no_series_since.setdefault(key, {})
        for role in ROLES:
            ready = any(p.ready for (r, _), p in observation.pools.items() if r == role)
            if (key[0], key[1], role) in failing and ready:
                since.setdefault(role, now)
            else:
                since.pop(role, None)
        return dict(since)

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

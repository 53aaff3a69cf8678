"""The autoscaler loop: one cycle serves every due PDDeployment with a few grouped queries.

A cycle takes the PDDeployments whose interval is due (each parsed again only when its spec
changed), asks the metrics source for their SLO signals (`adapters/metrics_source.py`: grouped
reads, tri-state results; each Prometheus' objects as soon as it answers, or unavailable once
the read deadline passed), adds the free accelerator capacity from the watched nodes and pods,
asks `core.policy.decide` for the replicas of every pool, keeps the outcome in the object's
record, exports it (`adapters/exporter.py`) and hands the objects with something new to the
work queue. The reconciler applies the decisions (mode Active) and writes what the autoscaler
saw and decided into status; the autoscaler never writes to the API itself, so status has one
writer and nothing fights.
"""

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pd_operator.adapters import exporter
from pd_operator.adapters.cache import ClusterCache, ObjectKey, Snapshot
from pd_operator.adapters.credentials import FileCredentials, SecretCache
from pd_operator.adapters.metrics_source import (
    READ_DEADLINE_SECONDS,
    MetricsSource,
    ReaderFactory,
)
from pd_operator.adapters.prometheus import NO_SERIES, PrometheusReader, RoleKey
from pd_operator.api import InvalidSpecError, PDDeployment, parse_pddeployment
from pd_operator.core.capacity import FreeCapacity, free_capacity
from pd_operator.core.children import ROLES, PoolKey, workload_key
from pd_operator.core.decision import (
    DecidedReplicas,
    Decision,
    Observation,
    ScaleRecord,
)
from pd_operator.core.idle import IdleMemory, IdleOutcome, apply_idle, with_idle
from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.reconcile import ANNOTATION_LAST_SCALE, all_pools, pool_observations
from pd_operator.core.resolved import ResolvedSpec, resolve
from pd_operator.core.scaling_view import (
    damp_churn,
    finish_scales,
    policy_memory_json,
    scaling_outcome,
    transition_events,
    unreported_scales,
)
from pd_operator.core.signals import RoleSignals
from pd_operator.core.status import ScalingView

logger = logging.getLogger(__name__)

# How often an object scaled to zero is looked at for a held request (the read deadline's
# minimum interval): a wake-up waits at most this plus a scrape, small beside a model load.
WAKE_CHECK_SECONDS = 5.0


@dataclass
class Tracked:
    """What the autoscaler keeps for one PDDeployment between cycles."""

    version: tuple[str, int]  # (uid, generation) of the spec parsed
    pdd: PDDeployment | None  # None: invalid, the reconciler reports it
    # pdd's spec resolved with it (None with it): the profiles and SLO terms every decision
    # reads, looked up once per generation.
    resolved: ResolvedSpec | None
    # The rest is forgotten when the object stops being scaled.
    state: PolicyState | None = None  # the policy's memory after the last decision
    last_run: float = 0.0
    decided: DecidedReplicas | None = None  # replicas to apply (Active mode only)
    view: ScalingView | None = None  # what the reconciler writes into status, and its events
    # Since when each role's pods have been Ready while its latency query found no series.
    no_series_since: dict[str, float] = field(default_factory=dict)
    exported_pools: set[PoolKey] = field(default_factory=set)  # the pools with series exported
    idle: IdleMemory = field(default_factory=IdleMemory)  # `spec.scaling.idleSeconds`'s memory
    scaled_to_zero: bool = False  # then a held request is looked for every WAKE_CHECK_SECONDS


Due = tuple[Tracked, PDDeployment, ResolvedSpec, Snapshot]


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
    """The scale records kept on the object's pool workloads (Deployments or LeaderWorkerSets)."""
    found = []
    for role, pool in all_pools(pdd):
        workload = snapshot.children.get(workload_key(pdd.metadata.name, role, pool)) or {}
        text = (workload.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_LAST_SCALE)
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
        self.source = MetricsSource(
            default_prometheus_url=default_prometheus_url,
            default_credentials=default_credentials,
            secrets=secrets,
            allow_link_local=allow_link_local,
            readers=readers,
            read_deadline_seconds=read_deadline_seconds,
        )
        self.clock = clock
        # Guards what the reconciler reads (the records' `decided` and `view`) and the dict;
        # everything else is touched by the cycle's thread only.
        self._lock = threading.Lock()
        self._records: dict[ObjectKey, Tracked] = {}

    # The reconciler's side: what to apply and what to write into status.
    def decisions_for(self, key: ObjectKey) -> Mapping[PoolKey, int] | None:
        """Replicas to apply for an Active PDDeployment (None: nothing decided yet)."""
        with self._lock:
            record = self._records.get(key)
            return record.decided if record else None

    def view_for(self, key: ObjectKey) -> ScalingView | None:
        """Status fields and events; the events are handed out once."""
        with self._lock:
            record = self._records.get(key)
            view = record.view if record else None
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

    def cycle(self) -> int:
        """One pass over every due PDDeployment; returns how many were due."""
        began = time.monotonic()
        now = self.clock()
        due: dict[ObjectKey, Due] = {}
        keys = self.cache.pdd_keys()
        if len(self._records) > len(keys):
            self._drop_deleted(set(keys))
        for key in keys:
            record = self._track(key)
            if record is None or record.pdd is None or record.resolved is None:
                continue  # gone, or invalid: the reconciler reports it
            pdd = record.pdd
            scaling = pdd.spec.scaling
            if scaling.mode in ("Disabled", "External"):  # External: the reconciler decides
                self._forget(key, record)
                continue
            every = WAKE_CHECK_SECONDS if record.scaled_to_zero else scaling.interval_seconds
            if now - record.last_run < every:
                continue
            # Only a due object's children, pods and nodes are copied: the loop runs every tick.
            snapshot = self.cache.snapshot(key)
            if snapshot is not None:
                due[key] = (record, pdd, record.resolved, snapshot)
        if not due:
            return 0
        capacity = free_capacity(self.cache.nodes(), self.cache.all_pods())
        reads = self.source.read(
            [(key, pdd) for key, (_, pdd, _, _) in due.items()], now, set(self.cache.pdd_keys())
        )
        for batch, signals in reads:
            changed = [
                key
                for key in batch
                if self._decide(key, *due[key], signals=signals, capacity=capacity, now=now)
            ]
            # Only objects with something new to apply or write; one hand-over per Prometheus,
            # as soon as it answered.
            if changed:
                self.enqueue(changed)
        exporter.observe_cycle(time.monotonic() - began)
        return len(due)

    def _track(self, key: ObjectKey) -> Tracked | None:
        """The object's record (None: it is gone), its spec parsed and resolved again only when
        it changed (a new generation): validation is most of a cycle's CPU when hundreds are
        due."""
        body = self.cache.pdd(key)
        if body is None:
            return None
        meta = body["metadata"]
        version = (str(meta.get("uid")), int(meta.get("generation") or 0))
        record = self._records.get(key)
        if record is not None and record.version == version:
            return record
        try:
            pdd: PDDeployment | None = parse_pddeployment(dict(body))
        except InvalidSpecError:
            pdd = None
        resolved = None if pdd is None else resolve(pdd.spec)
        if record is not None:
            record.version, record.pdd, record.resolved = version, pdd, resolved
            return record
        with self._lock:
            record = self._records[key] = Tracked(version, pdd, resolved)
        return record

    def _decide(
        self,
        key: ObjectKey,
        record: Tracked,
        pdd: PDDeployment,
        resolved: ResolvedSpec,
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
        state = record.state or _remembered(key, snapshot)
        decision = decide(resolved, observation, state, now)
        if decision is None:
            return False
        idle = apply_idle(
            pdd.spec,
            observation.signals["prefill"].router_traffic,
            {pool_key: pool.replicas for pool_key, pool in observation.pools.items()},
            decision.replicas,
            memory=record.idle,
            now=now,
        )
        record.idle, record.scaled_to_zero = idle.memory, idle.scaled_to_zero
        return self._record(
            key,
            record,
            pdd=pdd,
            snapshot=snapshot,
            observation=observation,
            decision=with_idle(decision, idle),
            idle=idle,
            now=now,
        )

    def _record(
        self,
        key: ObjectKey,
        record: Tracked,
        *,
        pdd: PDDeployment,
        snapshot: Snapshot,
        observation: Observation,
        decision: Decision,
        idle: IdleOutcome,
        now: float,
    ) -> bool:
        """Keep what the reconciler should write, and export it; True when it differs from the
        last time."""
        spec = pdd.spec
        active = spec.scaling.mode == "Active"
        previous_status = snapshot.pdd.get("status") or {}
        with self._lock:
            known, last = record.view, record.decided
        # Decisions applied by an operator stopped before it wrote status: reported now.
        unreported = unreported_scales(
            _recorded_scales(pdd, snapshot), _reported(previous_status, known)
        )
        finished, adopted = finish_scales(previous_status, unreported)
        outcome = scaling_outcome(
            spec,
            observation,
            decision,
            no_series=_no_series(record, observation, now),
            idle=idle,
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
        _log_decision(key, decision, steps, before, last, advisory=advisory)
        record.exported_pools = exporter.export_decision(
            key, spec, outcome, decision, observation, exported=record.exported_pools
        )
        decided: DecidedReplicas | None = None
        if active:
            records = {
                (role, pool): ScaleRecord(role, pool, old, new, dict(view.last_decision or {}))
                for (role, pool), (old, new) in steps.items()
            }
            decided = DecidedReplicas(dict(decision.replicas), records)
        with self._lock:
            previous = record.view
            changed = (
                previous is None
                or bool(view.events)
                or _status_fields(previous) != _status_fields(view)
                or record.decided != decided
            )
            record.state = decision.state
            record.last_run = now
            if changed:
                if previous is not None:  # events not yet handed to the reconciler
                    view.events = previous.events + view.events
                if view.policy_memory is None:
                    view.policy_memory = policy_memory_json(decision)
                record.view = view
            record.decided = decided
        return changed

    def _drop_deleted(self, live: set[ObjectKey]) -> None:
        """Forget the objects that no longer exist."""
        with self._lock:
            gone = {key: self._records.pop(key) for key in list(self._records) if key not in live}
        for key, record in gone.items():
            exporter.remove_object(key, record.exported_pools)

    def _forget(self, key: ObjectKey, record: Tracked) -> None:
        """Forget what was decided for an object no longer scaled (its parsed spec is kept)."""
        with self._lock:
            self._records[key] = Tracked(record.version, record.pdd, record.resolved)
        exporter.remove_object(key, record.exported_pools)


def _no_series(record: Tracked, observation: Observation, now: float) -> dict[str, float | None]:
    """The roles whose latency query found no series, with since when their pods have been
    Ready without it (None: no pod Ready)."""
    since = record.no_series_since
    found: dict[str, float | None] = {}
    for role in ROLES:
        latency = observation.signals[role].latency(role)
        if not (latency.reason or "").startswith(NO_SERIES):
            since.pop(role, None)
            continue
        if any(p.ready for (r, _), p in observation.pools.items() if r == role):
            found[role] = since.setdefault(role, now)
        else:
            since.pop(role, None)
            found[role] = None
    return found


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

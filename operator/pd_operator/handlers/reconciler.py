"""Executes one reconcile: read the cached state, ask core for a plan, apply it, report status.

Runs in a worker thread (the Kubernetes client is synchronous); the kopf event loop never waits
on the API.
"""

import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from pd_operator.adapters import metrics
from pd_operator.adapters.cache import ClusterCache, ObjectKey
from pd_operator.adapters.kube import KubeWriter, api_message
from pd_operator.api import InvalidSpecError, parse_pddeployment
from pd_operator.core import reasons
from pd_operator.core.children import PoolKey
from pd_operator.core.reconcile import EventSpec, Problem, plan_children
from pd_operator.core.status import ScalingView, compute_status, invalid_spec_status

logger = logging.getLogger(__name__)

# Statuses that mean the request itself is wrong: retrying the same write cannot help.
REJECTED_STATUSES = frozenset({400, 403, 422})

DecisionSource = Callable[[ObjectKey], Mapping[PoolKey, int] | None]
ScalingSource = Callable[[ObjectKey], ScalingView | None]


def utc_now() -> str:
    """Current time in RFC 3339, second precision (metav1.Time)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _namespace_terminating(error: ApiException) -> bool:
    return error.status == 403 and "NamespaceTerminating" in (error.body or "")


def _comparable(status: Mapping[str, Any]) -> Mapping[str, Any]:
    """Status as the apiserver stores it: absent and null fields dropped."""
    return {k: v for k, v in status.items() if v is not None}


class Reconciler:
    """Converges one PDDeployment per call; safe to call for the same key repeatedly."""

    def __init__(
        self,
        cache: ClusterCache,
        writer: KubeWriter,
        *,
        decisions: DecisionSource | None = None,
        scaling: ScalingSource | None = None,
        clock: Callable[[], str] = utc_now,
    ) -> None:
        self.cache = cache
        self.writer = writer
        self.decisions = decisions
        self.scaling = scaling
        self.clock = clock

    def reconcile(self, key: ObjectKey) -> None:
        """One level-based pass; raises on transient API errors so that the caller retries."""
        began = time.monotonic()
        try:
            self._reconcile(key)
        except ApiException as error:
            if _namespace_terminating(error):
                metrics.RECONCILES.labels(result="ok").inc()
                return  # the namespace is going away, and everything in it
            metrics.RECONCILES.labels(result="error").inc()
            raise
        except Exception:
            metrics.RECONCILES.labels(result="error").inc()
            raise
        else:
            metrics.RECONCILES.labels(result="ok").inc()
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - began)

    def _reconcile(self, key: ObjectKey) -> None:
        snapshot = self.cache.snapshot(key)
        if snapshot is None:
            return  # deleted: owner references let the garbage collector remove the children
        body = snapshot.pdd
        if body["metadata"].get("deletionTimestamp"):
            return  # being deleted: the garbage collector takes the children with it
        previous = body.get("status") or {}
        try:
            pdd = parse_pddeployment(dict(body))
        except InvalidSpecError as error:
            status, events = invalid_spec_status(
                body["metadata"].get("generation"), error.problems, previous, self.clock()
            )
            self._report(body, previous, status, events)
            return

        plan = plan_children(
            pdd, snapshot.children, snapshot.nodes, self.decisions(key) if self.decisions else None
        )
        problems = list(plan.problems)
        children = dict(snapshot.children)
        transient: ApiException | None = None
        for manifest in plan.apply:
            try:
                applied = self.writer.apply(manifest)
            except ApiException as error:
                if error.status not in REJECTED_STATUSES or _namespace_terminating(error):
                    # One child failing for now must not hold back the others; retry after.
                    transient = transient or error
                    continue
                name = f"{manifest['kind']} {manifest['metadata']['name']}"
                problems.append(
                    Problem(reasons.APPLY_REJECTED, f"{name} rejected: {api_message(error)}")
                )
                continue
            # Read our own write: the next reconcile must not apply it again before the
            # watch event arrives.
            self.cache.put_child(applied)
            children[(applied["apiVersion"], applied["kind"], applied["metadata"]["name"])] = (
                applied
            )
        for ref in plan.delete:
            self.writer.delete(ref.api_version, ref.kind, key[0], ref.name, ref.uid)
            children.pop((ref.api_version, ref.kind, ref.name), None)

        view = self.scaling(key) if self.scaling else None
        status, events = compute_status(
            pdd,
            children=children,
            pods=snapshot.pods,
            replicas=plan.replicas,
            problems=problems,
            previous=previous,
            now=self.clock(),
            scaling=view,
        )
        scaling_events = view.events if view else []
        self._report(body, previous, status, plan.events + events + scaling_events)
        if transient is not None:
            raise transient

    def _report(
        self,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
        status: Mapping[str, Any],
        events: list[EventSpec],
    ) -> None:
        meta = body["metadata"]
        if _comparable(status) != _comparable(previous):
            try:
                self.writer.patch_status(meta["namespace"], meta["name"], status)
            except ApiException as error:
                if error.status != 404:  # deleted meanwhile
                    raise
        for event in events:
            self.writer.post_event(body, event.type, event.reason, event.message)

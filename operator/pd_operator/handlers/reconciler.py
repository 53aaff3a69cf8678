"""Executes one reconcile: read the cached state, ask core for a plan, apply it, report status.

Runs in a worker thread (the Kubernetes client is synchronous); the kopf event loop never waits
on the API.
"""

import datetime
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from pd_operator.adapters import metrics
from pd_operator.adapters.cache import ClusterCache, ObjectKey, Snapshot
from pd_operator.adapters.kube import KubeWriter, api_message
from pd_operator.api import InvalidSpecError, PDDeployment, parse_pddeployment
from pd_operator.api.pdpool import POOL_KIND
from pd_operator.api.spec import Role
from pd_operator.core import reasons
from pd_operator.core.capacity import free_capacity
from pd_operator.core.children import LWS_KIND, PoolKey, child_key
from pd_operator.core.external import (
    ExternalDecision,
    decide_external,
    external_view,
    pdpool_status_changes,
    requested_replicas,
)
from pd_operator.core.reconcile import (
    CREATE_ONLY_KINDS,
    ChildKey,
    EventSpec,
    Problem,
    lost_group_nodes,
    plan_children,
    pool_observations,
)
from pd_operator.core.removal import (
    Shrink,
    choose_removal,
    marks_to_write,
    pool_pods_of,
    shrinking_pools,
)
from pd_operator.core.router import DEFAULT_ACTIVATOR_IMAGE
from pd_operator.core.status import ScalingView, compute_status, invalid_spec_status

logger = logging.getLogger(__name__)

# Statuses that mean the request itself is wrong: retrying the same write cannot help.
REJECTED_STATUSES = frozenset({400, 403, 422})

DecisionSource = Callable[[ObjectKey], Mapping[PoolKey, int] | None]
ScalingSource = Callable[[ObjectKey], ScalingView | None]
# The work each named pod of a role holds now (None: unknown); `MetricsSource.pod_work`.
PodWorkSource = Callable[[ObjectKey, PDDeployment, Role, Sequence[str]], Mapping[str, float] | None]


def utc_now() -> str:
    """Current time in RFC 3339, second precision (metav1.Time)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _namespace_terminating(error: ApiException) -> bool:
    return error.status == 403 and "NamespaceTerminating" in (error.body or "")


def refused(error: ApiException) -> bool:
    """Whether the apiserver refused the request itself, so that repeating it cannot help.

    Besides 400/403/422, a server-side apply of a field the schema does not know or of a
    malformed quantity fails as 500 while building the typed object: also the request's fault.
    """
    if _namespace_terminating(error):
        return False
    if error.status in REJECTED_STATUSES:
        return True
    return error.status == 500 and api_message(error).startswith(_MALFORMED_APPLY)


# A multi-node pool's workload in a cluster that does not serve LeaderWorkerSets.
_NO_LWS = (
    "{} not applied: this cluster does not serve leaderworkerset.x-k8s.io/v1; install "
    "LeaderWorkerSet (sigs.k8s.io/lws), or set accelerator.nodesPerReplica to 1"
)

# The apiserver's words when it cannot even build the object an apply describes.
_MALFORMED_APPLY = ("failed to create typed patch object", "failed to convert new object")


def _name_taken(error: ApiException, created: bool) -> bool:
    """A create that found the name taken (409), or an apply whose uid precondition found an
    object other than ours (422 on metadata.uid) or none (409)."""
    if error.status == 409:
        return True
    return not created and error.status == 422 and "metadata.uid" in api_message(error)


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the object's controller (any kind), if it has one."""
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


class NameConflictError(Exception):
    """A child's name is held by an object this PDDeployment does not own."""

    def __init__(self, manifest: Mapping[str, Any], holder: Mapping[str, Any]) -> None:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        super().__init__(
            f"{kind} {name} already exists and belongs to {_holder(holder)}, not to this "
            f"PDDeployment: rename this PDDeployment or the pool, or remove that {kind}"
        )


def _holder(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return f"{ref.get('kind')} {ref.get('name')}"
    writers = sorted(
        {m["manager"] for m in meta.get("managedFields") or [] if not m.get("subresource")}
    )
    return "no controller" + (f" (written by {', '.join(writers)})" if writers else "")


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
        pod_work: PodWorkSource | None = None,
        activator_image: str = DEFAULT_ACTIVATOR_IMAGE,
        clock: Callable[[], str] = utc_now,
    ) -> None:
        self.cache = cache
        self.writer = writer
        self.decisions = decisions
        self.scaling = scaling
        self.pod_work = pod_work  # None: a shrinking pool loses the ReplicaSet's default choice
        self.activator_image = activator_image
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

        # Free room: External mode's decision and a rollout's surge read it; built once, and
        # only when one of them asks (it walks every pod in the cache).
        free = functools.cache(lambda: free_capacity(snapshot.nodes, self.cache.all_pods()))
        external: ExternalDecision | None = None
        decisions = self.decisions(key) if self.decisions else None
        if pdd.spec.scaling.mode == "External":
            # Decided here, not by the autoscaler's timer: a PDPool's change is acted on as
            # soon as its watch event arrives.
            external = decide_external(
                pdd,
                requested_replicas(pdd, snapshot.children),
                pool_observations(pdd, snapshot.children, snapshot.pods, count_bound=True),
                free(),
            )
            decisions = external.replicas
        plan = plan_children(
            pdd,
            snapshot.children,
            snapshot.nodes,
            decisions,
            activator_image=self.activator_image,
            # Free room limits a rollout's surge; without a node view it is unknown.
            free=free if snapshot.nodes else None,
        )
        self._choose_removed(key, pdd, shrinking_pools(plan.apply, snapshot.children), snapshot)
        problems = list(plan.problems)
        if snapshot.nodes:  # no node view at all (not watched yet): nothing to say
            problems += [
                Problem(reasons.GROUP_NODE_LOST, line)
                for line in lost_group_nodes(pdd, snapshot.pods, snapshot.nodes)
            ]
        children = dict(snapshot.children)
        transient = self._apply_all(plan.apply, snapshot, body, problems, children)
        for ref in plan.delete:
            self.writer.delete(ref.api_version, ref.kind, key[0], ref.name, ref.uid)
            children.pop((ref.api_version, ref.kind, ref.name), None)

        if external is not None:
            self._write_pdpool_statuses(pdd, children, external, plan.replicas)
            view: ScalingView | None = external_view(external, previous)
        else:
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
            rollout=plan.rollout,
        )
        scaling_events = view.events if view else []
        self._report(body, previous, status, plan.events + events + scaling_events)
        if transient is not None:
            raise transient

    def _apply_all(
        self,
        manifests: Sequence[Mapping[str, Any]],
        snapshot: Snapshot,
        owner: Mapping[str, Any],
        problems: list[Problem],
        children: dict[ChildKey, Mapping[str, Any]],
    ) -> ApiException | None:
        """Apply every child; a refused one becomes a problem, the first transient failure is
        returned (raised after status is reported, so that the key is retried)."""
        transient: ApiException | None = None
        for manifest in manifests:
            wanted = child_key(manifest)
            name = f"{wanted[1]} {wanted[2]}"
            try:
                applied = self._write(manifest, snapshot.children.get(wanted), owner)
            except NameConflictError as conflict:
                problems.append(Problem(reasons.NAME_CONFLICT, str(conflict)))
                continue
            except ApiException as error:
                if error.status == 404 and wanted[1] == LWS_KIND:
                    # Until LWS is installed: say what to do, and retry (with backoff).
                    problems.append(Problem(reasons.APPLY_REJECTED, _NO_LWS.format(name)))
                    transient = transient or error
                    continue
                if not refused(error):
                    # One child failing for now must not hold back the others; retry after.
                    transient = transient or error
                    continue
                problems.append(
                    Problem(reasons.APPLY_REJECTED, f"{name} rejected: {api_message(error)}")
                )
                continue
            # Read our own write: the next reconcile must not apply it again before the
            # watch event arrives.
            self.cache.put_child(applied)
            children[child_key(applied)] = applied
        return transient

    def _choose_removed(
        self, key: ObjectKey, pdd: PDDeployment, shrinks: list[Shrink], snapshot: Snapshot
    ) -> None:
        """Before pools shrink: mark the pods with the least work as the ones to remove
        (`core.removal`). A failed read or write leaves the ReplicaSet's own choice; the
        scale-down goes ahead either way."""
        if self.pod_work is None:
            return
        for shrink in shrinks:
            pods = pool_pods_of(snapshot.pods, shrink.role, shrink.pool, shrink.deployment)
            if len(pods) <= 1:
                continue  # nothing to choose between
            try:
                work = self.pod_work(key, pdd, shrink.role, [pod.name for pod in pods]) or {}
            except Exception as error:  # a better choice only: never hold the scale-down back
                logger.warning("%s/%s: work of %s pool %s not read: %s",
                               key[0], key[1], shrink.role, shrink.pool, error)  # fmt: skip
                continue
            removal = choose_removal(shrink.role, shrink.pool, pods, shrink.count, work)
            if removal is None:
                continue
            for pod in marks_to_write(removal):
                try:
                    self.writer.set_deletion_cost(key[0], pod.name, pod.uid, removal.cost)
                except ApiException as error:
                    if error.status not in (404, 409, 422):  # gone or replaced: nothing to mark
                        logger.warning("%s/%s: pod %s not marked for removal: %s",
                                       key[0], key[1], pod.name, api_message(error))  # fmt: skip
            logger.info("%s/%s: %s", key[0], key[1], removal.summary(work))

    def _write(
        self,
        manifest: Mapping[str, Any],
        existing: Mapping[str, Any] | None,
        owner: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Apply over the child we own, or create a new one; never write another's object.

        NameConflictError when the name is held by an object whose controller is not `owner`;
        ApiException otherwise."""
        try:
            if existing is not None:
                return self.writer.apply(manifest, existing["metadata"]["uid"])
            if manifest["kind"] in CREATE_ONLY_KINDS:
                return self.writer.create(manifest, as_applied=False)
            return self.writer.create(manifest)
        except ApiException as error:
            if not _name_taken(error, created=existing is None):
                raise
            meta = manifest["metadata"]
            holder = self.writer.find(
                manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]
            )
            if holder is None:
                raise  # deleted meanwhile: the next pass creates it
            if controller_uid(holder) != owner["metadata"].get("uid"):
                raise NameConflictError(manifest, holder) from None
            # Ours, but no longer carrying our labels (so not on our watch): restore it.
            return self.writer.apply(manifest, holder["metadata"]["uid"])

    def _write_pdpool_statuses(
        self,
        pdd: PDDeployment,
        children: Mapping[ChildKey, Mapping[str, Any]],
        decision: ExternalDecision,
        replicas: Mapping[PoolKey, int],
    ) -> None:
        """Bring the PDPools' status (what runs, the selector) up to date."""
        for pdpool, status in pdpool_status_changes(pdd, children, decision, replicas):
            meta = pdpool["metadata"]
            try:
                written = self.writer.patch_status(
                    meta["namespace"], meta["name"], status, kind=POOL_KIND, uid=meta["uid"]
                )
            except ApiException as error:
                if error.status not in (404, 409, 422):  # gone or replaced meanwhile
                    raise
                continue
            self.cache.put_child({**written, "apiVersion": pdpool["apiVersion"], "kind": POOL_KIND})

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
                written = self.writer.patch_status(meta["namespace"], meta["name"], status)
            except ApiException as error:
                if error.status != 404:  # deleted meanwhile
                    raise
            else:
                # Read our own write: a reconcile before its watch event arrives must compare
                # with this status, or it would say the same events again.
                self.cache.refresh_pdd(written)
        for event in events:
            self.writer.post_event(body, event.type, event.reason, event.message)

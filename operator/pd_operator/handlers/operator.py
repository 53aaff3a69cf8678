"""kopf registrations: watches feed the cache and the work queue; workers run reconciles.

kopf is used for what it does well (watch streams, login, liveness) with raw
`on.event` handlers only: no handler progress or diff-base is stored on the user's objects and
no finalizer is added, because no delete step needs one (owner references clean up).
Create, update, resume (the startup list) and the periodic resync all enqueue the same key,
and one reconcile path serves them all.
"""

import asyncio
import logging
import random
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pd_operator.adapters import metrics
from pd_operator.adapters.cache import ClusterCache, ObjectKey
from pd_operator.adapters.credentials import (
    SECRET_TTL_SECONDS,
    FileCredentials,
    SecretCache,
    kube_secret_fetch,
)
from pd_operator.adapters.kube import (
    CHILD_RESOURCES,
    MANAGED_BY_LABEL,
    MANAGED_SELECTOR,
    KubeWriter,
    api_message,
    list_cluster,
)
from pd_operator.adapters.lease import LeaderLease, LeaseTiming
from pd_operator.api import GROUP, PLURAL, VERSION
from pd_operator.core.children import MANAGED_BY
from pd_operator.core.router import DEFAULT_ACTIVATOR_IMAGE
from pd_operator.handlers.autoscaler import Autoscaler
from pd_operator.handlers.reconciler import DecisionSource, Reconciler
from pd_operator.handlers.workqueue import WorkQueue

logger = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 60.0


def retry_delay(failures: int) -> float:
    """Exponential backoff with jitter: objects that failed together (an apiserver restart)
    do not all retry in the same instant."""
    return min(MAX_BACKOFF_SECONDS, 0.5 * 2.0**failures) * random.uniform(0.5, 1.0)


@dataclass
class OperatorConfig:
    """What `python -m pd_operator` (and the tests) choose."""

    namespaces: list[str] = field(default_factory=list)  # empty: cluster-wide
    workers: int = 4
    resync_seconds: float = 300.0
    metrics_port: int = 0  # 0: no metrics server
    prometheus_url: str | None = None  # for objects without spec.scaling.prometheus
    # The operator's credentials for prometheus_url (never sent to a URL from a spec).
    prometheus_bearer_token_file: str | None = None
    prometheus_ca_file: str | None = None
    # Let URLs from specs be link-local or cloud metadata addresses (off: see credentials.py).
    allow_link_local_prometheus: bool = False
    # How long a Secret named by spec.scaling.prometheus is used before it is read again.
    secret_ttl_seconds: float = SECRET_TTL_SECONDS
    autoscale: bool = True
    # Count the pods of other workloads in free capacity: one watch on every pod (in the watched
    # namespaces) instead of ours only. Off where the accelerator nodes run nothing else.
    count_other_pods: bool = True
    autoscale_tick_seconds: float = 1.0  # how often due objects are looked for
    # Leader election: with a namespace, the replica holding the Lease `lease_name` there
    # reconciles and autoscales; the others keep their caches warm and wait (`adapters/lease`).
    lease_namespace: str | None = None
    lease_name: str = "pd-operator"
    lease_timing: LeaseTiming = field(default_factory=LeaseTiming)
    # The router pods' activator runs the operator's own image (spec.scaling.idleSeconds).
    activator_image: str = DEFAULT_ACTIVATOR_IMAGE


class OperatorState:
    """The cache, queue and workers of one running operator."""

    def __init__(
        self,
        api_client: client.ApiClient,
        config: OperatorConfig,
        decisions: DecisionSource | None = None,
    ) -> None:
        self.api_client = api_client
        self.config = config
        self.cache = ClusterCache()
        self.queue = WorkQueue()
        self.writer = KubeWriter(api_client)
        self.autoscaler = Autoscaler(
            self.cache,
            self.queue.add_all_threadsafe,
            default_prometheus_url=config.prometheus_url,
            default_credentials=FileCredentials(
                config.prometheus_bearer_token_file,
                config.prometheus_ca_file,
                ttl_seconds=config.secret_ttl_seconds,
            ),
            secrets=SecretCache(
                kube_secret_fetch(api_client), ttl_seconds=config.secret_ttl_seconds
            ),
            allow_link_local=config.allow_link_local_prometheus,
        )
        self.reconciler = Reconciler(
            self.cache,
            self.writer,
            decisions=decisions or self.autoscaler.decisions_for,
            scaling=self.autoscaler.view_for,
            pod_work=self.autoscaler.source.pod_work,
            activator_image=config.activator_image,
        )
        self.tasks: list[asyncio.Task[None]] = []
        self._failures: dict[ObjectKey, int] = {}
        self.lease = (
            LeaderLease(
                api_client,
                config.lease_namespace,
                config.lease_name,
                identity=f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
                timing=config.lease_timing,
            )
            if config.lease_namespace
            else None
        )
        self.leading = False
        self.lost_leadership = False
        # Set to stop the whole operator (kopf too): the leader lease was lost.
        self.halt: asyncio.Event | None = None

    def prime(self) -> None:
        """List children, pods and nodes once before any reconcile, so that a restarted
        operator sees what exists and writes nothing for converged objects. Lists per watched
        namespace when namespaces are given (a namespaced install has no cluster-wide list).

        PermissionError names the list the operator's RBAC refused and the fix."""
        listings, nodes = list_cluster(
            self.api_client, self.config.namespaces, other_pods=self.config.count_other_pods
        )
        for children, pods in listings:
            for child in children:
                self.cache.put_child(child)
            for pod in pods:
                self.put_any_pod(pod)
        for node in nodes:
            self.cache.put_node(node)

    def put_any_pod(self, obj: Mapping[str, Any], deleted: bool = False) -> ObjectKey | None:
        """A pod of ours into its PDDeployment's view (returns its key); any other pod into
        free capacity only."""
        labels = obj["metadata"].get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) == MANAGED_BY:
            return self.cache.put_pod(obj, deleted)
        self.cache.put_other_pod(obj, deleted)
        return None

    async def worker(self) -> None:
        """Reconcile keys until cancelled; failures retry with exponential backoff."""
        while True:
            key = await self.queue.get()
            try:
                await asyncio.to_thread(self.reconciler.reconcile, key)
                self._failures.pop(key, None)
            except Exception as error:
                count = self._failures[key] = self._failures.get(key, 0) + 1
                delay = retry_delay(count)
                if isinstance(error, ApiException):
                    # The apiserver unavailable, a conflict, a timeout: one line, not a trace.
                    logger.warning(
                        "reconcile of %s/%s: %s %s; retrying in %.1fs",
                        *key,
                        error.status,
                        api_message(error),
                        delay,
                    )
                else:
                    logger.exception("reconcile of %s/%s failed; retrying in %.1fs", *key, delay)
                self.queue.add_after(key, delay)
            finally:
                self.queue.done(key)

    async def autoscale(self) -> None:
        """Run autoscaler cycles; each decides only the objects whose interval is due."""
        while True:
            try:
                await asyncio.to_thread(self.autoscaler.cycle)
            except Exception:
                logger.exception("autoscaler cycle failed")
            await asyncio.sleep(self.config.autoscale_tick_seconds)

    async def resync(self) -> None:
        """Enqueue every PDDeployment periodically: level-based repair of anything missed."""
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            for key in self.cache.pdd_keys():
                self.queue.add(key)

    def start(self) -> None:
        """Start workers and the resync loop on the running event loop."""
        self.queue.bind(asyncio.get_running_loop())
        for _ in range(self.config.workers):
            self.tasks.append(asyncio.create_task(self.worker()))
        self.tasks.append(asyncio.create_task(self.resync()))
        if self.config.autoscale:
            self.tasks.append(asyncio.create_task(self.autoscale()))

    async def lead(self) -> None:
        """Wait for the leader lease, work while holding it, and stop the operator when it
        cannot be renewed within the deadline (another replica may be leading by then)."""
        assert self.lease is not None
        timing = self.lease.timing
        while not await asyncio.to_thread(self.lease.try_acquire_or_renew):
            await asyncio.sleep(timing.retry)
        logger.info("leading: holding Lease %s as %s", self.lease.name, self.lease.identity)
        self.leading = True
        metrics.LEADER.set(1)
        self.start()
        renewed = time.monotonic()
        while time.monotonic() - renewed < timing.renew_deadline:
            await asyncio.sleep(timing.retry)
            if await asyncio.to_thread(self.lease.try_acquire_or_renew):
                renewed = time.monotonic()
        logger.error(
            "lost Lease %s (not renewed for %.0fs): stopping, to start again as a standby",
            self.lease.name,
            timing.renew_deadline,
        )
        self.leading, self.lost_leadership = False, True
        metrics.LEADER.set(0)
        await self._cancel(task for task in self.tasks if task is not asyncio.current_task())
        if self.halt is not None:
            self.halt.set()

    async def _cancel(self, tasks: Iterable[asyncio.Task[None]]) -> None:
        cancelled = list(tasks)
        for task in cancelled:
            task.cancel()
        await asyncio.gather(*cancelled, return_exceptions=True)

    async def stop(self) -> None:
        """Cancel the workers and wait for them; give the leader lease up if held."""
        await self._cancel(self.tasks)
        self.tasks.clear()
        if self.lease is not None and self.leading:
            self.leading = False
            metrics.LEADER.set(0)
            await asyncio.to_thread(self.lease.release)
        self.autoscaler.source.close()  # removes the CA files written for Prometheus


def _event_parts(event: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
    return event["object"], event.get("type") == "DELETED"


class _NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds every event's "essence" (a deep copy of the object) to detect what changed
    for on.create/on.update handlers; with on.event handlers only nothing reads it, and the
    copies were a fifth of the operator's CPU while 200 objects were created."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def build_registry(state: OperatorState) -> kopf.OperatorRegistry:
    """A kopf registry whose handlers feed `state`."""
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = _NoDiffBase(
            prefix=GROUP, key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        # kopf logs "Handler ... succeeded." at INFO for every watch event: most of the log, and
        # nothing a reader needs (failures are warnings). Kept with --verbose (DEBUG).
        kopf_objects = logging.getLogger("kopf.objects")
        if not kopf_objects.isEnabledFor(logging.DEBUG):
            kopf_objects.setLevel(logging.WARNING)
        # No kopf peering: it would pause kopf's watches only, not the workers, resync and
        # autoscaler; the operator's own Lease guards those (`--leader-election`).
        settings.peering.standalone = True
        ours_only = [(group, plural) for group, _, plural in CHILD_RESOURCES]
        if not state.config.count_other_pods:
            ours_only.append(("", "pods"))
        for resource in ours_only:
            settings.watching.label_selectors[resource] = MANAGED_SELECTOR
        await asyncio.to_thread(state.prime)
        if state.lease is None:
            metrics.LEADER.set(1)
            state.start()
        else:
            state.tasks.append(asyncio.create_task(state.lead()))

    @kopf.on.cleanup(registry=registry)
    async def shutdown(**_: Any) -> None:
        await state.stop()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(state.api_client)

    @kopf.on.probe(id="queued", registry=registry)
    def queued(**_: Any) -> int:
        return 0 if state.queue.idle() else 1

    # Async handlers: they only touch memory, and kopf would otherwise run them in the thread
    # pool that the reconciles use, queueing watch events behind API calls.
    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def pddeployment_event(event: Mapping[str, Any], **_: Any) -> None:
        obj, deleted = _event_parts(event)
        key = state.cache.put_pdd(obj, deleted)
        metrics.MANAGED.set(len(state.cache.pdd_keys()))
        if not deleted:
            state.queue.add(key)

    async def child_event(event: Mapping[str, Any], **_: Any) -> None:
        obj, deleted = _event_parts(event)
        owner = state.cache.put_child(obj, deleted)
        if owner:
            state.queue.add(owner)

    for group, version, plural in CHILD_RESOURCES:
        kopf.on.event(group, version, plural, registry=registry, labels={
            "app.kubernetes.io/managed-by": MANAGED_BY
        })(child_event)  # fmt: skip

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def pod_event(event: Mapping[str, Any], **_: Any) -> None:
        obj, deleted = _event_parts(event)
        owner = state.put_any_pod(obj, deleted)
        if owner:
            state.queue.add(owner)

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(event: Mapping[str, Any], **_: Any) -> None:
        obj, deleted = _event_parts(event)
        if state.cache.put_node(obj, deleted):
            for key in state.cache.pdd_keys():
                state.queue.add(key)

    return registry


def connection_info(api_client: client.ApiClient) -> kopf.ConnectionInfo:
    """kopf credentials from the same configuration the writer uses."""
    config = api_client.configuration
    token = (config.api_key or {}).get("authorization") or (config.api_key or {}).get("BearerToken")
    scheme, _, value = (token or "").partition(" ")
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        scheme=scheme or None,
        token=value or None,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


async def run_operator(
    state: OperatorState,
    *,
    stop_flag: asyncio.Event | Any = None,
    ready_flag: asyncio.Event | Any = None,
    liveness_endpoint: str | None = None,
) -> None:
    """Run until `stop_flag` is set (or forever), or until the leader lease is lost
    (`state.lost_leadership`)."""
    registry = build_registry(state)
    namespaces = state.config.namespaces
    state.halt = asyncio.Event()
    forward = asyncio.create_task(_forward(stop_flag, state.halt)) if stop_flag else None
    try:
        await kopf.operator(
            registry=registry,
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            # kopf's default identity asks the password database for the user's name, which
            # fails for the image's numeric uid 65532 (no /etc/passwd entry): name it here
            # (a str; kopf does not export its Identity NewType).
            identity=f"pd-operator@{socket.gethostname()}",  # type: ignore[arg-type]
            liveness_endpoint=liveness_endpoint,
            stop_flag=state.halt,
            ready_flag=ready_flag,
        )
    finally:
        if forward is not None:
            forward.cancel()


async def _forward(flag: Any, halt: asyncio.Event) -> None:
    """Set `halt` once the caller's stop flag (an asyncio or threading Event) is set."""
    if isinstance(flag, asyncio.Event):
        await flag.wait()
    else:
        while not flag.is_set():
            await asyncio.sleep(0.1)
    halt.set()

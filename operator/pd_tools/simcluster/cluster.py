"""A whole simulated cluster in one process: virtual nodes, the mock scheduler and kubelet, an
engine behind every Ready pool pod, its metrics for Prometheus, and a load.

```python
load = parse_load("constant:5", TokenLengths(4000, 200, 1.0, 1.0))
with SimCluster(api_client, "config/clusters/tiny.yaml", loads={("ns", "glm"): load},
                time_scale=0.05, sd_file=Path("targets/sim.json")) as sim:
    ...  # create PDDeployments whose pools use schedulerName: pd-mock-scheduler
```

Each PDDeployment (label `pdoperator.io/deployment`) gets one `PDEngine`. A pool pod that is
Running and Ready on a virtual node becomes an instance of its role (label `pdoperator.io/role`),
sized by the cards it requests on its node's card type; when it stops being Ready or is deleted,
the instance drains and its target goes. The watch on bound pods is the single source of truth,
so requests reach exactly the pods Kubernetes reports Ready. One clock thread feeds each load and
advances every engine with the wall clock, `1 / time_scale` simulated seconds per second, the
same factor the virtual kubelet applies to model loads.
"""

import itertools
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client

from pd_operator.api.spec import ENGINE_CONTAINER
from pd_operator.core.children import LABEL_DEPLOYMENT, LABEL_POOL, LABEL_ROLE
from pd_operator.core.hardware import GLM_45_FP8, ModelProfile
from pd_operator.core.histogram_bounds import SGLANG_BUCKET_FLAGS, bounds_in_args
from pd_operator.core.scheduling import pod_requests
from pd_tools.enginesim.engine import PDEngine, ReplicaSpec, RequestRecord, Role
from pd_tools.enginesim.metrics import VLLM, Dialect, EngineMetricsServer, SimPod
from pd_tools.simcluster.profile import ClusterProfile, load_profile
from pd_tools.simcluster.virtual import VirtualCluster
from pd_tools.workloads.traces import (
    ReplayOptions,
    Request,
    TokenLengths,
    constant_rate,
    ramp_rate,
    read_trace,
    step_rate,
    synthetic_requests,
)

log = logging.getLogger(__name__)

DeploymentKey = tuple[str, str]  # (namespace, PDDeployment name)

# Wall seconds between engine advances: the gauges Prometheus scrapes each second are this fresh.
TICK_SECONDS = 0.05
# Finished requests kept per PDDeployment for callers to inspect; older ones are dropped.
RECORDS_KEPT = 100_000
# A trace as it is: all of it, at its own rate.
WHOLE_TRACE = ReplayOptions()
LOAD_FORMS = (
    "constant:RATE[:SECONDS], step:R1,R2,...:STEP_SECONDS, ramp:FROM,TO:SECONDS, trace:PATH"
)


def _rates(text: str) -> list[float]:
    rates = [float(rate) for rate in text.split(",")]
    if any(rate < 0 for rate in rates):
        raise ValueError(f"request rates must not be negative: {text}")
    return rates


def parse_load(
    spec: str,
    lengths: TokenLengths,
    *,
    arrival_cv: float = 1.0,
    seed: int = 0,
    replay: ReplayOptions = WHOLE_TRACE,
) -> Iterator[Request]:
    """Requests from a load spec (`LOAD_FORMS`; rates in requests per simulated second).

    Synthetic loads draw `lengths` and arrive Poisson (`arrival_cv` 1) or Gamma-bursty (above
    1); `constant` without SECONDS never ends. A trace brings its own lengths and times,
    selected and compressed by `replay`.
    """
    kind, _, rest = spec.partition(":")
    if kind == "trace" and rest:
        # One streaming pass first: a malformed line fails here, not hours into a live run.
        try:
            if sum(1 for _ in read_trace(rest, replay)) == 0:
                raise ValueError(f"{rest}: the trace holds no request")
        except OSError as error:
            raise ValueError(f"{rest}: {error.strerror or error}") from None
        return read_trace(rest, replay)
    try:
        parts = rest.split(":")
        if kind == "constant" and len(parts) in (1, 2):
            (rate,) = _rates(parts[0])
            seconds = float(parts[1]) if len(parts) == 2 else float("inf")
            profile = constant_rate(rate, seconds)
        elif kind == "step" and len(parts) == 2:
            profile = step_rate(_rates(parts[0]), float(parts[1]))
        elif kind == "ramp" and len(parts) == 2:
            start, end = _rates(parts[0])
            profile = ramp_rate(start, end, float(parts[1]))
        else:
            raise ValueError("unknown form")
    except (ValueError, OSError) as error:
        raise ValueError(f"bad load {spec!r} ({error}); expected one of {LOAD_FORMS}") from error
    return synthetic_requests(profile, lengths, arrival_cv=arrival_cv, seed=seed)


def parse_target(text: str) -> DeploymentKey:
    """`NAMESPACE/NAME` of a PDDeployment."""
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"a target is NAMESPACE/NAME, got {text!r}")
    return namespace, name


def running_and_ready(pod: Mapping[str, Any]) -> bool:
    """What a Service's endpoints would route to: Running, Ready, not terminating."""
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def pod_dialect(dialect: Dialect, pod: Mapping[str, Any]) -> Dialect:
    """`dialect` with the latency bounds the pod's engine command line sets (SGLang's
    `--bucket-*` flags, as `spec.model.args` may give them), as that engine would export them."""
    argv: list[str] = []
    for container in pod["spec"].get("containers") or []:
        if container.get("name") == ENGINE_CONTAINER:
            argv = [*(container.get("command") or []), *(container.get("args") or [])]
    ttft = bounds_in_args(argv, SGLANG_BUCKET_FLAGS["prefill"])
    itl = bounds_in_args(argv, SGLANG_BUCKET_FLAGS["decode"])
    if not ttft and not itl:
        return dialect
    return replace(dialect, buckets=dialect.buckets.with_latency(ttft, itl))


class SimDeployment:
    """One PDDeployment's engine, its pods' metrics and its load. Read it under `lock`."""

    def __init__(
        self,
        namespace: str,
        name: str,
        load: Iterable[Request],
        *,
        model: ModelProfile,
        dialect: Dialect,
        now_s: float,
        time_scale: float = 1.0,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.model = model
        self.lock = threading.Lock()
        self.engine = PDEngine(model=model, buckets=dialect.buckets)
        self.engine.advance_to(now_s)  # every engine runs on the cluster's one timeline
        # Rates per simulated second, as the profiles' capacities are (see EngineMetricsServer).
        self.server = EngineMetricsServer(
            self.engine, self.lock, dialect=dialect, counter_scale=time_scale
        )
        self.records: deque[RequestRecord] = deque(maxlen=RECORDS_KEPT)
        # Simulated time the load started: when a pod of each role first served. Until then a
        # real client would get errors, so requests are not queued up at the router.
        self.load_start_s: float | None = None
        self._load = iter(load)
        self._next = self._pull()
        self.instances: dict[str, tuple[Role, str]] = {}  # serving pod -> (role, instance)

    def serving(self, role: Role) -> int:
        """Pods of `role` with an engine instance (caller holds `lock`)."""
        return sum(1 for r, _ in self.instances.values() if r is role)

    def sync(self, now_s: float) -> None:
        """Submit the load's arrivals up to `now_s`, then advance the engine there (caller
        holds `lock`). Called before every instance change, so arrivals are never late."""
        if self.load_start_s is None and all(self.serving(role) for role in Role):
            self.load_start_s = now_s
        start = self.load_start_s
        if start is not None:
            while self._next is not None and self._next.arrival_s + start <= now_s:
                self.engine.submit(replace(self._next, arrival_s=self._next.arrival_s + start))
                self._next = self._pull()
        self.engine.advance_to(now_s)
        self.records.extend(self.engine.take_finished())

    def _pull(self) -> Request | None:
        try:
            return next(self._load, None)
        except Exception:  # a bad trace line ends the load, not the clock that serves the pods
            log.exception("the load of %s/%s ends here", self.namespace, self.name)
            return None

    def add(self, pod: str, role: Role, pool: str, spec: ReplicaSpec, instance: str) -> None:
        """Route to `pod` from now on and serve its metrics (caller holds `lock`, synced)."""
        self.engine.add_instance(instance, role, spec, ready_after_s=0.0)
        self.server.add_pod(
            SimPod(self.namespace, pod, instance, self.name, role, pool, self.model.name)
        )
        self.instances[pod] = (role, instance)

    def remove(self, pod: str) -> None:
        """Stop routing to `pod` (what it holds drains) and its metrics (caller holds `lock`)."""
        _, instance = self.instances.pop(pod)
        self.engine.remove_instance(instance)
        self.server.remove_pod(self.namespace, pod)


@dataclass(frozen=True)
class _Served:
    uid: str
    deployment: SimDeployment | None  # None: the pod cannot run the model (logged once)


class SimCluster:
    """A `VirtualCluster` whose Ready pool pods serve simulated engines, scraped through file
    SD, under a load per PDDeployment. `time_scale` is the VirtualCluster's: 0.05 runs
    everything, model loads and requests alike, 20 times faster than the wall clock."""

    def __init__(
        self,
        api_client: client.ApiClient,
        profile: ClusterProfile | str | Path,
        *,
        loads: Mapping[DeploymentKey, Iterable[Request]] | None = None,
        model: ModelProfile = GLM_45_FP8,
        time_scale: float = 1.0,
        sd_file: Path | None = None,
        dialect: Dialect = VLLM,
        name_prefix: str = "",
        namespace: str | None = None,
    ) -> None:
        self.profile = profile if isinstance(profile, ClusterProfile) else load_profile(profile)
        self.model = model
        self.time_scale = time_scale
        self.sd_file = sd_file
        self.dialect = dialect
        self.virtual = VirtualCluster(
            api_client,
            self.profile,
            time_scale=time_scale,
            name_prefix=name_prefix,
            namespace=namespace,
            model=model,
            on_pod=self._on_pod,
        )
        self._loads = dict(loads or {})
        self._deployments: dict[DeploymentKey, SimDeployment] = {}
        self._registry = threading.Lock()
        self._pods: dict[tuple[str, str], _Served] = {}  # touched by the watch thread only
        self._specs: dict[tuple[str, int], ReplicaSpec] = {}
        self._serial = itertools.count()
        self._targets_changed = threading.Event()
        self._stopping = threading.Event()
        self._clock = threading.Thread(target=self._run_clock, name="pd-sim-clock", daemon=True)
        self._began = 0.0
        self._started = False

    def __enter__(self) -> "SimCluster":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def now_s(self) -> float:
        """Simulated seconds since `start()`."""
        return (time.monotonic() - self._began) / self.time_scale

    def deployment(self, namespace: str, name: str) -> SimDeployment | None:
        """The engine of a PDDeployment, once one of its pods has been Ready."""
        with self._registry:
            return self._deployments.get((namespace, name))

    def deployments(self) -> list[SimDeployment]:
        """Every PDDeployment with an engine, in order of their first Ready pod."""
        with self._registry:
            return list(self._deployments.values())

    def file_sd_groups(self) -> list[dict[str, object]]:
        """Every serving pod as a Prometheus file-SD target group."""
        groups: list[dict[str, object]] = []
        for deployment in self.deployments():
            with deployment.lock:
                groups += deployment.server.file_sd_groups()
        return groups

    def start(self) -> None:
        """Start the clock, then the virtual cluster; return once its nodes take pods."""
        self._started = True
        self._began = time.monotonic()
        try:
            self._clock.start()
            self.virtual.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every thread and server, withdraw the targets, delete the nodes. Idempotent."""
        if not self._started:
            return
        self._started = False
        try:
            self.virtual.stop()  # first: no pod event arrives after this
        finally:
            self._stopping.set()
            if self._clock.ident is not None:
                self._clock.join(timeout=10)
            if self.sd_file is not None:
                self.sd_file.unlink(missing_ok=True)
            for deployment in self.deployments():
                deployment.server.stop()

    # -- the clock ---------------------------------------------------------------------------

    def _run_clock(self) -> None:
        while not self._stopping.wait(TICK_SECONDS):
            for deployment in self.deployments():
                with deployment.lock:
                    deployment.sync(self.now_s())
            # Publishing once per tick, not per pod event, keeps a thousand pods turning Ready
            # from rewriting a thousand-entry file a thousand times.
            if self._targets_changed.is_set():
                self._targets_changed.clear()
                try:
                    self._publish()
                except OSError as error:
                    log.warning("cannot write %s: %s", self.sd_file, error)
                    self._targets_changed.set()

    def _publish(self) -> None:
        if self.sd_file is None:
            return
        # Written aside and renamed, so Prometheus never reads half a file; the temporary name
        # matches no `*.json` pattern.
        temporary = self.sd_file.with_name(f".{self.sd_file.name}.tmp")
        temporary.write_text(json.dumps(self.file_sd_groups()))
        os.replace(temporary, self.sd_file)

    # -- pods --------------------------------------------------------------------------------

    def _on_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        name, role = labels.get(LABEL_DEPLOYMENT), labels.get(LABEL_ROLE)
        if not name or role not in (Role.PREFILL, Role.DECODE):
            return
        key = (meta["namespace"], meta["name"])
        served = self._pods.get(key)
        serving = event != "DELETED" and running_and_ready(pod)
        if served is not None and (not serving or served.uid != meta["uid"]):
            self._withdraw(key, served)
            served = None
        if serving and served is None:
            self._serve(key, pod, name, Role(role), labels.get(LABEL_POOL, ""))

    def _serve(
        self, key: tuple[str, str], pod: Mapping[str, Any], name: str, role: Role, pool: str
    ) -> None:
        namespace, pod_name = key
        try:
            spec = self._replica_spec(pod)
        except ValueError as error:
            log.warning("pod %s/%s runs no engine: %s", namespace, pod_name, error)
            self._pods[key] = _Served(pod["metadata"]["uid"], None)
            return
        deployment = self._deployment(namespace, name, pod)
        with deployment.lock:
            deployment.sync(self.now_s())
            deployment.add(pod_name, role, pool, spec, f"{pod_name}-{next(self._serial)}")
        self._pods[key] = _Served(pod["metadata"]["uid"], deployment)
        self._targets_changed.set()

    def _withdraw(self, key: tuple[str, str], served: _Served) -> None:
        del self._pods[key]
        if served.deployment is None:
            return
        with served.deployment.lock:
            served.deployment.sync(self.now_s())
            served.deployment.remove(key[1])
        self._targets_changed.set()

    def _deployment(self, namespace: str, name: str, pod: Mapping[str, Any]) -> SimDeployment:
        """The PDDeployment's engine, made at its first pod: its bounds are that pod's."""
        with self._registry:
            deployment = self._deployments.get((namespace, name))
            if deployment is None:
                deployment = SimDeployment(
                    namespace,
                    name,
                    self._loads.pop((namespace, name), ()),
                    model=self.model,
                    dialect=pod_dialect(self.dialect, pod),
                    now_s=self.now_s(),
                    time_scale=self.time_scale,
                )
                deployment.server.start()
                self._deployments[(namespace, name)] = deployment
            return deployment

    def _replica_spec(self, pod: Mapping[str, Any]) -> ReplicaSpec:
        """The replica a pod runs: the cards it requests, of its node's kind, with the model."""
        requests = pod_requests(pod["spec"])
        requested = [
            (requests.get(resource, 0) // 1000, card)
            for resource, card in self.virtual.fleet.accelerators(pod["spec"]["nodeName"]).items()
        ]
        count, hardware = max(requested, key=lambda pair: pair[0], default=(0, None))
        if hardware is None or count < 1:
            raise ValueError("it requests no card of its node")
        cached = self._specs.get((hardware.name, count))
        if cached is None:
            cached = ReplicaSpec.from_profiles(hardware, self.model, count)
            self._specs[(hardware.name, count)] = cached
        return cached

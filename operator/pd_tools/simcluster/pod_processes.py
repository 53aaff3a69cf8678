"""Real processes for the pods that must really serve: engines and routers on virtual nodes.

The virtual kubelet runs nothing by default. With a `PodProcesses`, a pod whose containers all
run a command it knows (`vllm serve ...`: the engine simulator over HTTP; `vllm-router ...`: the
real router binary from its wheel; `python -m pd_operator.activator ...`: the activator in front
of it) becomes real processes, one per container, listening on the pod's own loopback address
(127.0.0.0/8 holds millions, and nothing outside loopback is ever dialed), so that real clients
and the real router reach it exactly as they would reach a pod in a cluster.

What a kubelet does for such a container is done here too, as far as these processes need it:
the downward API and literal env values, `$(VAR)` expansion in the command, a kubeconfig holding
a token of the pod's own ServiceAccount (TokenRequest, so the router runs with its Role's rights
and no more), and the pod's network namespace: a wildcard bind (`--host 0.0.0.0`, or an engine
given no --host) becomes the pod's address.
"""

import contextlib
import ipaddress
import itertools
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pd_operator.adapters.kube import call_json
from pd_operator.core.router import ACTIVATOR_METRICS_PORT_NAME

log = logging.getLogger(__name__)

# Loopback addresses for serving pods, away from 127.0.0.1 and the low ranges tests pick by hand.
POD_LOOPBACK = ipaddress.IPv4Network("127.64.0.0/10")
WILDCARD = "0.0.0.0"
HOST_FLAGS = ("--host", "--prometheus-host")
PROBE_TIMEOUT_SECONDS = 2.0
STOP_GRACE_SECONDS = 5.0
TOKEN_SECONDS = 3600
SCRAPE, SCRAPE_PORT, SCRAPE_PATH = (
    "prometheus.io/scrape",
    "prometheus.io/port",
    "prometheus.io/path",
)
# Pod label -> target label: the relabelling the operator's queries expect (adapters/promql.py).
TARGET_LABELS = {
    "pdoperator.io/deployment": "deployment",
    "pdoperator.io/role": "role",
    "pdoperator.io/pool": "pool",
}
_VARIABLE = re.compile(r"\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def engine_simulator_command(argv: Sequence[str]) -> list[str]:
    """An engine's own command line (`vllm serve ...`, `python3 -m sglang.launch_server ...`)
    as the engine simulator runs it: the same arguments."""
    return [sys.executable, "-m", "pd_tools.enginesim.http_engine", *argv]


def vllm_router_command(argv: Sequence[str]) -> list[str]:
    """`vllm-router ...` as the router binary installed beside this Python runs it."""
    return [str(Path(sys.executable).with_name("vllm-router")), *argv[1:]]


def python_module_command(argv: Sequence[str]) -> list[str]:
    """`python3 -m MODULE ...` (sglang-router) with this Python, where the module is installed."""
    return [sys.executable, *argv[1:]]


# A pod process outlives no kubelet: if the process running it is killed (a test run stopped,
# a CI timeout), the kernel sends its processes SIGTERM (util-linux setpriv, where present).
_SETPRIV = shutil.which("setpriv")
DIE_WITH_PARENT: tuple[str, ...] = (_SETPRIV, "--pdeathsig", "TERM", "--") if _SETPRIV else ()
Runner = Callable[[Sequence[str]], list[str]]
# The start of a container's command -> how to run it here.
DEFAULT_COMMANDS: dict[tuple[str, ...], Runner] = {
    ("vllm",): engine_simulator_command,
    ("python3", "-m", "sglang.launch_server"): engine_simulator_command,
    ("vllm-router",): vllm_router_command,
    ("python3", "-m", "sglang_router.launch_router"): python_module_command,
    ("python", "-m", "pd_operator.activator"): python_module_command,
}


@dataclass
class ContainerProcess:
    """One running container process of a pod."""

    name: str
    popen: subprocess.Popen[bytes]
    probe_url: str | None


@dataclass
class PodProcess:
    """The running container processes of a pod."""

    uid: str
    ip: str
    containers: list[ContainerProcess]

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        """The first container's process (the engine or the router)."""
        return self.containers[0].popen

    def alive(self) -> bool:
        """No process has exited."""
        return all(c.popen.poll() is None for c in self.containers)


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined variable is replaced, anything else kept."""
    return _VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def bind_to_pod(argv: Sequence[str], ip: str, *, engine: bool) -> list[str]:
    """The pod's network namespace on a shared host: a wildcard bind is the pod's address; an
    engine told no --host (vLLM then binds every address) binds the pod's address."""
    result = list(argv)
    for index, word in enumerate(result[:-1]):
        if word in HOST_FLAGS and result[index + 1] in (WILDCARD, "::"):
            result[index + 1] = ip
    if engine and "--host" not in result:
        result += ["--host", ip]
    return result


def _field_ref(pod: Mapping[str, Any], path: str, ip: str) -> str:
    meta = pod["metadata"]
    values = {
        "status.podIP": ip,
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
    }
    return str(values.get(path, ""))


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], ip: str) -> dict[str, str]:
    """The container's env as a kubelet resolves it: literal values (with `$(VAR)` of earlier
    ones) and the downward API's fields; references to Secrets or ConfigMaps are left out."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = expand(var.get("value") or "", env)
        elif ref := (var.get("valueFrom") or {}).get("fieldRef"):
            env[var["name"]] = _field_ref(pod, ref.get("fieldPath", ""), ip)
    return env


def _probe_url(container: Mapping[str, Any], ip: str) -> str | None:
    get = ((container.get("readinessProbe") or {}).get("httpGet")) or {}
    if not get:
        return None
    port = get.get("port")
    if isinstance(port, str):
        named = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
        port = named.get(port)
    return f"http://{ip}:{port}{get.get('path', '/')}" if port else None


class PodProcesses:
    """Starts, probes and stops the processes of serving pods for a virtual kubelet."""

    def __init__(
        self,
        workdir: Path,
        *,
        server: str,
        ca_file: str | None,
        request_token: Callable[[str, str], str],
        sd_file: Path | None = None,
    ) -> None:
        """`request_token(namespace, service_account)` returns a bound token (TokenRequest);
        `server` and `ca_file` are the apiserver's, written into each pod's kubeconfig.
        With `sd_file`, every Ready serving pod is a Prometheus file-SD target there."""
        self.workdir = workdir
        self.sd_file = sd_file
        self._targets: dict[str, dict[str, Any]] = {}
        self.server = server
        self.ca_file = ca_file
        self.request_token = request_token
        # A random start: several clusters (parallel test runs, a demo beside them) share the
        # range, and 4 million addresses make a clash between their pods unlikely.
        self._addresses = itertools.count(1 + secrets.randbelow(POD_LOOPBACK.num_addresses // 2))
        self._lock = threading.Lock()
        self.running: dict[str, PodProcess] = {}
        self._hooks: set[subprocess.Popen[bytes]] = set()  # preStop hooks running now
        self._stopped = False
        workdir.mkdir(parents=True, exist_ok=True)

    def _runner(self, argv: Sequence[str]) -> Runner | None:
        return next(
            (run for start, run in DEFAULT_COMMANDS.items() if tuple(argv[: len(start)]) == start),
            None,
        )

    def _containers(self, pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        containers: list[Mapping[str, Any]] = (pod.get("spec") or {}).get("containers") or []
        for container in containers:
            command = [*(container.get("command") or []), *(container.get("args") or [])]
            if self._runner(command) is None:
                return []
        return containers

    def handles(self, pod: Mapping[str, Any]) -> bool:
        """Every container of the pod runs a command this host knows how to run."""
        return bool(self._containers(pod))

    def address(self) -> str:
        """A fresh loopback address for a pod."""
        with self._lock:
            offset = next(self._addresses) % (POD_LOOPBACK.num_addresses - 2)
        return str(POD_LOOPBACK.network_address + offset)

    def _kubeconfig(self, pod: Mapping[str, Any], folder: Path) -> Path | None:
        spec = pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return None
        account = spec.get("serviceAccountName") or "default"
        token = self.request_token(pod["metadata"]["namespace"], account)
        cluster: dict[str, Any] = {"server": self.server}
        if self.ca_file:
            cluster["certificate-authority"] = self.ca_file
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "pod",
                    "context": {
                        "cluster": "local",
                        "user": account,
                        "namespace": pod["metadata"]["namespace"],
                    },
                }
            ],
            "current-context": "pod",
        }
        path = folder / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def start(
        self, pod: Mapping[str, Any], ip: str, env: Mapping[str, str], restart: int = 0
    ) -> PodProcess:
        """Start the pod's container processes on `ip`, with `env` on top of each container's."""
        containers = self._containers(pod)
        if not containers:
            raise ValueError(f"pod {pod['metadata']['name']} runs no command this host knows")
        uid = pod["metadata"]["uid"]
        self.stop(uid)
        folder = self.workdir / f"{pod['metadata']['namespace']}_{pod['metadata']['name']}"
        folder.mkdir(parents=True, exist_ok=True)
        kubeconfig = self._kubeconfig(pod, folder)
        started = [
            self._start_container(
                pod, container, ip, env=env, kubeconfig=kubeconfig, log_path=folder / log
            )
            for container, log in zip(containers, _log_names(containers, restart), strict=True)
        ]
        process = PodProcess(uid, ip, started)
        with self._lock:
            self.running[uid] = process
        return process

    def _start_container(
        self,
        pod: Mapping[str, Any],
        container: Mapping[str, Any],
        ip: str,
        *,
        env: Mapping[str, str],
        kubeconfig: Path | None,
        log_path: Path,
    ) -> ContainerProcess:
        variables = {**container_env(pod, container, ip), **env}
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        argv = [expand(word, variables) for word in argv]
        runner = self._runner(argv)
        assert runner is not None  # _container checked it
        argv = bind_to_pod(runner(argv), ip, engine=runner is engine_simulator_command)
        process_env = {**os.environ, **variables}
        if kubeconfig is not None:
            process_env["KUBECONFIG"] = str(kubeconfig)
        with log_path.open("wb") as output:
            popen = subprocess.Popen(
                [*DIE_WITH_PARENT, *argv],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=process_env,
                start_new_session=True,  # a signal to the test run must not reach it directly
            )
        log.info("pod %s: started %s on %s", pod["metadata"]["name"], argv[0], ip)
        return ContainerProcess(container.get("name", ""), popen, _probe_url(container, ip))

    def ready(self, uid: str) -> bool:
        """Every container's readiness probe (httpGet) answers 2xx/3xx; a container without one
        is ready once up."""
        process = self.running.get(uid)
        if process is None or not process.alive():
            return False
        return all(_probe(c.probe_url) for c in process.containers)

    def alive(self, uid: str) -> bool:
        """The pod's process is running."""
        process = self.running.get(uid)
        return process is not None and process.alive()

    def publish(self, pod: Mapping[str, Any]) -> None:
        """The pod is Ready: scrape it, as Prometheus' Kubernetes SD would with the
        `prometheus.io/*` annotations and the pod labels relabelled to the names the operator
        reads (`deployment`, `role`, `pool`)."""
        uid = pod["metadata"]["uid"]
        process = self.running.get(uid)
        annotations = pod["metadata"].get("annotations") or {}
        if self.sd_file is None or process is None or annotations.get(SCRAPE) != "true":
            return
        labels = pod["metadata"].get("labels") or {}
        # The activator's metrics port too, as deploy/prometheus/router-scrape.yaml keeps it.
        ports = [annotations.get(SCRAPE_PORT, "80")] + [
            str(port["containerPort"])
            for container in pod["spec"].get("containers") or []
            for port in container.get("ports") or []
            if port.get("name") == ACTIVATOR_METRICS_PORT_NAME
        ]
        group = {
            "targets": [f"{process.ip}:{port}" for port in ports],
            "labels": {
                "__metrics_path__": annotations.get(SCRAPE_PATH, "/metrics"),
                "namespace": pod["metadata"]["namespace"],
                "pod": pod["metadata"]["name"],
                **{name: labels[key] for key, name in TARGET_LABELS.items() if key in labels},
            },
        }
        with self._lock:
            self._targets[uid] = group
            self._write_targets()

    def _write_targets(self) -> None:
        """Write the file aside and rename it, so Prometheus never reads half of it. Caller
        holds the lock."""
        if self.sd_file is None:
            return
        temporary = self.sd_file.with_name(f".{self.sd_file.name}.tmp")
        temporary.write_text(json.dumps(list(self._targets.values())))
        os.replace(temporary, self.sd_file)

    def pre_stop(self, pod: Mapping[str, Any], seconds: float) -> None:
        """Run each container's preStop exec hook, as the kubelet does before SIGTERM, for at
        most `seconds` in all. The pod's own loopback is its address here, so the hook's
        127.0.0.1 becomes it, and `python3` this Python."""
        process = self.running.get(pod["metadata"]["uid"])
        if process is None:
            return
        deadline = time.monotonic() + seconds
        for container in (pod.get("spec") or {}).get("containers") or []:
            hook = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}
            argv = [word.replace("127.0.0.1", process.ip) for word in hook.get("command") or []]
            if not argv:
                continue
            if argv[0] == "python3":
                argv[0] = sys.executable
            self._run_hook(argv, deadline)

    def _run_hook(self, argv: Sequence[str], deadline: float) -> None:
        """Run one hook until it returns or `deadline`; `stop_all` ends it sooner."""
        with self._lock:
            if self._stopped:
                return
            try:
                popen = subprocess.Popen(
                    [*DIE_WITH_PARENT, *argv],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as error:
                log.warning("preStop hook %s did not start: %s", argv[0], error)
                return
            self._hooks.add(popen)
        try:
            popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=10)
        finally:
            with self._lock:
                self._hooks.discard(popen)

    def stop(self, uid: str, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM, then SIGKILL after the grace period; forget the process and its target."""
        with self._lock:
            process = self.running.pop(uid, None)
            if self._targets.pop(uid, None) is not None:
                self._write_targets()
        if process is None:
            return
        running = [c.popen for c in process.containers if c.popen.poll() is None]
        for popen in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        for popen in running:
            try:
                popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(timeout=10)

    def stop_all(self) -> None:
        """Stop every process, preStop hooks first (the kubelet is going away), and withdraw
        the targets file."""
        with self._lock:
            self._stopped = True
            hooks = list(self._hooks)
        for popen in hooks:
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            popen.wait(timeout=10)
        for uid in list(self.running):
            self.stop(uid)
        if self.sd_file is not None:
            self.sd_file.unlink(missing_ok=True)


def _log_names(containers: Sequence[Mapping[str, Any]], restart: int) -> list[str]:
    """`container-N.log` for the first container (the engine or router), `NAME-N.log` after."""
    return [f"container-{restart}.log"] + [
        f"{c.get('name', index)}-{restart}.log" for index, c in enumerate(containers[1:], 1)
    ]


def _probe(url: str | None) -> bool:
    if url is None:
        return True
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_SECONDS) as answer:
            status: int = answer.status
        return 200 <= status < 400
    except (OSError, urllib.error.URLError):
        return False


def service_urls(api_client: Any, namespace: str, service: str, port_name: str) -> list[str]:
    """`http://address:port` of every Ready pod behind a Service port: what kube-proxy would send
    a client to, on a control plane that runs none. Computed from the Service's selector and the
    pods, as the EndpointSlice controller does: the apiserver refuses loopback addresses in
    EndpointSlices, so the slices of serving pods on loopback stay empty."""
    base = f"/api/v1/namespaces/{namespace}"
    spec = call_json(api_client, "GET", f"{base}/services/{service}", None)["spec"]
    port = next(p for p in spec["ports"] if p.get("name") == port_name)
    selector = ",".join(f"{k}={v}" for k, v in (spec.get("selector") or {}).items())
    pods = call_json(api_client, "GET", f"{base}/pods", None, query=[("labelSelector", selector)])
    urls = []
    for pod in pods.get("items") or []:
        status = pod.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        if not ready or pod["metadata"].get("deletionTimestamp") or not status.get("podIP"):
            continue
        target = port.get("targetPort", port["port"])
        if isinstance(target, str):
            named = {
                p.get("name"): p.get("containerPort")
                for c in pod["spec"]["containers"]
                for p in c.get("ports") or []
            }
            target = named.get(target)
        if target:
            urls.append(f"http://{status['podIP']}:{target}")
    return sorted(urls)

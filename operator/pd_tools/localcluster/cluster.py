"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager.

Like controller-runtime's envtest, plus the controller-manager so that Deployments create
ReplicaSets and Pods, namespaces are finalized and owner references garbage-collect. No kubelet
and no scheduler: the mock scheduler (pd_operator.sim) plays both for simulated nodes. On
request (`lws=True`) also the LeaderWorkerSet controller, for multi-node pools.
"""

import json
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import yaml

from pd_operator.api.crd import crd_files
from pd_tools.localcluster import lws as lws_controller
from pd_tools.localcluster.pki import CertificateAuthority, KeyPair, service_account_keys
from pd_tools.localcluster.processes import (
    LocalClusterError,
    ManagedProcess,
    find_binary,
    free_port,
    http_ok,
    port_open,
)

# The benchmarking range (RFC 2544): allocated to Services, never routed or dialled by anything
# here; a /16 so that benchmarks with hundreds of PDDeployments (two Services each) fit.
SERVICE_CIDR = "198.18.0.0/16"
CONTROLLERS = [
    "garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "endpointslice-controller",
    # Counts the healthy pods under each PodDisruptionBudget: evictions (drains) read it.
    "disruption-controller",
    # Scales PDPools (mode External) through /scale, as it would in a cluster.
    "horizontal-pod-autoscaler-controller",
]
START_TIMEOUT_SECONDS = 60
CRD_ESTABLISHED_TIMEOUT_S = 60
# The CRDs apply_crds installs, by kind and name, in the order they are waited for.
SERVED_CRDS = (("PDDeployment", "pddeployments.pdoperator.io"), ("PDPool", "pdpools.pdoperator.io"))


def _kubeconfig(server: str, ca: Path, client: KeyPair, user: str) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(client.cert),
                    "client-key": str(client.key),
                },
            }
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    return yaml.safe_dump(config)


class KubectlCluster:
    """kubectl against a kubeconfig, and installing the CRDs: what every test cluster offers."""

    kubeconfig: Path
    kubectl_path: Path

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        """Run kubectl against this cluster; returns stdout, raises with stderr on failure."""
        result = subprocess.run(
            [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args],
            input=input_text,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise LocalClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def apply_crds(self) -> None:
        """Install the CRDs (PDDeployment, and PDPool for mode External) with server-side apply
        and wait until each is served."""
        self.kubectl(
            "apply", "--server-side", "--field-manager=pd-operator", "-f", "-",
            input_text="\n---\n".join(crd_files().values()),
        )  # fmt: skip
        for kind, name in SERVED_CRDS:
            self._wait_established(kind, name)

    def _wait_established(self, kind: str, name: str) -> None:
        # Polled, as JSON: until the apiserver has written the CRD's first status, both
        # `kubectl wait --for=condition=Established` and a jsonpath filter on the conditions
        # fail at once (".status.conditions ... nil") instead of waiting.
        deadline = time.monotonic() + CRD_ESTABLISHED_TIMEOUT_S
        while True:
            crd = json.loads(self.kubectl("get", f"crd/{name}", "-o", "json"))
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(
                c.get("type") == "Established" and c.get("status") == "True" for c in conditions
            ):
                return
            if time.monotonic() > deadline:
                raise LocalClusterError(
                    f"the {kind} CRD was not Established within {CRD_ESTABLISHED_TIMEOUT_S} s"
                )
            time.sleep(0.2)


class LocalCluster(KubectlCluster):
    """Start with `start()` (or a `with` block); `stop()` leaves no process and no folder."""

    def __init__(
        self,
        *,
        install_crds: bool = True,
        keep_dir: bool = False,
        admission_plugins: Sequence[str] = (),
        lws: bool = False,
    ) -> None:
        """`admission_plugins`: enabled besides the apiserver's defaults (e.g. OpenShift's
        OwnerReferencesPermissionEnforcement). `lws`: also install the LeaderWorkerSet CRD and
        run its controller (and the StatefulSet controller it needs)."""
        self.install_crds = install_crds
        self.lws = lws
        self.keep_dir = keep_dir
        self.admission_plugins = tuple(admission_plugins)
        self.dir = Path(tempfile.mkdtemp(prefix="pd-localcluster-"))
        self.processes: list[ManagedProcess] = []
        self.server = ""
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self.ca_path = self.dir / "pki" / "ca.crt"
        self.startup_seconds = 0.0

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start every component and wait until the apiserver is ready and CRDs established."""
        began = time.monotonic()
        try:
            binaries = {
                name: find_binary(name)
                for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
            }
            self.kubectl_path = binaries["kubectl"]
            # Looked up first: a missing binary fails before anything is started.
            lws_binary = lws_controller.binary() if self.lws else None
            pki_dir = self.dir / "pki"
            pki_dir.mkdir()
            ca = CertificateAuthority(pki_dir)
            etcd_url = self._start_etcd(binaries["etcd"])
            self._start_apiserver(binaries["kube-apiserver"], ca, etcd_url)
            # CRDs before the controller-manager: its garbage collector then watches
            # PDDeployments from the start instead of after its next discovery resync.
            if self.install_crds:
                self.apply_crds()
            if lws_binary:
                self._apply_lws_crd(lws_binary)
            self._start_controller_manager(binaries["kube-controller-manager"], ca)
            if lws_binary:
                self._start_lws_controller(lws_binary, ca)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def _start_etcd(self, binary: Path) -> str:
        client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        etcd = self._spawn(
            "etcd",
            [
                str(binary),
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                # Test data only: durability is not worth the fsync latency.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        etcd.wait_until(lambda: http_ok(f"{client_url}/health"), START_TIMEOUT_SECONDS, "healthy")
        return client_url

    def _start_apiserver(self, binary: Path, ca: CertificateAuthority, etcd_url: str) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        serving = ca.issue("apiserver", "kube-apiserver", server=True)
        sa = service_account_keys(self.dir / "pki")
        admin = ca.issue("admin", "pd-operator-admin", organization="system:masters")
        self.kubeconfig.write_text(_kubeconfig(self.server, ca.cert_path, admin, "admin"))
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(binary),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.cert_path}",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                f"--cert-dir={self.dir / 'pki'}",
                "--profiling=false",
                "--v=1",
                *(
                    [f"--enable-admission-plugins={','.join(self.admission_plugins)}"]
                    if self.admission_plugins
                    else []
                ),
            ],
        )
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        context.load_cert_chain(str(admin.cert), str(admin.key))
        apiserver.wait_until(
            lambda: http_ok(f"{self.server}/readyz", context), START_TIMEOUT_SECONDS, "ready"
        )

    def _start_controller_manager(self, binary: Path, ca: CertificateAuthority) -> None:
        identity = ca.issue("controller-manager", "system:kube-controller-manager")
        kubeconfig = self.dir / "controller-manager.kubeconfig"
        kubeconfig.write_text(
            _kubeconfig(self.server, ca.cert_path, identity, "system:kube-controller-manager")
        )
        port = free_port()
        controllers = CONTROLLERS + (list(lws_controller.KCM_CONTROLLERS) if self.lws else [])
        manager = self._spawn(
            "kube-controller-manager",
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.dir / 'controller-manager'}",
                f"--controllers={','.join(controllers)}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.dir / 'pki' / 'sa.key'}",
                f"--root-ca-file={ca.cert_path}",
                "--leader-elect=false",
                # Simulated pools churn hundreds of pods; the defaults (20 QPS) would throttle them.
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        manager.wait_until(
            lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure),
            START_TIMEOUT_SECONDS,
            "healthy",
        )

    def _apply_lws_crd(self, binary: Path) -> None:
        self.kubectl(
            "apply", "--server-side", "--field-manager=pd-localcluster", "-f", "-",
            input_text=lws_controller.crd_yaml(binary),
        )  # fmt: skip
        self._wait_established("LeaderWorkerSet", lws_controller.CRD_NAME)

    def _start_lws_controller(self, binary: Path, ca: CertificateAuthority) -> None:
        # The admin kubeconfig: this controller's own RBAC is its chart's business, not ours.
        health_port, webhook_port = free_port(), free_port()
        serving = ca.issue("lws-webhook", "lws-webhook", server=True)
        cert_dir = self.dir / "lws-webhook"
        cert_dir.mkdir()
        shutil.copy(serving.cert, cert_dir / "tls.crt")
        shutil.copy(serving.key, cert_dir / "tls.key")
        config_path = self.dir / "lws-config.yaml"
        config_path.write_text(lws_controller.config_yaml(health_port, webhook_port, cert_dir))
        controller = self._spawn(
            lws_controller.BINARY, lws_controller.argv(binary, self.kubeconfig, config_path)
        )
        controller.wait_until(
            lambda: http_ok(f"http://127.0.0.1:{health_port}/readyz") and port_open(webhook_port),
            START_TIMEOUT_SECONDS,
            "ready",
        )
        # Registered once the server answers: the webhooks fail closed, as in a cluster.
        configurations = lws_controller.webhook_configurations(
            binary, f"https://127.0.0.1:{webhook_port}", ca.cert_path.read_bytes()
        )
        self.kubectl(
            "apply", "--server-side", "--field-manager=pd-localcluster", "-f", "-",
            input_text=yaml.safe_dump_all(configurations),
        )  # fmt: skip
        controller.wait_until(self._lws_webhooks_active, START_TIMEOUT_SECONDS, "webhooks active")

    def _lws_webhooks_active(self) -> bool:
        # The apiserver loads new webhook configurations asynchronously.
        created = self.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-",
            input_text=json.dumps(lws_controller.probe()), check=False,
        )  # fmt: skip
        return bool(created) and "networkConfig" in json.loads(created)["spec"]

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        process = ManagedProcess(name, argv, self.dir)
        self.processes.append(process)
        return process

    def stop(self) -> None:
        """Stop every process (newest first) and remove the cluster's folder."""
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self) -> dict[str, str]:
        """The tail of each component's log, for failure reports."""
        return {process.name: process.log_tail(40) for process in self.processes}


class ExistingCluster(KubectlCluster):
    """A cluster that already runs (kind, a dev cluster): tests use it instead of starting one.

    Set PD_TEST_KUBECONFIG to its kubeconfig; `start` installs the CRDs, `stop` leaves it be.
    """

    def __init__(self, kubeconfig: str | Path) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.kubectl_path = find_binary("kubectl")
        self.server = ""
        self.startup_seconds = 0.0

    def start(self) -> None:
        """Install (or update) the CRDs with server-side apply."""
        began = time.monotonic()
        self.server = self.kubectl(
            "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
        )
        self.apply_crds()
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Nothing to stop: the cluster is not ours."""


__all__ = ["ExistingCluster", "LocalCluster", "LocalClusterError"]

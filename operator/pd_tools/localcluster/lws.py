"""The LeaderWorkerSet controller (sigs.k8s.io/lws) beside a local control plane.

`hack/testenv.sh` builds `lws-controller` and copies the module's CRD and webhook
configurations into `lws-manifests/` beside it, so schema, webhooks and code share a version.
The webhooks are not optional: LWS's pod webhook writes the group and worker index labels and
the `LWS_*` environment its controllers and engines read. In a cluster the apiserver reaches
them through a Service; here the configurations name the controller's loopback URL instead, with
a serving certificate from the local cluster's CA (LWS's own certificate manager is off).
"""

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

from pd_tools.localcluster.processes import MissingBinaryError, find_binary

BINARY = "lws-controller"
MANIFESTS = "lws-manifests"
CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
# The StatefulSets LWS creates (a leader set, then one worker set per group) need this
# controller of kube-controller-manager to become pods.
KCM_CONTROLLERS = ("statefulset-controller",)
# kustomize's JSON-patch files in config/webhook, by the kind of configuration they patch.
WEBHOOK_PATCHES = {
    "MutatingWebhookConfiguration": "mutating-patch.yaml",
    "ValidatingWebhookConfiguration": "validating-patch.yaml",
}


def binary() -> Path:
    """The controller binary; MissingBinaryError (fixed by `make testenv`) when absent."""
    found = find_binary(BINARY)
    if not (found.parent / MANIFESTS).is_dir():
        raise MissingBinaryError(f"{found.parent / MANIFESTS} is missing (run `make testenv`)")
    return found


def crd_yaml(controller: Path) -> str:
    """The CRD(s) shipped beside `controller`, as one multi-document YAML."""
    files = sorted((controller.parent / MANIFESTS / "crd").glob("*.yaml"))
    return "\n---\n".join(path.read_text() for path in files)


def webhook_configurations(controller: Path, url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The module's webhook configurations as its kustomization renders them, each webhook
    pointed at `url` (the controller's webhook server) instead of a Service."""
    folder = controller.parent / MANIFESTS / "webhook"
    documents = [d for d in yaml.safe_load_all((folder / "manifests.yaml").read_text()) if d]
    ca_bundle = base64.b64encode(ca_pem).decode()
    rendered = []
    for document in documents:
        config = copy.deepcopy(document)
        for operation in yaml.safe_load((folder / WEBHOOK_PATCHES[config["kind"]]).read_text()):
            _apply_replace(config, operation)
        config["metadata"]["name"] = f"lws-{config['metadata']['name']}"
        for webhook in config["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca_bundle}
        rendered.append(config)
    return rendered


def probe() -> dict[str, Any]:
    """A minimal LeaderWorkerSet: created with server-side dry-run, it comes back with
    `networkConfig` once the defaulting webhook is in effect."""
    pod = {"spec": {"containers": [{"name": "probe", "image": "registry.invalid/probe:1"}]}}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {"leaderWorkerTemplate": {"size": 2, "workerTemplate": pod}},
    }


def _apply_replace(document: dict[str, Any], operation: dict[str, Any]) -> None:
    # The only operation kustomize's patches use here: replace one webhook by index.
    parts = operation["path"].strip("/").split("/")
    if operation["op"] != "replace" or len(parts) != 2 or parts[0] != "webhooks":
        raise ValueError(f"unsupported webhook patch {operation['op']} {operation['path']}")
    document["webhooks"][int(parts[1])] = operation["value"]


def config_yaml(health_port: int, webhook_port: int, cert_dir: Path) -> str:
    """The controller's configuration: no leader election, certificate manager or metrics; the
    webhook server on loopback with the certificate in `cert_dir` (tls.crt, tls.key)."""
    config = {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        # "0" turns controller-runtime's metrics server off.
        "metrics": {"bindAddress": "0"},
    }
    return yaml.safe_dump(config)


def argv(controller: Path, kubeconfig: Path, config_path: Path) -> list[str]:
    """The controller's command line."""
    return [
        str(controller),
        f"--kubeconfig={kubeconfig}",
        f"--config={config_path}",
        "--leader-elect=false",
        "--zap-log-level=info",
    ]

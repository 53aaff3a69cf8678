"""Prometheus behind a bearer token and a private CA, the credentials taken from Secrets.

A small HTTPS reverse proxy on 127.0.0.1 stands in front of the real local Prometheus: it
serves a certificate signed by a throwaway CA and refuses any request without the right bearer
token. PDDeployments name a Secret holding that token and CA (spec.scaling.prometheus), and the
running operator reads the Secret from the real apiserver.
"""

import base64
import collections
import copy
import ssl
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from fakeengine import FakeEngine
from kubetools import RunningOperator, condition, create_pdd, get_pdd, wait_for
from pd_operator.adapters.credentials import OPT_IN_LABEL
from pd_tools.localcluster.pki import CertificateAuthority
from pdcases import ROOT, load_sample

HETERO = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
TOKEN = "prometheus-reader-token"


class AuthProxy:
    """HTTPS on 127.0.0.1 that forwards to Prometheus only requests bearing `token`."""

    def __init__(self, upstream: str, token: str, cert_path: str, key_path: str) -> None:
        self.seen: collections.Counter[str] = collections.Counter()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def forward(self) -> None:
                if self.headers.get("Authorization") != f"Bearer {token}":
                    proxy.seen["denied"] += 1
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                proxy.seen["allowed"] += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {"Content-Type": self.headers["Content-Type"]} if body else {}
                request = urllib.request.Request(
                    upstream + self.path, data=body, method=self.command, headers=headers
                )
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        status, payload = response.status, response.read()
                except urllib.error.HTTPError as error:
                    status, payload = error.code, error.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = forward  # noqa: N815 (http.server's names)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_path, key_path)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """The proxy's CA and serving certificate (127.0.0.1), and an unrelated CA."""
    ca = CertificateAuthority(tmp_path_factory.mktemp("proxy-ca"))
    serving = ca.issue("proxy", "127.0.0.1", server=True)
    stranger = CertificateAuthority(tmp_path_factory.mktemp("other-ca"))
    return ca, serving, stranger


@pytest.fixture(scope="module")
def proxy(prometheus, pki):
    _, serving, _ = pki
    running = AuthProxy(prometheus.url, TOKEN, str(serving.cert), str(serving.key))
    yield running
    running.close()


@pytest.fixture
def operator(cluster, namespace):
    running = RunningOperator(
        str(cluster.kubeconfig), namespaces=[namespace], workers=2, resync_seconds=2
    ).start()
    yield running
    running.stop()


@pytest.fixture
def engines(prometheus, namespace):
    """Engine metrics of glm-hetero's prefill and decode, with some traffic."""
    made = {}
    for role in ("prefill", "decode"):
        labels = {"namespace": namespace, "deployment": "glm-hetero", "role": role}
        made[role] = FakeEngine(prometheus, f"{namespace}-{role}", labels)
    yield made
    for role, engine in made.items():
        prometheus.set_targets(f"{namespace}-{role}", [], {})
        engine.close()


def create_secret(
    api_client, namespace: str, name: str, data: dict[str, bytes], *, opt_in: bool = True
) -> None:
    encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
    labels = {OPT_IN_LABEL: "true"} if opt_in else {}
    client.CoreV1Api(api_client).create_namespaced_secret(
        namespace,
        {"metadata": {"name": name, "labels": labels}, "type": "Opaque", "data": encoded},
    )


def pdd_body(name: str, url: str, token_key: str = "token", ca_secret: str = "prom-auth") -> dict:
    body = copy.deepcopy(HETERO)
    body["metadata"]["name"] = name
    body["spec"]["slo"]["windowSeconds"] = 10
    body["spec"]["scaling"] = {
        "mode": "Advisory",  # what is read matters here, not what is applied
        "intervalSeconds": 5,
        "prometheus": {
            "url": url,
            "bearerTokenSecretRef": {"name": "prom-auth", "key": token_key},
            "caSecretRef": {"name": ca_secret, "key": "ca.crt"},
        },
    }
    return body


def metrics_available(api_client, namespace: str, name: str) -> dict:
    return condition(get_pdd(api_client, namespace, name), "MetricsAvailable")


def test_signals_are_read_with_the_token_and_ca_from_the_secret(
    operator, api_client, namespace, proxy, pki, engines
):
    ca, _, _ = pki
    create_secret(
        api_client,
        namespace,
        "prom-auth",
        {"token": f"{TOKEN}\n".encode(), "ca.crt": ca.cert_path.read_bytes()},
    )
    allowed_before = proxy.seen["allowed"]
    create_pdd(api_client, namespace, pdd_body("glm-hetero", proxy.url))

    def observed_through_the_proxy():
        for _ in range(20):
            engines["prefill"].ttft.labels(model_name="m").observe(0.5)
            engines["decode"].itl.labels(model_name="m").observe(0.012)
        obj = get_pdd(api_client, namespace, "glm-hetero")
        observed = (obj.get("status") or {}).get("observed") or {}
        return condition(obj, "MetricsAvailable").get("status") == "True" and observed.get(
            "ttftMilliseconds"
        )

    ttft_ms = wait_for(
        observed_through_the_proxy, timeout=60, interval=1, what="TTFT read through the proxy"
    )
    assert 250 <= ttft_ms <= 1000  # the bucket that holds 0.5 s
    assert proxy.seen["allowed"] > allowed_before
    assert proxy.seen["denied"] == 0


def test_a_wrong_key_or_ca_makes_metrics_unavailable_and_says_which_field(
    operator, api_client, namespace, proxy, pki
):
    ca, _, stranger = pki
    create_secret(
        api_client,
        namespace,
        "prom-auth",
        {"token": TOKEN.encode(), "ca.crt": ca.cert_path.read_bytes()},
    )
    create_secret(api_client, namespace, "other-ca", {"ca.crt": stranger.cert_path.read_bytes()})
    denied_before = proxy.seen["denied"]
    create_pdd(api_client, namespace, pdd_body("wrong-key", proxy.url, token_key="bearer"))
    create_pdd(api_client, namespace, pdd_body("wrong-ca", proxy.url, ca_secret="other-ca"))

    wrong_key = wait_for(
        lambda: (
            (c := metrics_available(api_client, namespace, "wrong-key")).get("status") == "False"
            and c
        ),
        timeout=40,
        what="MetricsAvailable=False for the wrong key",
    )
    assert wrong_key["reason"] == "MetricsUnavailable"
    assert (
        f"spec.scaling.prometheus.bearerTokenSecretRef: secret {namespace}/prom-auth has no key "
        "'bearer'" in wrong_key["message"]
    )
    status = get_pdd(api_client, namespace, "wrong-key")["status"]
    assert status["lastDecision"]["limitedBy"] == "metrics"

    # The token is right, but the server's certificate is not signed by the named CA: the
    # operator refuses the connection before it sends anything.
    wrong_ca = wait_for(
        lambda: (
            (c := metrics_available(api_client, namespace, "wrong-ca")).get("status") == "False"
            and c
        ),
        timeout=40,
        what="MetricsAvailable=False for the wrong CA",
    )
    assert "CERTIFICATE_VERIFY_FAILED" in wrong_ca["message"]
    assert proxy.seen["denied"] == denied_before


def test_a_secret_that_does_not_opt_in_is_never_read_nor_sent(
    operator, api_client, namespace, proxy, pki
):
    # A user who may create PDDeployments names a Secret of the namespace that was not made for
    # Prometheus (here: no opt-in label): the operator must not send it anywhere, nor list its
    # keys in status.
    ca, _, _ = pki
    create_secret(
        api_client,
        namespace,
        "prom-auth",
        {"token": TOKEN.encode(), "ca.crt": ca.cert_path.read_bytes(), "password": b"hunter2"},
        opt_in=False,
    )
    seen_before = dict(proxy.seen)
    create_pdd(api_client, namespace, pdd_body("not-opted-in", proxy.url, token_key="bearer"))
    refused = wait_for(
        lambda: (
            (c := metrics_available(api_client, namespace, "not-opted-in")).get("status") == "False"
            and c
        ),
        timeout=40,
        what="MetricsAvailable=False for a Secret without the opt-in label",
    )
    assert f"is not labelled {OPT_IN_LABEL}=true" in refused["message"]
    assert "password" not in str(get_pdd(api_client, namespace, "not-opted-in")["status"])
    assert proxy.seen == seen_before  # nothing reached the URL, with or without the token

"""Prometheus credentials: a bearer token and a CA bundle, from Secrets or from files.

`spec.scaling.prometheus.{bearerTokenSecretRef,caSecretRef}` name a key of a Secret in the
PDDeployment's namespace, and only one labelled `pdoperator.io/prometheus-credentials: "true"`
is used. Secrets are read with a GET each (no list or watch: the operator's
RBAC has `get` on secrets only) and cached for a short TTL, so a cycle costs no API call per
object and a rotated Secret is picked up within the TTL. Every problem becomes a
`CredentialsError` whose message names the field and the fix; the autoscaler turns it into
*unavailable* metrics for that object (hold, never scale down).

The readers built with these credentials, and which object reads through which, are
`adapters/metrics_source.py`'s.
"""

import base64
import ipaddress
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pd_operator.api.spec import SecretKeyRef

# A Secret a PDDeployment may name must say so: a user who may create PDDeployments must not
# make the operator read any Secret of the namespace and send it to a URL of their choice.
OPT_IN_LABEL = "pdoperator.io/prometheus-credentials"
SECRET_TTL_SECONDS = 60.0
# A failed read is retried sooner than a good one is refreshed: a Secret created (or RBAC
# granted) after the PDDeployment shows up within this long.
ERROR_TTL_SECONDS = 10.0
SECRET_READ_TIMEOUT_SECONDS = 5
TOKEN_FIELD = "spec.scaling.prometheus.bearerTokenSecretRef"
CA_FIELD = "spec.scaling.prometheus.caSecretRef"
PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"


class CredentialsError(Exception):
    """Credentials that cannot be used; the message says which field and how to fix it."""


class SecretReadError(Exception):
    """A Secret that could not be read. `lasting`: missing or forbidden, as opposed to an API
    hiccup (after which the last good copy is kept)."""

    def __init__(self, message: str, *, lasting: bool) -> None:
        super().__init__(message)
        self.lasting = lasting


# (namespace, name) -> the Secret's data, decoded; raises SecretReadError.
SecretFetch = Callable[[str, str], Mapping[str, bytes]]


def kube_secret_fetch(api_client: client.ApiClient) -> SecretFetch:
    """A SecretFetch that GETs the Secret from the apiserver."""
    core = client.CoreV1Api(api_client)

    def fetch(namespace: str, name: str) -> Mapping[str, bytes]:
        where = f"secret {namespace}/{name}"
        try:
            secret = core.read_namespaced_secret(
                name, namespace, _request_timeout=SECRET_READ_TIMEOUT_SECONDS
            )
        except ApiException as error:
            if error.status == 404:
                raise SecretReadError(f"{where} not found", lasting=True) from None
            if error.status == 403:
                raise SecretReadError(
                    f"the operator may not read {where} (403 Forbidden): grant its "
                    "ServiceAccount get on secrets (Helm: rbac.readPrometheusSecrets=true)",
                    lasting=True,
                ) from None
            raise SecretReadError(
                f"reading {where} failed: {error.status} {error.reason}", lasting=False
            ) from None
        except urllib3.exceptions.HTTPError as error:
            raise SecretReadError(f"reading {where} failed: {error}", lasting=False) from None
        labels = (secret.metadata.labels if secret.metadata else None) or {}
        if labels.get(OPT_IN_LABEL) != "true":
            raise SecretReadError(
                f"{where} is not labelled {OPT_IN_LABEL}=true, so it is not used: label it to "
                f"let PDDeployments send it to their Prometheus (kubectl label secret -n "
                f"{namespace} {name} {OPT_IN_LABEL}=true)",
                lasting=True,
            )
        return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}

    return fetch


@dataclass
class _Cached:
    data: Mapping[str, bytes] | None
    error: SecretReadError | None
    expires: float


class SecretCache:
    """Secrets by (namespace, name), fetched at most once per TTL each."""

    def __init__(
        self,
        fetch: SecretFetch,
        *,
        ttl_seconds: float = SECRET_TTL_SECONDS,
        error_ttl_seconds: float = ERROR_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._ttl, self._error_ttl = ttl_seconds, error_ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], _Cached] = {}

    def get(self, namespace: str, name: str) -> Mapping[str, bytes]:
        """The Secret's data; raises SecretReadError."""
        key, now = (namespace, name), self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or now >= entry.expires:
                entry = self._refresh(key, entry, now)
                self._entries[key] = entry
        if entry.error is not None:
            raise entry.error
        assert entry.data is not None
        return entry.data

    def _refresh(self, key: tuple[str, str], old: _Cached | None, now: float) -> _Cached:
        try:
            return _Cached(self._fetch(*key), None, now + self._ttl)
        except SecretReadError as error:
            if not error.lasting and old is not None and old.data is not None:
                # An API hiccup: keep using the copy we have, and try again soon.
                return _Cached(old.data, None, now + self._error_ttl)
            return _Cached(None, error, now + self._error_ttl)

    def retain(self, keys: Iterable[tuple[str, str]]) -> None:
        """Forget every Secret not in `keys` (no PDDeployment references it any more)."""
        wanted = set(keys)
        with self._lock:
            for key in [k for k in self._entries if k not in wanted]:
                del self._entries[key]


@dataclass(frozen=True)
class Credentials:
    """What a reader presents: a bearer token and the CA that signs the server's certificate."""

    bearer_token: str | None = field(default=None, repr=False)  # never in a log line
    ca_pem: bytes | None = field(default=None, repr=False)


NO_CREDENTIALS = Credentials()


# Where a URL from a spec must not point: link-local addresses (a node's instance metadata
# service, 169.254.169.254, hands out cloud credentials) and the clouds' metadata names.
LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
METADATA_HOSTS = frozenset(
    {"metadata.google.internal", "metadata.goog", "fd00:ec2::254", "100.100.100.200"}
)


def spec_url_problem(url: str, *, allow_link_local: bool = False) -> str | None:
    """Why a PDDeployment may not send requests to `url`, or None. A user who may create
    PDDeployments chooses the URL, and the operator's network position must not lend them
    access to a node's metadata service (`--allow-link-local-prometheus` lifts this)."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if allow_link_local:
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if host in METADATA_HOSTS or (address is not None and any(address in n for n in LINK_LOCAL)):
        return (
            f"spec.scaling.prometheus.url: {host} is a link-local or cloud metadata address, "
            "which PDDeployments may not make the operator call; use Prometheus' Service "
            "address (or start the operator with --allow-link-local-prometheus)"
        )
    return None


def _secret_value(
    secrets: SecretCache, namespace: str, ref: SecretKeyRef, spec_field: str
) -> bytes:
    where = f"secret {namespace}/{ref.name}"
    try:
        data = secrets.get(namespace, ref.name)
    except SecretReadError as error:
        raise CredentialsError(f"{spec_field}: {error}") from None
    if ref.key not in data:  # the Secret's other key names are not ours to print
        raise CredentialsError(f"{spec_field}: {where} has no key '{ref.key}'")
    return data[ref.key]


def _token(raw: bytes, origin: str, where: str) -> str:
    try:
        # Secrets written with `echo` end with a newline, which is never part of a token.
        token = raw.decode().strip()
    except UnicodeDecodeError:
        raise CredentialsError(f"{origin}: {where} is not UTF-8 text") from None
    if not token:
        raise CredentialsError(f"{origin}: {where} is empty")
    if any(c in token for c in "\r\n"):
        raise CredentialsError(f"{origin}: {where} holds more than one line")
    return token


def _ca(raw: bytes, origin: str, where: str) -> bytes:
    if PEM_CERTIFICATE not in raw:
        raise CredentialsError(f"{origin}: {where} holds no PEM certificate")
    return raw


def secret_credentials(
    secrets: SecretCache,
    namespace: str,
    token_ref: SecretKeyRef | None,
    ca_ref: SecretKeyRef | None,
) -> Credentials:
    """The credentials a PDDeployment's spec names; raises CredentialsError."""
    token = ca = None
    if token_ref is not None:
        where = f"key '{token_ref.key}' of secret {namespace}/{token_ref.name}"
        raw = _secret_value(secrets, namespace, token_ref, TOKEN_FIELD)
        token = _token(raw, TOKEN_FIELD, where)
    if ca_ref is not None:
        where = f"key '{ca_ref.key}' of secret {namespace}/{ca_ref.name}"
        ca = _ca(_secret_value(secrets, namespace, ca_ref, CA_FIELD), CA_FIELD, where)
    return Credentials(token, ca)


class FileCredentials:
    """The operator's own credentials for its default Prometheus (`--prometheus-bearer-token-file`,
    `--prometheus-ca-file`), re-read every TTL: mounted Secrets and projected tokens rotate."""

    def __init__(
        self,
        token_file: str | None = None,
        ca_file: str | None = None,
        *,
        ttl_seconds: float = SECRET_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.token_file, self.ca_file = token_file, ca_file
        self._ttl, self._clock = ttl_seconds, clock
        self._cached: tuple[float, Credentials | CredentialsError] | None = None

    def current(self) -> Credentials:
        """The credentials in the files now; raises CredentialsError."""
        now = self._clock()
        if self._cached is None or now >= self._cached[0]:
            try:
                found: Credentials | CredentialsError = self._read()
            except CredentialsError as error:
                found = error
            self._cached = (now + self._ttl, found)
        if isinstance(self._cached[1], CredentialsError):
            raise self._cached[1]
        return self._cached[1]

    def _read(self) -> Credentials:
        token = ca = None
        if self.token_file:
            flag = "--prometheus-bearer-token-file"
            token = _token(_read_file(self.token_file, flag), flag, self.token_file)
        if self.ca_file:
            flag = "--prometheus-ca-file"
            ca = _ca(_read_file(self.ca_file, flag), flag, self.ca_file)
        return Credentials(token, ca)


def _read_file(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise CredentialsError(f"{flag}: cannot read {path}: {error.strerror}") from None

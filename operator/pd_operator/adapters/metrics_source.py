"""Where each PDDeployment's SLO signals come from, and their grouped reads.

`MetricsSource` chooses an object's Prometheus URL and credentials (its spec's, with Secrets
from `adapters/credentials.py`, or the operator's default), groups the due objects by the
server and credentials they read through, and reads every group at once within a deadline, so
that a slow or hung Prometheus holds back only the objects that read from it. A source that
cannot be used (no URL, a refused URL, broken credentials) gives that object *unavailable*
signals saying why.

`PrometheusReaders` keeps one reader per (url, token, CA), so that two PDDeployments with
different credentials for the same URL never share a connection, and writes each CA to a
private temporary file for `requests`, removed when no object uses that reader any more.
"""

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Protocol

from pd_operator.adapters import metrics, promql
from pd_operator.adapters.cache import ObjectKey
from pd_operator.adapters.credentials import (
    NO_CREDENTIALS,
    Credentials,
    CredentialsError,
    FileCredentials,
    SecretCache,
    secret_credentials,
    spec_url_problem,
)
from pd_operator.adapters.prometheus import (
    PrometheusReader,
    ReadReport,
    RoleKey,
    SignalTarget,
    all_signals,
)
from pd_operator.api import PDDeployment
from pd_operator.api.spec import ROLE_NAMES, PrometheusSpec, Role
from pd_operator.core.children import ROLES
from pd_operator.core.signals import RoleSignals, unavailable

# A Prometheus that has not answered a cycle's reads within this long gives unavailable metrics
# for that cycle. Under the 5 s minimum interval less the 1 s tick, so that a hung one never
# stretches another object's cycle; a healthy one answers the grouped queries for 500 objects
# in well under a second (docs/benchmarks.md).
READ_DEADLINE_SECONDS = 3.0
# Prometheus servers read at once. A hung one holds one thread until its queries time out (it is
# not read again before), so only more hung servers than this would delay the healthy ones.
READ_THREADS = 16


class ReaderFactory(Protocol):
    """Builds a reader (PrometheusReader's signature; tests pass a fake)."""

    def __call__(
        self, url: str, *, bearer_token: str | None = None, ca_path: str | None = None
    ) -> PrometheusReader: ...


ReaderKey = tuple[str, Credentials]
Read = tuple[dict[RoleKey, RoleSignals], ReadReport]


class PrometheusReaders:
    """One reader per (url, credentials); each CA lives in a private temporary file."""

    def __init__(self, factory: ReaderFactory = PrometheusReader) -> None:
        self._factory = factory
        # The reconciler's workers read through `get` too (a pool's pods before a scale-down),
        # while the autoscaler's thread adds and drops readers.
        self._lock = threading.Lock()
        self._readers: dict[ReaderKey, tuple[PrometheusReader, str | None]] = {}
        self._pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="prometheus-read")
        self._running: dict[ReaderKey, Future[Read]] = {}

    def get(self, url: str, credentials: Credentials = NO_CREDENTIALS) -> PrometheusReader:
        """The reader for this URL with these credentials, built on first use."""
        key = (url, credentials)
        with self._lock:
            if key not in self._readers:
                ca_path = _private_file(credentials.ca_pem) if credentials.ca_pem else None
                try:
                    reader = self._factory(
                        url, bearer_token=credentials.bearer_token, ca_path=ca_path
                    )
                except BaseException:
                    _remove(ca_path)
                    raise
                self._readers[key] = (reader, ca_path)
            return self._readers[key][0]

    def read(
        self,
        groups: Mapping[ReaderKey, Sequence[SignalTarget]],
        now: float,
        deadline_seconds: float,
    ) -> Iterator[tuple[ReaderKey, dict[RoleKey, RoleSignals], ReadReport]]:
        """Every group's signals from its Prometheus, all read at once, each yielded as its read
        ends. A server that does not answer within the deadline, or is still busy with a read
        of an earlier cycle (which is never started again meanwhile, so a hung server holds one
        thread, not one more per cycle), gives unavailable signals; its late answer is dropped.
        """
        started: dict[Future[Read], ReaderKey] = {}
        busy: list[ReaderKey] = []
        for key, targets in groups.items():
            running = self._running.get(key)
            if running is not None and not running.done():
                busy.append(key)
                continue
            future = self._pool.submit(self.get(*key).read, targets, now)
            self._running[key], started[future] = future, key
        ends = time.monotonic() + deadline_seconds
        pending = set(started)
        while pending:
            done, pending = wait(
                pending, max(0.0, ends - time.monotonic()), return_when=FIRST_COMPLETED
            )
            if not done:
                break
            for future in done:
                key = started[future]
                yield key, *_outcome(future, key[0], groups[key], now)
        for key in [*busy, *(started[future] for future in pending)]:
            reason = f"Prometheus at {key[0]} did not answer within {deadline_seconds:g} s"
            missing = all_signals(groups[key], now, unavailable(reason))
            yield key, missing, ReadReport(errors=[reason])

    def retain(self, keys: Iterable[ReaderKey]) -> None:
        """Drop every reader not in `keys` (credentials replaced, objects gone) and its CA file."""
        wanted = set(keys)
        with self._lock:
            dropped = [self._readers.pop(k) for k in list(self._readers) if k not in wanted]
        for reader, ca_path in dropped:
            close = getattr(reader, "close", None)  # test doubles may have none
            if close:
                close()
            _remove(ca_path)
        self._running = {
            key: future
            for key, future in self._running.items()
            if key in wanted or not future.done()
        }

    def close(self) -> None:
        """Drop every reader and CA file, and stop reading."""
        self.retain(())
        self._pool.shutdown(wait=False, cancel_futures=True)

    def ca_paths(self) -> list[str]:
        """The CA files in use (for tests and diagnostics)."""
        with self._lock:
            return [path for _, path in self._readers.values() if path]


def _outcome(future: Future[Read], url: str, targets: Sequence[SignalTarget], now: float) -> Read:
    """A finished read, or unavailable signals when it raised (e.g. its reader was closed)."""
    try:
        return future.result()
    except Exception as error:  # one server's failure must not stop the others' decisions
        reason = f"Prometheus at {url} unavailable: {error}"
        return all_signals(targets, now, unavailable(reason)), ReadReport(errors=[reason])


def _private_file(content: bytes) -> str:
    # mkstemp creates the file 0600, readable by the operator only.
    descriptor, path = tempfile.mkstemp(prefix="pd-operator-prometheus-ca-", suffix=".pem")
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(content)
    return path


def _remove(path: str | None) -> None:
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _named_secrets(namespace: str, prometheus: PrometheusSpec | None) -> frozenset[tuple[str, str]]:
    refs = (prometheus.bearer_token_secret_ref, prometheus.ca_secret_ref) if prometheus else ()
    return frozenset((namespace, ref.name) for ref in refs if ref is not None)


def _target(key: ObjectKey, pdd: PDDeployment) -> SignalTarget:
    spec = pdd.spec
    seasonal = spec.scaling.seasonal
    return SignalTarget(
        key[0], key[1], spec.model.engine, spec.slo.ttft.percentile,
        spec.slo.itl.percentile, spec.slo.window_seconds,
        seasonal=(seasonal.period, seasonal.seasons, seasonal.time_zone) if seasonal else None,
        router_traffic=spec.scaling.idle_seconds is not None,
        several_pools=any(len(spec.pools(role)) > 1 for role in ROLE_NAMES),
    )  # fmt: skip


class MetricsSource:
    """The SLO signals of PDDeployments, read from the Prometheus each one names."""

    def __init__(
        self,
        *,
        default_prometheus_url: str | None = None,
        default_credentials: FileCredentials | None = None,
        secrets: SecretCache | None = None,
        allow_link_local: bool = False,
        readers: ReaderFactory = PrometheusReader,
        read_deadline_seconds: float = READ_DEADLINE_SECONDS,
    ) -> None:
        self.default_prometheus_url = default_prometheus_url
        self.default_credentials = default_credentials  # for the default URL only
        self.secrets = secrets  # None: Secrets are not read, a reference makes metrics unavailable
        self.allow_link_local = allow_link_local  # for URLs from specs
        self.readers = PrometheusReaders(readers)
        self.read_deadline_seconds = read_deadline_seconds
        # What each object reads through and which Secrets it names, so that readers and
        # cached Secrets nobody uses any more are dropped (kept while the object exists).
        self._in_use: dict[ObjectKey, tuple[ReaderKey | None, frozenset[tuple[str, str]]]] = {}
        self.last_report = ReadReport()  # the queries and errors of the last read

    def source(self, namespace: str, pdd: PDDeployment) -> tuple[str | None, Credentials]:
        """The URL and credentials of an object's Prometheus; raises CredentialsError.

        The operator's own token and CA go to its default URL only, never to a URL from a spec.
        """
        prometheus = pdd.spec.scaling.prometheus
        if prometheus is None:
            url = self.default_prometheus_url
            if url is None or self.default_credentials is None:
                return url, NO_CREDENTIALS
            return url, self.default_credentials.current()
        problem = spec_url_problem(prometheus.url, allow_link_local=self.allow_link_local)
        if problem:
            raise CredentialsError(problem)
        token_ref, ca_ref = prometheus.bearer_token_secret_ref, prometheus.ca_secret_ref
        if token_ref is None and ca_ref is None:
            return prometheus.url, NO_CREDENTIALS
        if self.secrets is None:
            raise CredentialsError(
                "spec.scaling.prometheus: this operator was started without access to Secrets"
            )
        return prometheus.url, secret_credentials(self.secrets, namespace, token_ref, ca_ref)

    def read(
        self,
        due: Sequence[tuple[ObjectKey, PDDeployment]],
        now: float,
        live: Collection[ObjectKey],
    ) -> Iterator[tuple[list[ObjectKey], dict[RoleKey, RoleSignals]]]:
        """The signals of the due objects, from grouped reads: one set of queries per Prometheus
        server and credentials in use, all at once. Each server's objects come as soon as it
        answered (within the read deadline; unavailable after it), the objects without a usable
        server first. Readers and Secrets that no object in `live` uses any more are dropped."""
        groups: dict[ReaderKey, list[ObjectKey]] = {}
        targets: dict[ReaderKey, list[SignalTarget]] = {}
        unread: list[ObjectKey] = []
        signals: dict[RoleKey, RoleSignals] = {}
        for key, pdd in due:
            named = _named_secrets(key[0], pdd.spec.scaling.prometheus)
            try:
                url, credentials = self.source(key[0], pdd)
            except CredentialsError as error:
                url, problem = None, str(error)
            else:
                problem = "no Prometheus URL: set spec.scaling.prometheus.url"
            if url is None:
                self._in_use[key] = (None, named)
                missing = unavailable(problem)
                for role in ROLES:
                    signals[(key[0], key[1], role)] = RoleSignals(
                        sample_time=now, ttft_seconds=missing, itl_seconds=missing
                    )
                unread.append(key)
                continue
            self._in_use[key] = ((url, credentials), named)
            groups.setdefault((url, credentials), []).append(key)
            targets.setdefault((url, credentials), []).append(_target(key, pdd))
        self._in_use = {k: v for k, v in self._in_use.items() if k in live}
        self.readers.retain(k for k, _ in self._in_use.values() if k is not None)
        if self.secrets is not None:
            self.secrets.retain(name for _, names in self._in_use.values() for name in names)
        if unread:
            yield unread, signals
        report = ReadReport()
        try:
            for reader_key, read, part in self.readers.read(
                targets, now, self.read_deadline_seconds
            ):
                report.queries += part.queries
                report.errors += part.errors
                report.failing_queries |= part.failing_queries
                yield groups[reader_key], read
        finally:
            metrics.PROMETHEUS_QUERIES.inc(report.queries)
            self.last_report = report

    def pod_work(
        self, key: ObjectKey, pdd: PDDeployment, role: Role, pods: Sequence[str]
    ) -> dict[str, float] | None:
        """The work each of these pods of the object holds now, from its Prometheus (one query);
        None when it cannot be read. For the reconciler, just before a pool shrinks."""
        try:
            url, credentials = self.source(key[0], pdd)
        except CredentialsError:
            return None
        if url is None or not pods:
            return None
        query = promql.pod_work_query(pdd.spec.model.engine, role, key[0], pods)
        found = self.readers.get(url, credentials).by_label(query, "pod")
        metrics.PROMETHEUS_QUERIES.inc()
        return found

    def close(self) -> None:
        """Drop every reader and CA file, and stop reading."""
        self.readers.close()

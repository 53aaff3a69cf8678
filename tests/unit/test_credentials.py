"""Prometheus credentials from Secrets and files (adapters/credentials.py), and how the
autoscaler's metrics source (adapters/metrics_source.py) builds its readers from them. Fakes
stand in for the apiserver's Secret GET and for the Prometheus reader only."""

import copy
import stat
from pathlib import Path

import pytest

from pd_operator.adapters.cache import ClusterCache
from pd_operator.adapters.credentials import (
    NO_CREDENTIALS,
    Credentials,
    CredentialsError,
    FileCredentials,
    SecretCache,
    SecretReadError,
    secret_credentials,
    spec_url_problem,
)
from pd_operator.adapters.metrics_source import PrometheusReaders
from pd_operator.adapters.prometheus import ReadReport
from pd_operator.api.spec import SecretKeyRef
from pd_operator.core.signals import NO_TRAFFIC, RoleSignals
from pd_operator.handlers.autoscaler import Autoscaler
from pdcases import minimal

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeSecrets:
    """The apiserver's Secrets, as a SecretFetch sees them; counts the GETs."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, str], dict[str, bytes]] = {}
        self.errors: dict[tuple[str, str], SecretReadError] = {}
        self.gets: list[tuple[str, str]] = []

    def __call__(self, namespace: str, name: str) -> dict[str, bytes]:
        self.gets.append((namespace, name))
        if (namespace, name) in self.errors:
            raise self.errors[(namespace, name)]
        if (namespace, name) not in self.data:
            raise SecretReadError(f"secret {namespace}/{name} not found", lasting=True)
        return dict(self.data[(namespace, name)])


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake() -> FakeSecrets:
    secrets = FakeSecrets()
    secrets.data[("llm", "prom")] = {"token": b"s3cret\n", "ca.crt": CA}
    return secrets


@pytest.fixture
def cache(fake, clock) -> SecretCache:
    return SecretCache(fake, ttl_seconds=60, error_ttl_seconds=10, clock=clock)


def ref(name: str = "prom", key: str = "token") -> SecretKeyRef:
    return SecretKeyRef(name=name, key=key)


def test_token_and_ca_come_from_one_get_of_their_secret(cache, fake):
    credentials = secret_credentials(cache, "llm", ref(), ref(key="ca.crt"))
    # The newline `echo` adds is not part of the token.
    assert credentials == Credentials("s3cret", CA)
    assert fake.gets == [("llm", "prom")]
    assert "s3cret" not in repr(credentials)  # a token never reaches a log line


def test_a_secret_is_read_again_after_the_ttl_so_rotation_is_picked_up(cache, fake, clock):
    assert secret_credentials(cache, "llm", ref(), None).bearer_token == "s3cret"
    fake.data[("llm", "prom")]["token"] = b"rotated"
    clock.now += 59
    assert secret_credentials(cache, "llm", ref(), None).bearer_token == "s3cret"
    clock.now += 2
    assert secret_credentials(cache, "llm", ref(), None).bearer_token == "rotated"
    assert len(fake.gets) == 2


@pytest.mark.parametrize(
    ("token_ref", "ca_ref", "data", "message"),
    [
        (
            ref(key="bearer"),
            None,
            {"token": b"x"},
            "spec.scaling.prometheus.bearerTokenSecretRef: secret llm/prom has no key 'bearer'",
        ),
        (
            ref(name="other"),
            None,
            {"token": b"x"},
            "spec.scaling.prometheus.bearerTokenSecretRef: secret llm/other not found",
        ),
        (
            ref(),
            None,
            {"token": b" \n"},
            "spec.scaling.prometheus.bearerTokenSecretRef: key 'token' of secret llm/prom is empty",
        ),
        (
            ref(),
            None,
            {"token": b"a\nb"},
            "bearerTokenSecretRef: key 'token' of secret llm/prom holds more than one line",
        ),
        (
            None,
            ref(key="ca.crt"),
            {"ca.crt": b"not a certificate"},
            "spec.scaling.prometheus.caSecretRef: key 'ca.crt' of secret llm/prom holds no PEM "
            "certificate",
        ),
    ],
)
def test_unusable_references_name_the_field_and_what_is_wrong(
    cache, fake, token_ref, ca_ref, data, message
):
    fake.data[("llm", "prom")] = data
    with pytest.raises(CredentialsError) as error:
        secret_credentials(cache, "llm", token_ref, ca_ref)
    assert message in str(error.value)


def test_a_missing_secret_is_asked_for_again_soon_and_found_once_created(cache, fake, clock):
    with pytest.raises(CredentialsError, match="not found"):
        secret_credentials(cache, "llm", ref(name="late"), None)
    fake.data[("llm", "late")] = {"token": b"t"}
    clock.now += 5
    with pytest.raises(CredentialsError, match="not found"):  # no GET per cycle meanwhile
        secret_credentials(cache, "llm", ref(name="late"), None)
    clock.now += 6
    assert secret_credentials(cache, "llm", ref(name="late"), None).bearer_token == "t"
    assert fake.gets == [("llm", "late"), ("llm", "late")]


def test_an_api_hiccup_keeps_the_last_good_copy_but_forbidden_does_not(cache, fake, clock):
    assert secret_credentials(cache, "llm", ref(), None).bearer_token == "s3cret"
    fake.errors[("llm", "prom")] = SecretReadError("reading failed: 500", lasting=False)
    clock.now += 61
    assert secret_credentials(cache, "llm", ref(), None).bearer_token == "s3cret"
    fake.errors[("llm", "prom")] = SecretReadError("403 Forbidden: grant get", lasting=True)
    clock.now += 11
    with pytest.raises(CredentialsError, match="bearerTokenSecretRef: 403 Forbidden: grant get"):
        secret_credentials(cache, "llm", ref(), None)


def test_retain_forgets_secrets_no_object_names(cache, fake):
    secret_credentials(cache, "llm", ref(), None)
    cache.retain([])
    secret_credentials(cache, "llm", ref(), None)
    assert len(fake.gets) == 2


def test_file_credentials_are_re_read_after_the_ttl(tmp_path, clock):
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("one\n")
    ca.write_bytes(CA)
    files = FileCredentials(str(token), str(ca), ttl_seconds=60, clock=clock)
    assert files.current() == Credentials("one", CA)
    token.write_text("two")
    assert files.current().bearer_token == "one"
    clock.now += 60
    assert files.current().bearer_token == "two"
    assert FileCredentials(clock=clock).current() == NO_CREDENTIALS


def test_an_unreadable_file_names_its_flag(tmp_path):
    with pytest.raises(CredentialsError, match=r"--prometheus-ca-file: cannot read .*missing"):
        FileCredentials(None, str(tmp_path / "missing")).current()


class FakeReader:
    def __init__(self, url, *, bearer_token=None, ca_path=None):
        self.url, self.bearer_token, self.ca_path = url, bearer_token, ca_path
        self.ca = Path(ca_path).read_bytes() if ca_path else None
        self.reads: list[list[str]] = []

    def read(self, targets, now):
        self.reads.append([t.name for t in targets])
        every = RoleSignals(sample_time=now, ttft_seconds=NO_TRAFFIC, itl_seconds=NO_TRAFFIC)
        signals = {(t.namespace, t.name, r): every for t in targets for r in ("prefill", "decode")}
        return signals, ReadReport(queries=1)


def test_readers_are_per_url_and_credentials_and_their_ca_file_is_private():
    readers = PrometheusReaders(FakeReader)
    plain = readers.get("https://p:9091")
    assert readers.get("https://p:9091", NO_CREDENTIALS) is plain
    a = readers.get("https://p:9091", Credentials("a", CA))
    b = readers.get("https://p:9091", Credentials("b", CA))
    assert len({id(plain), id(a), id(b)}) == 3
    assert (a.bearer_token, b.bearer_token, a.ca) == ("a", "b", CA)
    mode = stat.S_IMODE(Path(a.ca_path).stat().st_mode)
    assert mode == 0o600
    readers.retain([("https://p:9091", Credentials("b", CA))])
    assert not Path(a.ca_path).exists() and Path(b.ca_path).exists()
    readers.close()
    assert readers.ca_paths() == [] and not Path(b.ca_path).exists()


def pdd(name: str, prometheus: dict | None, namespace: str = "llm") -> dict:
    body = copy.deepcopy(minimal())
    body["metadata"] = {"name": name, "namespace": namespace, "uid": name}
    if prometheus is not None:
        body["spec"]["scaling"] = {"prometheus": prometheus}
    return body


class World:
    """An autoscaler over an in-memory cache, with fake Secrets and fake readers."""

    def __init__(self, fake: FakeSecrets, clock: Clock, files: FileCredentials | None = None):
        self.cache = ClusterCache()
        self.built: list[FakeReader] = []
        self.clock = clock

        def factory(url, **kwargs):
            reader = FakeReader(url, **kwargs)
            self.built.append(reader)
            return reader

        self.autoscaler = Autoscaler(
            self.cache,
            lambda key: None,
            default_prometheus_url="https://default:9091",
            default_credentials=files,
            secrets=SecretCache(fake, clock=clock),
            readers=factory,
            clock=clock,
        )

    def close(self) -> None:
        self.autoscaler.source.close()

    def add(self, body: dict) -> None:
        self.cache.put_pdd(body)

    def metrics_condition(self, name: str):
        view = self.autoscaler.view_for(("llm", name))
        assert view is not None
        return next(c for c in view.conditions if c.type == "MetricsAvailable")


@pytest.fixture
def worlds():
    made: list[World] = []

    def make(*args) -> World:
        made.append(World(*args))
        return made[-1]

    yield make
    for world in made:  # no CA file left behind
        world.close()


def test_objects_sharing_a_secret_cost_one_get_per_ttl_not_one_per_object_and_cycle(
    fake, clock, worlds
):
    world = worlds(fake, clock)
    refs = {
        "url": "https://p:9091",
        "bearerTokenSecretRef": {"name": "prom", "key": "token"},
        "caSecretRef": {"name": "prom", "key": "ca.crt"},
    }
    for name in ("a", "b", "c"):
        world.add(pdd(name, refs))
    for _ in range(3):
        assert world.autoscaler.cycle() == 3
        clock.now += 30
    assert fake.gets == [("llm", "prom"), ("llm", "prom")]  # at t=0 and after 60 s
    (reader,) = world.built  # one reader, one grouped read per cycle
    assert reader.reads == [["a", "b", "c"]] * 3
    assert (reader.bearer_token, reader.ca) == ("s3cret", CA)
    assert world.metrics_condition("a").status is True


def test_same_url_with_other_credentials_gets_its_own_reader(fake, clock, worlds):
    fake.data[("llm", "other")] = {"token": b"other-token"}
    world = worlds(fake, clock)
    world.add(
        pdd(
            "a", {"url": "https://p:9091", "bearerTokenSecretRef": {"name": "prom", "key": "token"}}
        )
    )
    world.add(
        pdd(
            "b",
            {"url": "https://p:9091", "bearerTokenSecretRef": {"name": "other", "key": "token"}},
        )
    )
    world.add(pdd("c", {"url": "https://p:9091"}))
    world.autoscaler.cycle()
    tokens = {r.bearer_token: r.reads for r in world.built}
    assert tokens == {"s3cret": [["a"]], "other-token": [["b"]], None: [["c"]]}


def test_a_wrong_key_makes_only_that_objects_metrics_unavailable_and_says_how(fake, clock, worlds):
    world = worlds(fake, clock)
    world.add(
        pdd(
            "good",
            {"url": "https://p:9091", "bearerTokenSecretRef": {"name": "prom", "key": "token"}},
        )
    )
    world.add(
        pdd(
            "bad",
            {"url": "https://p:9091", "bearerTokenSecretRef": {"name": "prom", "key": "tokn"}},
        )
    )
    world.autoscaler.cycle()
    bad = world.metrics_condition("bad")
    assert bad.status is False
    assert "spec.scaling.prometheus.bearerTokenSecretRef: secret llm/prom has no key 'tokn'" in (
        bad.message
    )
    assert world.metrics_condition("good").status is True
    assert [r.reads for r in world.built] == [[["good"]]]
    decision = world.autoscaler.view_for(("llm", "bad")).last_decision
    assert decision["limitedBy"] == "metrics"


def test_the_operators_own_credentials_go_to_its_default_url_only(fake, clock, tmp_path, worlds):
    token = tmp_path / "token"
    token.write_text("operator-token")
    world = worlds(fake, clock, FileCredentials(str(token), None, clock=clock))
    world.add(pdd("default", None))
    world.add(pdd("own-url", {"url": "https://elsewhere:9091"}))
    world.autoscaler.cycle()
    sent = {r.url: r.bearer_token for r in world.built}
    assert sent == {"https://default:9091": "operator-token", "https://elsewhere:9091": None}


def test_replaced_credentials_and_deleted_objects_drop_their_reader_and_ca_file(
    fake, clock, worlds
):
    world = worlds(fake, clock)
    body = pdd(
        "a",
        {"url": "https://p:9091", "caSecretRef": {"name": "prom", "key": "ca.crt"}},
    )
    world.add(body)
    world.autoscaler.cycle()
    (first,) = world.built
    assert Path(first.ca_path).read_bytes() == CA
    fake.data[("llm", "prom")]["ca.crt"] = CA + b"# rotated\n"
    clock.now += 61
    world.autoscaler.cycle()
    assert not Path(first.ca_path).exists()
    assert Path(world.built[1].ca_path).exists()
    world.cache.put_pdd(body, deleted=True)
    world.add(pdd("other", None))
    clock.now += 61
    world.autoscaler.cycle()
    assert not Path(world.built[1].ca_path).exists()
    assert world.autoscaler.source.readers.ca_paths() == []


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("http://169.254.169.254/latest/meta-data/", True),  # AWS, Azure, GCP, ...
        ("http://[fe80::1]:9090", True),
        ("http://metadata.google.internal/computeMetadata/v1/", True),
        ("http://[fd00:ec2::254]/", True),
        ("http://100.100.100.200/", True),  # Alibaba Cloud
        ("http://prometheus-operated.monitoring:9090", False),
        ("https://10.0.0.5:9091", False),
        ("http://127.0.0.1:9090", False),
    ],
)
def test_a_spec_may_not_point_the_operator_at_a_metadata_service(url, refused):
    problem = spec_url_problem(url)
    assert (problem is not None) is refused
    if refused:
        assert problem.startswith("spec.scaling.prometheus.url: ")
        assert "--allow-link-local-prometheus" in problem
    assert spec_url_problem(url, allow_link_local=True) is None


def test_a_metadata_url_makes_metrics_unavailable_and_is_never_called(fake, clock, worlds):
    world = worlds(fake, clock)
    world.add(pdd("metadata", {"url": "http://169.254.169.254:80"}))
    world.add(pdd("fine", {"url": "https://p:9091"}))
    world.autoscaler.cycle()
    refused = world.metrics_condition("metadata")
    assert refused.status is False
    assert "link-local or cloud metadata address" in refused.message
    assert [r.url for r in world.built] == ["https://p:9091"]

"""Requests through a PDDeployment's endpoint: client -> real vllm-router -> prefill -> KV hand-off
-> decode -> client, on the local control plane.

The operator reconciles a PDDeployment whose pools and router name pd-mock-scheduler; the virtual
kubelet runs each engine pod as the engine simulator over HTTP and each router pod as the real
`vllm-router` binary, every one on its own loopback address, the router with a token of its own
ServiceAccount. The client reaches the router as kube-proxy would: a Ready pod behind the
endpoint Service's selector and port.
"""

import asyncio
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubetools import RunningOperator, create_pdd, get_pdd, patch_pdd, wait_for
from pd_tools.simcluster.pod_processes import service_urls
from pd_tools.simcluster.virtual import VirtualCluster
from pd_tools.workloads.http_load import TIMEOUT, LoadConfig, replay
from pd_tools.workloads.traces import Request
from servingcases import MODEL, NAME, pdd_body, serving_cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def operator(cluster, namespace) -> Iterator[RunningOperator]:
    running = RunningOperator(str(cluster.kubeconfig), namespaces=[namespace], workers=2).start()
    yield running
    running.stop()


@pytest.fixture
def virtual(api_client, namespace, tmp_path: Path) -> Iterator[VirtualCluster]:
    cluster = serving_cluster(api_client, namespace, tmp_path)
    with cluster:
        yield cluster
        client.CoreV1Api(api_client).delete_collection_namespaced_pod(
            namespace, grace_period_seconds=0
        )
    assert cluster.processes is not None and not cluster.processes.running


def ready_endpoint(api_client, namespace: str) -> str:
    """The endpoint's URL once the PDDeployment is Ready and its Service has a ready address."""

    def ready() -> str | None:
        status = get_pdd(api_client, namespace, NAME).get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        if conditions.get("Ready") != "True":
            return None
        urls = service_urls(api_client, namespace, NAME, "http")
        return urls[0] if urls else None

    url = wait_for(ready, timeout=90, what="the PDDeployment Ready with a routable endpoint")
    assert isinstance(url, str)
    return url


def requests(count: int, rate: float, input_tokens: int, output_tokens: int) -> list[Request]:
    return [
        Request(i / rate, input_tokens + i % 7, output_tokens + i % 5, hash_ids=(i % 4,))
        for i in range(count)
    ]


def metric_total(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.split("{", 1)[0].split(" ", 1)[0] == name
    )


TTFT, ITL = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"


def histogram_mean(urls: list[str], name: str) -> float:
    """The mean of an engine histogram over pods: its summed `_sum` over its summed `_count`."""
    total = sum(metric_total(u, f"{name}_sum") for u in urls)
    count = sum(metric_total(u, f"{name}_count") for u in urls)
    assert count > 0, f"no {name} observed on {urls}"
    return total / count


def pod_urls(api_client, namespace: str, role: str) -> list[str]:
    pods = client.CoreV1Api(api_client).list_namespaced_pod(
        namespace, label_selector=f"pdoperator.io/deployment={NAME},pdoperator.io/role={role}"
    )
    return [f"http://{p.status.pod_ip}:8000" for p in pods.items if p.status.pod_ip]


def test_a_sample_gets_a_router_with_its_own_identity_and_kubectl_shows_the_endpoint(
    api_client, namespace, operator, virtual
):
    create_pdd(api_client, namespace, pdd_body())
    url = ready_endpoint(api_client, namespace)
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    router = f"{NAME}-router"
    assert core.read_namespaced_service_account(router, namespace)
    assert rbac.read_namespaced_role(router, namespace).rules[0].verbs == ["list", "watch"]
    assert rbac.read_namespaced_role_binding(router, namespace).subjects[0].name == router
    assert client.PolicyV1Api(api_client).read_namespaced_pod_disruption_budget(router, namespace)
    assert core.read_namespaced_service(NAME, namespace).spec.selector == {
        "pdoperator.io/deployment": NAME,
        "pdoperator.io/role": "router",
    }
    status = get_pdd(api_client, namespace, NAME)["status"]
    assert status["endpoint"] == f"http://{NAME}.{namespace}.svc:8000"
    assert status["router"]["readyReplicas"] == 1
    assert url.startswith("http://127.")
    # `kubectl get pdd` prints the endpoint column from status.
    crd = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        "pddeployments.pdoperator.io"
    )
    columns = {c.name: c.json_path for c in crd.spec.versions[0].additional_printer_columns}
    assert columns["Endpoint"] == ".status.endpoint"


def test_requests_through_the_endpoint_complete_streaming_and_not(
    api_client, namespace, operator, virtual
):
    create_pdd(api_client, namespace, pdd_body())
    url = ready_endpoint(api_client, namespace)
    prefill, decode = (
        pod_urls(api_client, namespace, "prefill"),
        pod_urls(api_client, namespace, "decode"),
    )
    results = {}
    for stream in (True, False):
        config = LoadConfig(
            url=url, model=MODEL, stream=stream, max_in_flight=200, timeout_s=60, deadline_s=120
        )
        results[stream] = asyncio.run(replay(requests(100, 20.0, 300, 40), config))
        if stream:  # the engines have seen the streamed requests only
            engine_ttft = histogram_mean(prefill, TTFT) + histogram_mean(decode, TTFT)
            engine_itl = histogram_mean(decode, ITL)
    for stream, result in results.items():
        failed = [r for r in result.records if r.reason is not None]
        assert not failed, f"stream={stream}: {failed[:3]}"
        for record in result.records:
            assert record.tokens == record.output_tokens, record
    # What the client measured agrees with the engines' histograms: the client's time to first
    # token is the prefill engine's (queue + prefill) plus the decode engine's (KV transfer +
    # first step) plus the router's hops; its token gaps are the decode engine's.
    streamed = [r for r in results[True].records if r.ttft_s is not None]
    client_ttft = sum(r.ttft_s for r in streamed) / len(streamed)
    gaps = [gap for r in streamed for gap in r.itl_s]
    client_itl = sum(gaps) / len(gaps)
    assert abs(client_ttft - engine_ttft) <= 0.25 * engine_ttft + 0.015, (client_ttft, engine_ttft)
    assert abs(client_itl - engine_itl) <= 0.15 * engine_itl + 0.002, (client_itl, engine_itl)
    # Every request went through both roles: prefill computed the prompts, decode the tokens.
    prompts = sum(metric_total(u, "vllm:prompt_tokens_total") for u in prefill)
    assert prompts >= 2 * sum(300 + i % 7 for i in range(100))
    decoded = sum(metric_total(u, "vllm:generation_tokens_total") for u in decode)
    assert decoded >= 2 * sum(40 + i % 5 for i in range(100)) * 0.9


def test_new_prefill_pods_get_requests_soon_after_they_are_ready(
    api_client, namespace, operator, virtual
):
    # Round robin: a cache-aware router would rightly keep these prompts where they started.
    create_pdd(api_client, namespace, pdd_body(prefill=1, policy="RoundRobin"))
    url = ready_endpoint(api_client, namespace)
    patch_pdd(
        api_client, namespace, NAME, {"spec": {"prefill": pdd_body(prefill=3)["spec"]["prefill"]}}
    )
    wait_for(
        lambda: (
            len(pod_urls(api_client, namespace, "prefill")) == 3
            and get_pdd(api_client, namespace, NAME)["status"]["pools"][0]["readyReplicas"] == 3
        ),
        timeout=60,
        what="three Ready prefill replicas",
    )
    config = LoadConfig(url=url, model=MODEL, stream=False, max_in_flight=64, deadline_s=60)
    result = asyncio.run(replay(requests(60, 5.0, 200, 4), config))  # 12 s of requests
    assert not [r for r in result.records if r.reason is not None]
    served = [
        metric_total(u, "vllm:prompt_tokens_total")
        for u in pod_urls(api_client, namespace, "prefill")
    ]
    assert all(tokens > 0 for tokens in served), served


def test_the_routers_service_account_cannot_reach_beyond_its_namespace_or_secrets(
    api_client, namespace, operator, virtual
):
    create_pdd(api_client, namespace, pdd_body())
    ready_endpoint(api_client, namespace)
    review = client.AuthorizationV1Api(api_client)
    user = f"system:serviceaccount:{namespace}:{NAME}-router"

    def allowed(verb: str, resource: str, where: str) -> bool:
        body = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=user,
                groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, resource=resource, namespace=where
                ),
            )
        )
        return bool(review.create_subject_access_review(body).status.allowed)

    assert allowed("list", "pods", namespace) and allowed("watch", "pods", namespace)
    assert not allowed("list", "pods", "kube-system")
    assert not allowed("get", "secrets", namespace)
    assert not allowed("list", "secrets", namespace)
    assert not allowed("create", "pods", namespace)


def test_router_disabled_creates_no_router_objects(api_client, namespace, operator, virtual):
    create_pdd(api_client, namespace, pdd_body(router=False))
    wait_for(
        lambda: get_pdd(api_client, namespace, NAME).get("status", {}).get("observedGeneration"),
        timeout=30,
        what="a first status",
    )
    core = client.CoreV1Api(api_client)
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_service(NAME, namespace)
    assert missing.value.status == 404
    assert (
        not client.AppsV1Api(api_client)
        .list_namespaced_deployment(namespace, label_selector="pdoperator.io/role=router")
        .items
    )
    assert "endpoint" not in get_pdd(api_client, namespace, NAME)["status"]


def delete_decode_mid_stream(api_client, namespace: str, timeout_s: float) -> Any:
    """20 streams of 2,000 tokens (20 s or more each) through the endpoint; the only decode pod
    is deleted 3 s in, while every stream still runs. The load's result."""
    url = ready_endpoint(api_client, namespace)
    (decode,) = (
        client.CoreV1Api(api_client)
        .list_namespaced_pod(
            namespace, label_selector=f"pdoperator.io/deployment={NAME},pdoperator.io/role=decode"
        )
        .items
    )
    config = LoadConfig(url=url, model=MODEL, max_in_flight=64, timeout_s=timeout_s, deadline_s=120)

    async def load_and_delete():
        running = asyncio.create_task(replay(requests(20, 10.0, 200, 2000), config))
        await asyncio.sleep(3.0)
        await asyncio.to_thread(
            client.CoreV1Api(api_client).delete_namespaced_pod, decode.metadata.name, namespace
        )
        return await running

    return asyncio.run(load_and_delete())


def test_a_decode_pod_deleted_mid_stream_ends_its_streams_with_an_error_never_a_hang(
    api_client, namespace, operator, virtual
):
    # drainSeconds 0: the engine is stopped (killed 5 s after SIGTERM) with every stream running.
    create_pdd(api_client, namespace, pdd_body())
    timeout_s = 60.0
    result = delete_decode_mid_stream(api_client, namespace, timeout_s)
    for record in result.records:
        assert record.end_s is not None and record.start_s is not None, record
        assert record.reason != TIMEOUT, record
        assert record.end_s - record.start_s < timeout_s, record
    cut = [r for r in result.records if r.reason is not None]
    assert cut, "deleting the only decode replica mid-stream must cut some streams"
    assert all(r.tokens < r.output_tokens for r in cut)


def test_a_decode_pod_deleted_mid_stream_with_a_drain_finishes_every_stream(
    api_client, namespace, operator, virtual
):
    """The engine's preStop hook (run by the kubelet, against the engine's own /metrics) holds
    its stop until the streams it runs are done."""
    create_pdd(api_client, namespace, pdd_body(drain_seconds=60))
    result = delete_decode_mid_stream(api_client, namespace, timeout_s=60.0)
    unfinished = [r for r in result.records if r.reason is not None or r.tokens < r.output_tokens]
    assert len(result.records) == 20 and not unfinished, unfinished[:3]


def test_a_ttft_breach_through_the_router_scales_prefill(
    api_client, namespace, operator, prometheus, tmp_path
):
    """The closed loop on the real request path: a load sent through the endpoint breaches TTFT
    on one prefill replica; Prometheus scrapes the engine processes; the operator adds prefill."""
    body = pdd_body()
    spec = body["spec"]
    spec["prefill"]["pools"][0]["replicas"] = {"min": 1, "max": 3}
    spec["slo"] = {
        "ttft": {"percentile": "P90", "targetMilliseconds": 1500},
        "itl": {"percentile": "P90", "targetMilliseconds": 100},
        "windowSeconds": 10,
    }
    spec["scaling"] = {
        "mode": "Active",
        "intervalSeconds": 5,
        "scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 2},
        "prometheus": {"url": prometheus.url},
    }
    sd_file = prometheus.targets_dir / f"{namespace}-serving.json"
    with serving_cluster(api_client, namespace, tmp_path, sd_file):
        create_pdd(api_client, namespace, body)
        url = ready_endpoint(api_client, namespace)
        # 6,000-token prompts at 8 per second: more than one 8-card S5000 replica prefills, so
        # requests queue and TTFT grows past the target.
        config = LoadConfig(url=url, model=MODEL, max_in_flight=400, timeout_s=60, deadline_s=70)
        load = threading.Thread(
            target=lambda: asyncio.run(replay(requests(400, 8.0, 6000, 8), config)), daemon=True
        )
        load.start()

        def grown() -> dict[str, Any] | None:
            status = get_pdd(api_client, namespace, NAME).get("status") or {}
            decision = status.get("lastDecision") or {}
            return status if decision.get("prefillReplicas", 1) >= 2 else None

        status = wait_for(grown, timeout=80, interval=1, what="the operator adding prefill")
        assert status["observed"]["ttftMilliseconds"] > 1500, status["observed"]
        load.join(timeout=80)
        client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
            "pdoperator.io", "v1alpha1", namespace, "pddeployments", NAME
        )
        client.CoreV1Api(api_client).delete_collection_namespaced_pod(
            namespace, grace_period_seconds=0
        )


def test_sglang_requests_go_through_sglang_router_and_its_bootstrap_hand_off(
    api_client, namespace, operator, virtual
):
    # sglang-router finds the prefill pods' KV bootstrap port by their annotation, sends each
    # request to a prefill and a decode replica at once, and the decode side waits for its room.
    create_pdd(api_client, namespace, pdd_body(engine="SGLang"))
    url = ready_endpoint(api_client, namespace)
    for stream in (True, False):
        config = LoadConfig(url=url, model=MODEL, stream=stream, max_in_flight=64, deadline_s=60)
        result = asyncio.run(replay(requests(40, 10.0, 300, 20), config))
        assert not [r for r in result.records if r.reason is not None], result.summary
        assert all(r.tokens == r.output_tokens for r in result.records)


def running_sequences(prometheus, namespace: str) -> dict[str, float]:
    """Each decode pod's running sequences, as Prometheus last scraped them."""
    params = urllib.parse.urlencode(
        {"query": f'vllm:num_requests_running{{namespace="{namespace}",role="decode"}}'}
    )
    with urllib.request.urlopen(f"{prometheus.url}/api/v1/query?{params}", timeout=10) as reply:
        result = json.load(reply)["data"]["result"]
    return {series["metric"]["pod"]: float(series["value"][1]) for series in result}


def streaming(running: dict[str, float], busy: tuple[str, ...], idle: str) -> bool:
    return all(running.get(name, 0) >= 4 for name in busy) and running.get(idle) == 0


def test_a_shrinking_decode_pool_removes_its_idle_replica_not_the_newest_busy_one(
    api_client, namespace, operator, prometheus, tmp_path
):
    """Which replica goes: decode shrinks from 3 to 2 while the newest replica (the one a
    ReplicaSet removes by default) and an older one stream long answers and the third is idle.
    The operator reads each pod's running sequences from Prometheus and marks the idle one with
    a low pod-deletion-cost just before it lowers the replicas: the idle replica goes and, with
    no drain (drainSeconds 0), not one stream is cut. The streams are sent to the two engines
    directly: the router's choice of decode replica cannot be steered."""
    body = pdd_body()
    decode = body["spec"]["decode"]["pools"][0]
    decode["replicas"] = {"min": 2, "max": 2}
    decode["accelerator"]["perReplica"] = 4  # three replicas on serving.yaml's two H200 nodes
    body["spec"]["scaling"] = {"mode": "Disabled", "prometheus": {"url": prometheus.url}}
    core = client.CoreV1Api(api_client)
    selector = f"pdoperator.io/deployment={NAME},pdoperator.io/role=decode"

    def decode_pods(count: int) -> dict[str, Any] | None:
        pods = [
            p
            for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.metadata.deletion_timestamp is None
        ]
        ready = [
            p
            for p in pods
            if p.status.pod_ip
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]
        return {p.metadata.name: p for p in ready} if len(ready) == len(pods) == count else None

    def decode_replicas(count: int) -> None:
        pools = get_pdd(api_client, namespace, NAME)["spec"]["decode"]["pools"]
        pools[0]["replicas"] = {"min": count, "max": count}
        patch_pdd(api_client, namespace, NAME, {"spec": {"decode": {"pools": pools}}})

    sd_file = prometheus.targets_dir / f"{namespace}-removal.json"
    with serving_cluster(api_client, namespace, tmp_path, sd_file):
        create_pdd(api_client, namespace, body)
        ready_endpoint(api_client, namespace)
        older = wait_for(lambda: decode_pods(2), timeout=60, what="two decode replicas Ready")
        decode_replicas(3)
        pods = wait_for(lambda: decode_pods(3), timeout=60, what="a third decode replica Ready")
        (newest,) = set(pods) - set(older)
        busy_older, idle = sorted(older)
        # 8 answers of 1,500 tokens on each busy replica: 30 s or more of streaming.
        results: dict[str, Any] = {}

        def stream_to(name: str) -> None:
            config = LoadConfig(
                url=f"http://{pods[name].status.pod_ip}:8000",
                model=MODEL,
                max_in_flight=16,
                timeout_s=90,
                deadline_s=120,
            )
            results[name] = asyncio.run(replay(requests(8, 8.0, 200, 1500), config))

        loads = [threading.Thread(target=stream_to, args=(n,)) for n in (newest, busy_older)]
        for load in loads:
            load.start()
        wait_for(
            lambda: streaming(running_sequences(prometheus, namespace), (newest, busy_older), idle),
            timeout=30,
            interval=0.5,
            what="Prometheus seeing both busy replicas stream and the third idle",
        )
        decode_replicas(2)
        kept = wait_for(lambda: decode_pods(2), timeout=60, what="decode back to two replicas")
        assert set(kept) == {newest, busy_older}, f"kept {sorted(kept)}; {idle} was the idle one"
        for load in loads:
            load.join(timeout=120)
        for name, result in results.items():
            cut = [r for r in result.records if r.reason is not None]
            assert not cut, f"streams on {name} cut: {cut[:3]}"
            assert len(result.records) == 8
        assert set(results) == {newest, busy_older}


def complete_once(api_client, namespace: str) -> str:
    """One short completion through the endpoint as kube-proxy would route it now: "ok", "gone"
    (the router pod chosen was removed between the lookup and the call: a client retries on a
    fresh connection), or the failure's text."""
    urls = service_urls(api_client, namespace, NAME, "http")
    if not urls:
        return "no ready router"
    body = {"model": MODEL, "prompt": "hello " * 20, "max_tokens": 4}
    request = urllib.request.Request(
        f"{urls[-1]}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            tokens = json.loads(answer.read())["usage"]["completion_tokens"]
            return "ok" if tokens == 4 else f"{tokens} tokens"
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}: {error.read().decode()[:200]}"
    except (ConnectionError, urllib.error.URLError):
        return "gone"


def test_an_image_change_rolls_both_roles_and_the_router_together_while_requests_complete(
    api_client, namespace, operator, virtual
):
    """The new revision starts beside the old one; the router switches to it once both roles
    are Ready; the old pods go. Requests sent all along are answered, none by a mix of
    revisions the router could not serve."""
    # The default drain: a replica the rollout removes finishes what the router sent it.
    create_pdd(api_client, namespace, pdd_body(drain_seconds=60))
    ready_endpoint(api_client, namespace)
    (first,) = (
        client.CoreV1Api(api_client)
        .list_namespaced_pod(
            namespace, label_selector=f"pdoperator.io/deployment={NAME},pdoperator.io/role=decode"
        )
        .items
    )
    old = first.metadata.labels["pdoperator.io/revision"]
    assert complete_once(api_client, namespace) == "ok"

    body = pdd_body()
    patch_pdd(api_client, namespace, NAME, {"spec": {"model": {
        **body["spec"]["model"], "image": body["spec"]["model"]["image"] + "-new"}}})  # fmt: skip
    answers: list[str] = []

    def rolled() -> dict[str, Any] | None:
        answers.append(complete_once(api_client, namespace))
        rollout = get_pdd(api_client, namespace, NAME)["status"].get("rollout") or {}
        done = rollout.get("revision") != old and rollout.get("state") == "Complete"
        return rollout if done else None

    rollout = wait_for(rolled, timeout=180, what="the rollout Complete on the new revision")
    new = rollout["revision"]
    assert rollout["previousRevision"] == old, rollout
    served = [a for a in answers if a != "gone"]
    print(f"\nrollout {old} -> {new}: {len(served)} requests answered, "
          f"{len(answers) - len(served)} sent to a router pod already gone")  # fmt: skip
    assert served and all(a == "ok" for a in served), [a for a in served if a != "ok"][:5]
    assert complete_once(api_client, namespace) == "ok"
    # Every engine and router pod is of the new revision; the surge Deployments are gone.
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    live = [
        p
        for p in core.list_namespaced_pod(
            namespace, label_selector=f"pdoperator.io/deployment={NAME}"
        ).items
        if not p.metadata.deletion_timestamp
    ]
    assert {p.metadata.labels.get("pdoperator.io/revision") for p in live} == {new}
    names = {d.metadata.name for d in apps.list_namespaced_deployment(namespace).items}
    assert not any(name.endswith(f"-{new}") or name.endswith(f"-{old}") for name in names), names
    router = apps.read_namespaced_deployment(f"{NAME}-router", namespace)
    command = " ".join(router.spec.template.spec.containers[0].command)
    assert f"pdoperator.io/revision={new}" in command and old not in command


def test_a_rollout_whose_new_pods_never_become_ready_stalls_and_the_old_revision_serves(
    api_client, namespace, operator, virtual
):
    create_pdd(api_client, namespace, pdd_body())
    ready_endpoint(api_client, namespace)
    body = pdd_body()
    # An engine argument the engine refuses: the new revision's engines exit at start.
    model = {**body["spec"]["model"], "args": ["--max-num-seqs", "many"]}
    patch_pdd(api_client, namespace, NAME, {"spec": {
        "model": model, "rollout": {"progressDeadlineSeconds": 10}}})  # fmt: skip

    def stalled() -> dict[str, Any] | None:
        status = get_pdd(api_client, namespace, NAME)["status"]
        found = {c["type"]: c for c in status.get("conditions") or []}.get("Stalled") or {}
        return status if found.get("status") == "True" else None

    status = wait_for(stalled, timeout=120, what="the rollout Stalled")
    condition = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert condition["reason"] == "RolloutStalled", condition
    assert status["rollout"]["state"] == "Stalled", status["rollout"]
    # The old revision still serves every request, through the router that never switched.
    for _ in range(5):
        assert complete_once(api_client, namespace) == "ok"
    router = client.AppsV1Api(api_client).read_namespaced_deployment(f"{NAME}-router", namespace)
    command = " ".join(router.spec.template.spec.containers[0].command)
    assert f"pdoperator.io/revision={status['rollout']['previousRevision']}" in command

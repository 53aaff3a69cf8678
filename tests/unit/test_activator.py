"""The activator's edge cases against a fake router (the real one: tests/integration/
test_activator.py): what it holds, what it passes on, when it gives up, what it counts."""

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from pd_operator.activator.proxy import (
    Activator,
    ActivatorConfig,
    ActivatorMetrics,
    metrics_app,
    proxy_app,
)

# vllm-router 0.1.17's answer with no workers, as measured.
NO_WORKERS = web.Response(status=503, text="No available workers: 0 prefill, 0 decode")


class FakeRouter:
    """Answers no-workers until `workers` is set, then streams a completion."""

    def __init__(self) -> None:
        self.workers = False
        self.calls = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        if request.path == "/busy":
            return web.Response(status=503, text="engine is full")
        if not self.workers:
            return NO_WORKERS
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for word in ("a", body["prompt"], "[DONE]"):
            await response.write(f"data: {word}\n\n".encode())
        await response.write_eof()
        return response


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def started(
    upstream: str, **config: float
) -> tuple[TestServer, TestServer, ActivatorMetrics]:
    metrics = ActivatorMetrics(CollectorRegistry())
    activator = Activator(ActivatorConfig(upstream=upstream, **config), metrics)
    proxy, scrape = TestServer(proxy_app(activator)), TestServer(metrics_app(metrics))
    await proxy.start_server()
    await scrape.start_server()
    return proxy, scrape, metrics


async def serving(fake: "FakeRouter") -> TestServer:
    """The fake router on a test server of its own, started."""
    router = TestServer(web.Application())
    router.app.router.add_route("*", "/{path:.*}", fake.handle)
    await router.start_server()
    return router


async def until(metrics: ActivatorMetrics, name: str, wanted: float) -> None:
    """Wait (2 s at most) for a series to read `wanted`; the test's assertion says if not."""
    for _ in range(100):
        if metrics.registry.get_sample_value(name) == wanted:
            return
        await asyncio.sleep(0.02)


def value(metrics: ActivatorMetrics, name: str) -> float:
    sample = metrics.registry.get_sample_value(name)
    assert sample is not None, name
    return sample


async def test_a_request_is_held_while_the_router_has_no_workers_and_streamed_once_it_has():
    fake = FakeRouter()
    router = await serving(fake)
    proxy, scrape, metrics = await started(str(router.make_url("")), retry_seconds=0.05)
    try:
        async with aiohttp.ClientSession() as session:
            call = asyncio.ensure_future(
                session.post(proxy.make_url("/v1/completions"), json={"prompt": "hi"})
            )
            await until(metrics, "pd_activator_pending_requests", 1)
            assert value(metrics, "pd_activator_pending_requests") == 1
            assert value(metrics, "pd_activator_in_flight_requests") == 1
            fake.workers = True
            answer = await asyncio.wait_for(call, 5)
            assert answer.status == 200
            assert answer.headers["Content-Type"] == "text/event-stream"
            assert await answer.text() == "data: a\n\ndata: hi\n\ndata: [DONE]\n\n"
            async with session.get(proxy.make_url("/health")) as health:
                assert health.status == 200
            async with session.get(scrape.make_url("/metrics")) as page:
                assert "pd_activator_hold_seconds_bucket" in await page.text()
        assert value(metrics, "pd_activator_pending_requests") == 0
        assert value(metrics, "pd_activator_in_flight_requests") == 0
        assert value(metrics, "pd_activator_requests_total") == 1  # not /health
        assert value(metrics, "pd_activator_hold_seconds_count") == 1
        assert value(metrics, "pd_activator_hold_seconds_sum") > 0
        assert fake.calls >= 2
    finally:
        for server in (proxy, scrape, router):
            await server.close()


async def test_another_503_is_passed_on_unchanged_and_not_held():
    fake = FakeRouter()
    router = await serving(fake)
    proxy, scrape, metrics = await started(str(router.make_url("")))
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(proxy.make_url("/busy"), data=b"x") as answer,
        ):
            assert (answer.status, await answer.text()) == (503, "engine is full")
        assert fake.calls == 1
        assert (
            metrics.registry.get_sample_value("pd_activator_hold_seconds_bucket", {"le": "0.0"})
            == 1
        )
    finally:
        for server in (proxy, scrape, router):
            await server.close()


async def test_a_router_that_never_listens_gets_a_clear_503_after_the_hold():
    proxy, scrape, metrics = await started(
        f"http://127.0.0.1:{free_port()}", hold_seconds=0.3, retry_seconds=0.05
    )
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(proxy.make_url("/v1/completions"), data=b"{}") as answer,
        ):
            assert answer.status == 503
            error = (await answer.json())["error"]
        assert "no backend became available in 0.3s" in error["message"]
        assert value(metrics, "pd_activator_pending_requests") == 0
        assert value(metrics, "pd_activator_in_flight_requests") == 0
    finally:
        for server in (proxy, scrape):
            await server.close()


async def test_no_more_than_max_held_requests_wait():
    proxy, scrape, metrics = await started(
        f"http://127.0.0.1:{free_port()}", hold_seconds=2, retry_seconds=0.05, max_held=1
    )
    try:
        async with aiohttp.ClientSession() as session:
            first = asyncio.ensure_future(session.post(proxy.make_url("/a"), data=b"1"))
            await until(metrics, "pd_activator_pending_requests", 1)
            async with session.post(proxy.make_url("/b"), data=b"2") as second:
                assert second.status == 503
                assert "already waiting" in (await second.json())["error"]["message"]
            first.cancel()
    finally:
        for server in (proxy, scrape):
            await server.close()


# Every no-worker answer measured from the pinned routers (docs/architecture.md, "The activator").
NO_WORKER_ANSWERS = [
    ("vllm completions", "No available workers: 0 prefill, 0 decode", {}),
    ("vllm one role up", "No available workers: 1 prefill, 0 decode", {}),
    ("vllm models", "No prefill servers available", {}),
    ("vllm health_generate", "No healthy worker pair available", {}),
    ("sglang models", "No models available", {}),
    (
        "sglang completions",
        '{"error":{"type":"Service Unavailable","code":"server_selection_failed","message":'
        '"No available servers: No prefill workers available."}}',
        {"x-smg-error-code": "server_selection_failed"},
    ),
]


@pytest.mark.parametrize(
    ("body", "headers"), [a[1:] for a in NO_WORKER_ANSWERS], ids=[a[0] for a in NO_WORKER_ANSWERS]
)
async def test_every_no_worker_answer_of_the_pinned_routers_is_held(body, headers):
    calls = []

    async def handle(_request: web.Request) -> web.Response:
        calls.append(1)
        if len(calls) == 1:
            return web.Response(status=503, text=body, headers=headers)
        return web.Response(text="served")

    router = TestServer(web.Application())
    router.app.router.add_route("*", "/{path:.*}", handle)
    await router.start_server()
    proxy, scrape, _ = await started(str(router.make_url("")), retry_seconds=0.01)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(proxy.make_url("/v1/completions"), data=b"{}") as answer,
        ):
            assert (answer.status, await answer.text()) == (200, "served")
        assert len(calls) == 2
    finally:
        for server in (proxy, scrape, router):
            await server.close()


async def test_a_held_request_whose_client_hangs_up_is_dropped_and_never_forwarded():
    fake = FakeRouter()
    router = await serving(fake)
    proxy, scrape, metrics = await started(str(router.make_url("")), retry_seconds=0.05)
    try:
        async with aiohttp.ClientSession() as session:
            call = asyncio.ensure_future(
                session.post(proxy.make_url("/v1/completions"), json={"prompt": "hi"})
            )
            await until(metrics, "pd_activator_pending_requests", 1)
            call.cancel()
        await until(metrics, "pd_activator_in_flight_requests", 0)
        assert value(metrics, "pd_activator_pending_requests") == 0
        assert value(metrics, "pd_activator_in_flight_requests") == 0
        calls = fake.calls
        fake.workers = True
        await asyncio.sleep(0.2)
        assert fake.calls == calls
        assert value(metrics, "pd_activator_hold_seconds_count") == 0
    finally:
        for server in (proxy, scrape, router):
            await server.close()

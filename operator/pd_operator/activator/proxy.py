"""A reverse proxy that forwards every request to the router and holds the ones it cannot serve
yet: the router has no workers (the pools are at zero or still starting) or is not listening.

Held requests are retried every `retry_seconds` until the router serves them or
`hold_seconds` pass; responses, streamed ones included, go through byte for byte.
"""

import asyncio
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# What the routers answer with no worker to send a request to, always a 503, measured with the
# binaries: vllm-router 0.1.17 "No available workers: 0 prefill, 0 decode" (completions, chat),
# "No prefill servers available" (/v1/models), "No healthy worker pair available"
# (/health_generate); sglang-router 0.3.2 a JSON error with the header
# `x-smg-error-code: server_selection_failed` (completions, chat; "No available servers: No
# prefill workers available ...") and "No models available" (/v1/models).
NO_WORKERS = re.compile(rb"^No (available|healthy|prefill|decode) (workers?|servers?)\b")
NO_MODELS = b"No models available"
NO_WORKERS_HEADER = ("x-smg-error-code", "server_selection_failed")
NO_WORKERS_STATUS = 503
# Bodies of that 503 are a line of text; a longer one is something else and passed on.
ERROR_BODY_BYTES = 4096
# Answered by the proxy or never held: probes and scrapes must not wait for engines.
OWN_PATHS = frozenset({"/health"})
UNCOUNTED_PATHS = frozenset({"/health", "/metrics"})
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
# 0 is its own bucket: the requests that were never held.
HOLD_BUCKETS = (0.0, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 180, 300, 600)


@dataclass(frozen=True)
class ActivatorConfig:
    """The activator's flags (`python -m pd_operator.activator --help`)."""

    upstream: str  # the router's base URL, e.g. http://10.0.0.7:8001
    hold_seconds: float = 300.0
    retry_seconds: float = 0.5
    connect_timeout_seconds: float = 2.0
    max_body_bytes: int = 64 * 1024 * 1024
    max_held: int = 1000


class ActivatorMetrics:
    """The series the operator reads (`pd_activator_*`), in a registry of their own."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "pd_activator_requests",
            "Requests received (not /health or /metrics)",
            registry=registry,
        )
        self.pending = Gauge(
            "pd_activator_pending_requests",
            "Requests held now, waiting for the router to have workers",
            registry=registry,
        )
        self.in_flight = Gauge(
            "pd_activator_in_flight_requests",
            "Requests received and not yet answered, held ones included",
            registry=registry,
        )
        self.hold = Histogram(
            "pd_activator_hold_seconds",
            "How long a request was held before it was forwarded (0: not held)",
            buckets=HOLD_BUCKETS,
            registry=registry,
        )


class Activator:
    """Forwards to `config.upstream`; holds what the router cannot serve yet."""

    def __init__(self, config: ActivatorConfig, metrics: ActivatorMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.held = 0
        self._session: aiohttp.ClientSession | None = None

    async def start(self, _app: web.Application) -> None:
        """Open the upstream session (an aiohttp on_startup hook)."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.config.connect_timeout_seconds
        )
        # Bytes pass unchanged: no decompression, no cookies kept between clients.
        self._session = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
        )

    async def stop(self, _app: web.Application) -> None:
        """Close the upstream session (an aiohttp on_cleanup hook)."""
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Every request on the public port."""
        if request.path in OWN_PATHS:
            return web.json_response({"status": "ok"})
        if request.path in UNCOUNTED_PATHS:
            return await self._forward(request, await request.read(), hold=False)
        self.metrics.requests.inc()
        self.metrics.in_flight.inc()
        try:
            return await self._forward(request, await request.read(), hold=True)
        finally:
            self.metrics.in_flight.dec()

    async def _forward(
        self, request: web.Request, body: bytes, *, hold: bool
    ) -> web.StreamResponse:
        url = self.config.upstream.rstrip("/") + request.rel_url.path_qs
        headers = _end_to_end(request.headers)
        started = time.monotonic()
        held = False
        try:
            while (answer := await self._try(request.method, url, headers, body, hold)) is None:
                if not hold:
                    return _unavailable("the router is not listening")
                if not held:
                    if self.held >= self.config.max_held:
                        return _unavailable(f"{self.held} requests are already waiting")
                    held = True
                    self.held += 1
                    self.metrics.pending.inc()
                if request.transport is None or request.transport.is_closing():
                    # The client hung up: never send the router work nobody will read.
                    raise ConnectionResetError("the client left while its request was held")
                left = started + self.config.hold_seconds - time.monotonic()
                if left <= 0:
                    return _unavailable(
                        f"no backend became available in {self.config.hold_seconds:g}s"
                    )
                await asyncio.sleep(min(self.config.retry_seconds, left))
        finally:
            if held:
                self.held -= 1
                self.metrics.pending.dec()
        if hold:
            self.metrics.hold.observe(time.monotonic() - started if held else 0.0)
        return await _stream(request, *answer)

    async def _try(
        self, method: str, url: str, headers: CIMultiDict[str], body: bytes, hold: bool
    ) -> tuple[aiohttp.ClientResponse, bytes] | None:
        """The router's answer and the part of its body read to judge it; None when it cannot
        serve yet (not listening, or no workers and the request may be held)."""
        assert self._session is not None
        try:
            upstream = await self._session.request(
                method, url, headers=headers, data=body, allow_redirects=False
            )
        except aiohttp.ClientConnectorError:
            return None  # the router is not listening (yet)
        if not hold or upstream.status != NO_WORKERS_STATUS:
            return upstream, b""
        head = await _head(upstream)
        name, code = NO_WORKERS_HEADER
        if NO_WORKERS.match(head) or head == NO_MODELS or upstream.headers.get(name) == code:
            upstream.release()
            return None
        return upstream, head


async def _stream(
    request: web.Request, upstream: aiohttp.ClientResponse, first: bytes
) -> web.StreamResponse:
    """The router's answer to the client as it comes (SSE included)."""
    try:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.update(_end_to_end(upstream.headers))
        await response.prepare(request)
        if first:
            await response.write(first)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
    finally:
        upstream.release()
    return response


async def _head(upstream: aiohttp.ClientResponse) -> bytes:
    """Up to ERROR_BODY_BYTES of the body, however the router cut it into chunks."""
    head = b""
    while len(head) < ERROR_BODY_BYTES:
        chunk = await upstream.content.read(ERROR_BODY_BYTES - len(head))
        if not chunk:
            break
        head += chunk
    return head


def _end_to_end(headers: Mapping[str, str]) -> CIMultiDict[str]:
    result: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in HOP_BY_HOP:
            result.add(name, value)
    return result


def _unavailable(why: str) -> web.Response:
    error = {"message": f"no model server available: {why}", "type": "ServiceUnavailable"}
    return web.json_response({"error": error}, status=503, headers={"Retry-After": "1"})


def proxy_app(activator: Activator) -> web.Application:
    """The public port: /health answered here, everything else forwarded."""
    app = web.Application(client_max_size=activator.config.max_body_bytes)
    app.on_startup.append(activator.start)
    app.on_cleanup.append(activator.stop)
    app.router.add_route("*", "/{path:.*}", activator.handle)
    return app


def metrics_app(metrics: ActivatorMetrics) -> web.Application:
    """The metrics port: /metrics in Prometheus' text format."""

    async def scrape(_request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    return app

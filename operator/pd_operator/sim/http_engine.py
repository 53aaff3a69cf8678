"""A simulated vLLM engine process for one pod: the OpenAI API over HTTP, timed by the model.

    PD_SIM_HARDWARE=h200 PD_SIM_MODEL=glm-4.5-fp8 python -m pd_operator.sim.http_engine \\
        vllm serve zai-org/GLM-4.6-FP8 --host 127.0.5.3 --port 8000 --tensor-parallel-size 8 \\
        --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'

It takes the engine's own command line verbatim (core/engine_args.py builds it), models the
flags that change what a client or router sees and ignores the rest; what a real engine has no
flag for comes from `PD_SIM_*` variables. `sim/live_engine.py` times the requests and
`sim/vllm_api.py` speaks the protocol; this module is the command line, the aiohttp server and
/metrics. The unmodified `vllm-router --vllm-pd-disaggregation` drives a prefill engine
(`kv_producer`) and a decode engine (`kv_consumer`) of it: docs/engine-simulator.md, "Serving
over HTTP".
"""

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from aiohttp import web

from pd_operator.core.hardware import HARDWARE_PROFILES, MODEL_PROFILES, HardwareProfile
from pd_operator.core.perfmodel import kv_bytes_per_token
from pd_operator.sim.engine import (
    DEFAULT_MAX_BATCH_SEQUENCES,
    DEFAULT_MAX_BATCH_TOKENS,
    Histogram,
    ReplicaSpec,
)
from pd_operator.sim.live_engine import LiveEngine, LiveRequest, OverloadedError, State
from pd_operator.sim.metrics import CONTENT_TYPE, VLLM
from pd_operator.sim.vllm_api import (
    DEFAULT_BLOCK_TOKENS,
    MOONCAKE,
    NIXL,
    Endpoint,
    GenerationRequest,
    KVEndpoint,
    RequestError,
    error_body,
    parse_request,
    remote_prefill_usable,
    response_body,
    stream_frames,
    wants_remote_decode,
)

log = logging.getLogger(__name__)

ENV_PREFIX = "PD_SIM_"
ENV_VARIABLES = {
    "PD_SIM_HARDWARE": "the card's hardware profile (required)",
    "PD_SIM_MODEL": "the model's profile (required)",
    "PD_SIM_LOAD_SECONDS": "model-load time before /health turns 200 (default: the perf model's)",
    "PD_SIM_TIME_SCALE": "wall seconds per model second (default 1; 0.05 runs 20x faster)",
    "PD_SIM_MAX_WAITING": "requests held beyond the running ones before a 503 (default: "
    "--max-num-seqs)",
    "PD_SIM_DRAIN_SECONDS": "after SIGTERM, how long in-flight requests may finish (default 30)",
}
# Kubernetes' default terminationGracePeriodSeconds: a pod gets no longer to drain.
DEFAULT_DRAIN_SECONDS = 30.0
# vLLM's --kv-cache-dtype choices and their element size; "auto" keeps the model profile's.
_KV_DTYPE_BYTES = {
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "bfloat16": 2,
    "float16": 2,
}
_KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
# vLLM's defaults for the side channel a decode engine pulls the KV cache through (vllm/envs.py).
_NIXL_HOST_DEFAULT, _NIXL_PORT_DEFAULT, _MOONCAKE_PORT_DEFAULT = "localhost", 5600, 8998
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


class ConfigError(Exception):
    """A command line or variable the simulator cannot run with; the message says the fix."""


@dataclass(frozen=True)
class EngineConfig:
    """What one simulated engine serves, from its command line and `PD_SIM_*` variables."""

    served_names: tuple[str, ...]
    host: str
    port: int
    hardware: HardwareProfile
    spec: ReplicaSpec
    kv_bytes_per_token: int
    max_model_len: int
    kv_connector: str | None
    kv_role: str | None  # None: no connector, a whole engine
    kv_endpoint: KVEndpoint
    load_seconds: float  # model seconds
    time_scale: float
    max_waiting: int
    drain_seconds: float
    ignored_args: tuple[str, ...] = ()

    @property
    def role(self) -> str:
        return {"kv_producer": "prefill", "kv_consumer": "decode"}.get(self.kv_role or "", "both")

    @property
    def hands_off_kv(self) -> bool:
        """Keeps a prompt's KV cache for a decode engine when the request asks for it."""
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def pulls_kv(self) -> bool:
        """Pulls a prompt's KV cache from the prefill engine named in the request."""
        return self.kv_role in ("kv_consumer", "kv_both")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (usage: {self.format_usage().strip()})")


def _vllm_parser() -> _Parser:
    parser = _Parser(prog="vllm serve", add_help=False, allow_abbrev=False)
    parser.add_argument("model_arg", nargs="?", metavar="MODEL")
    parser.add_argument("--model")
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_BATCH_SEQUENCES)
    parser.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_BATCH_TOKENS)
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_TOKENS)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--kv-transfer-config")
    return parser


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")
    return value


def _env_float(env: Mapping[str, str], name: str, default: float, *, positive: bool) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (value > 0 if positive else value >= 0):  # also refuses NaN
        bound = "positive" if positive else "zero or more"
        raise ConfigError(f"{name}={raw!r}: must be a number, {bound}")
    return value


def _env_choice(env: Mapping[str, str], name: str, choices: Mapping[str, Any]) -> str:
    raw = env.get(name)
    if raw is None or raw not in choices:
        given = "is not set" if raw is None else f"={raw!r} is not a profile"
        raise ConfigError(f"{name} {given}: set it to one of {', '.join(sorted(choices))}")
    return raw


def _kv_transfer(raw: str | None) -> tuple[str | None, str | None, str | None]:
    """(connector, role, engine_id) from --kv-transfer-config."""
    if raw is None:
        return None, None, None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ConfigError(f"--kv-transfer-config is not JSON ({error}): {raw!r}") from None
    if not isinstance(config, dict) or not isinstance(config.get("kv_connector"), str):
        raise ConfigError('--kv-transfer-config needs {"kv_connector": NAME, "kv_role": ROLE}')
    role = config.get("kv_role")
    if role not in _KV_ROLES:
        raise ConfigError(f"--kv-transfer-config kv_role must be one of {', '.join(_KV_ROLES)}")
    engine_id = config.get("engine_id")
    return config["kv_connector"], role, engine_id if isinstance(engine_id, str) else None


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> EngineConfig:
    """The engine's configuration from `vllm serve ...` and the `PD_SIM_*` variables."""
    if list(argv[:2]) != ["vllm", "serve"]:
        raise ConfigError(
            f"expected the engine's command line, `vllm serve MODEL [flags]`, got {list(argv[:2])}"
            " (the simulator speaks vLLM only)"
        )
    unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in ENV_VARIABLES)
    if unknown:
        raise ConfigError(f"unknown variable {unknown[0]}; known: {', '.join(ENV_VARIABLES)}")
    args, ignored = _vllm_parser().parse_known_args(list(argv[2:]))
    model_name = args.model or args.model_arg
    if not model_name:
        raise ConfigError("no model: give it as `vllm serve MODEL`")
    hardware = HARDWARE_PROFILES[_env_choice(env, "PD_SIM_HARDWARE", HARDWARE_PROFILES)]
    model = MODEL_PROFILES[_env_choice(env, "PD_SIM_MODEL", MODEL_PROFILES)]
    if args.kv_cache_dtype != "auto":
        if args.kv_cache_dtype not in _KV_DTYPE_BYTES:
            choices = ", ".join(["auto", *_KV_DTYPE_BYTES])
            raise ConfigError(f"--kv-cache-dtype {args.kv_cache_dtype!r}: one of {choices}")
        model = dataclasses.replace(model, kv_dtype_bytes=_KV_DTYPE_BYTES[args.kv_cache_dtype])
    cards = _positive("--tensor-parallel-size", args.tensor_parallel_size)
    max_num_seqs = _positive("--max-num-seqs", args.max_num_seqs)
    try:
        spec = ReplicaSpec.from_profiles(
            hardware,
            model,
            cards,
            max_batch_tokens=_positive("--max-num-batched-tokens", args.max_num_batched_tokens),
            max_batch_sequences=max_num_seqs,
        )
    except ValueError as error:
        raise ConfigError(
            f"{model.name} on {cards} x {hardware.name}: {error}; raise --tensor-parallel-size"
        ) from None
    max_model_len = args.max_model_len or model.max_context_tokens
    if max_model_len is None:
        raise ConfigError(f"{model.name} states no context length: give --max-model-len")
    _positive("--max-model-len", max_model_len)
    connector, role, engine_id = _kv_transfer(args.kv_transfer_config)
    if connector == MOONCAKE:
        kv_host = env.get("VLLM_HOST_IP") or args.host
        kv_port = int(env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT", _MOONCAKE_PORT_DEFAULT))
    else:
        kv_host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", _NIXL_HOST_DEFAULT)
        kv_port = int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", _NIXL_PORT_DEFAULT))
    time_scale = _env_float(env, "PD_SIM_TIME_SCALE", 1.0, positive=True)
    max_waiting = env.get("PD_SIM_MAX_WAITING", str(max_num_seqs))
    if not max_waiting.isdigit() or int(max_waiting) < 1:
        raise ConfigError(f"PD_SIM_MAX_WAITING={max_waiting!r}: must be a whole number, 1 or more")
    return EngineConfig(
        served_names=tuple(args.served_model_name or [model_name]),
        host=args.host,
        port=args.port,
        hardware=hardware,
        spec=spec,
        kv_bytes_per_token=kv_bytes_per_token(model),
        max_model_len=max_model_len,
        kv_connector=connector,
        kv_role=role,
        kv_endpoint=KVEndpoint(
            connector=connector or NIXL,
            engine_id=engine_id or str(uuid.uuid4()),
            host=kv_host,
            port=kv_port,
            tp_size=cards,
            block_tokens=_positive("--block-size", args.block_size),
        ),
        load_seconds=_env_float(env, "PD_SIM_LOAD_SECONDS", spec.load_seconds, positive=False),
        time_scale=time_scale,
        max_waiting=int(max_waiting),
        drain_seconds=_env_float(
            env, "PD_SIM_DRAIN_SECONDS", DEFAULT_DRAIN_SECONDS, positive=False
        ),
        ignored_args=tuple(ignored),
    )


def _error(status: int, message: str, error_type: str, **headers: str) -> web.Response:
    return web.json_response(
        error_body(message, error_type, status), status=status, headers=headers
    )


class EngineServer:
    """The HTTP face of one `LiveEngine`: its routes, readiness and /metrics."""

    def __init__(self, config: EngineConfig, engine: LiveEngine) -> None:
        self.config = config
        self.engine = engine
        self.draining = False
        clock: Callable[[], float] = asyncio.get_running_loop().time
        self._clock = clock
        self._ready_at = clock() + config.load_seconds * config.time_scale
        self._next_block = 0
        self._metrics_text = _MetricsText(config.served_names[0], config.time_scale)

    @property
    def ready(self) -> bool:
        return not self.draining and self._clock() >= self._ready_at

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    async def health(self, request: web.Request) -> web.Response:
        """200 once the model is loaded; 503 while loading and while draining."""
        return web.Response(status=200 if self.ready else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        text = self._metrics_text.render(self.engine)
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "vllm",
             "root": self.config.served_names[0], "parent": None,
             "max_model_len": self.config.max_model_len}
            for name in self.config.served_names
        ]  # fmt: skip
        return web.json_response({"object": "list", "data": data})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.COMPLETIONS)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.CHAT)

    async def _generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        if not self.ready:
            why = "shutting down" if self.draining else "loading the model"
            return _error(503, f"the engine is {why}", "ServiceUnavailableError")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON", "BadRequestError")
        config = self.config
        try:
            gen = parse_request(
                endpoint, body, served_names=config.served_names, max_model_len=config.max_model_len
            )
        except RequestError as error:
            return _error(error.status, str(error), error.error_type)
        params = gen.kv_transfer_params
        remote_kv = config.pulls_kv and remote_prefill_usable(config.kv_endpoint.connector, params)
        if params and params.get("do_remote_prefill") and not remote_kv:
            log.warning("kv_transfer_params %s are not usable here: computing the prompt", params)
        try:
            seq = self.engine.submit(gen.prompt_tokens, gen.max_tokens, remote_kv=remote_kv)
        except OverloadedError as error:
            # 429 + Retry-After: the request was fine, the engine is full for now. vllm-router
            # 0.1.17 hands a prefill engine's 429 to the client as it is (a 503 becomes a 500).
            return _error(429, str(error), "TooManyRequestsError", **{"Retry-After": "1"})
        # vLLM names a request after the client's X-Request-Id (the router's PD coordination id).
        base_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        request_id = f"{endpoint.id_prefix}-{base_id}"
        try:
            if gen.stream:
                return await self._stream(request, gen, seq, request_id)
            await seq.wait_for(gen.max_tokens)
            if seq.state is State.ABORTED:
                return _error(503, "the engine is shutting down", "ServiceUnavailableError")
            kv_params = None
            if config.hands_off_kv and wants_remote_decode(params):
                kv_params = self._transfer_params(gen, request_id, endpoint)
            body = response_body(gen, request_id, int(time.time()), seq.emitted, kv_params)
            return web.json_response(body)
        finally:
            self.engine.release(seq)

    def _transfer_params(
        self, gen: GenerationRequest, request_id: str, endpoint: Endpoint
    ) -> dict[str, Any]:
        endpoint_kv = self.config.kv_endpoint
        first = self._next_block
        blocks = endpoint_kv.blocks(gen.prompt_tokens)
        capacity = max(1, self.config.spec.kv_capacity_tokens // endpoint_kv.block_tokens)
        self._next_block = (first + blocks) % capacity
        # vLLM's engine-side id: the completions endpoint numbers the prompts of a request.
        engine_id = f"{request_id}-0" if endpoint is Endpoint.COMPLETIONS else request_id
        return endpoint_kv.transfer_params(engine_id, first, gen.prompt_tokens)

    async def _stream(
        self, request: web.Request, gen: GenerationRequest, seq: LiveRequest, request_id: str
    ) -> web.StreamResponse:
        frames = stream_frames(gen, request_id, int(time.time()))
        response = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await response.prepare(request)
            if frames.opening:
                await response.write(frames.opening)
            sent = 0
            while sent < gen.max_tokens:
                emitted = await seq.wait_for(sent + 1)
                if seq.state is State.ABORTED:
                    break  # shutting down: the stream ends without [DONE]
                # Every token written since the last write goes out in one write.
                if emitted < gen.max_tokens:
                    chunk = frames.token * (emitted - sent)
                else:
                    chunk = frames.token * (emitted - sent - 1) + frames.last_token + frames.closing
                await response.write(chunk)
                sent = emitted
            await response.write_eof()
        except ConnectionResetError:
            log.debug("client of %s went away", request_id)
        return response


# vLLM's prompt-token counter split by where the tokens' KV came from (vllm/v1/metrics).
_PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source"
_REQUEST_SUCCESS = "vllm:request_success"


class _MetricsText:
    """/metrics in vLLM's names, labels and bucket bounds (sim/metrics.py's VLLM dialect).

    Latencies are model seconds; counters (histogram buckets, sums and counts included) are
    scaled by the time scale, so rates per wall second come out per model second, as
    `EngineMetricsServer(counter_scale=...)` does for the discrete-event engine.
    """

    def __init__(self, model_name: str, counter_scale: float) -> None:
        labels = [("model_name", model_name), *VLLM.constant_labels]
        escaped = ((k, v.replace("\\", "\\\\").replace('"', '\\"')) for k, v in labels)
        self.labels = ",".join(f'{k}="{v}"' for k, v in escaped)
        self.scale = counter_scale

    def _counter(self, value: float) -> str:
        return str(value) if self.scale == 1.0 else repr(value * self.scale)

    def _family(self, name: str, kind: str, help_text: str, *samples: tuple[str, float]) -> str:
        """One metric family: `samples` are (extra labels, value) pairs."""
        lines = [f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"]
        sample = f"{name}_total" if kind == "counter" else name
        for extra, value in samples:
            text = self._counter(value) if kind == "counter" else repr(float(value))
            lines.append(f"{sample}{{{self.labels}{extra}}} {text}\n")
        return "".join(lines)

    def _histogram(self, name: str, help_text: str, histogram: Histogram) -> str:
        lines = [f"# HELP {name} {help_text}\n# TYPE {name} histogram\n"]
        bounds = [*(repr(b) for b in histogram.bounds), "+Inf"]
        for bound, count in zip(bounds, histogram.cumulative(), strict=True):
            lines.append(f'{name}_bucket{{{self.labels},le="{bound}"}} {self._counter(count)}\n')
        lines.append(f"{name}_sum{{{self.labels}}} {histogram.sum * self.scale!r}\n")
        lines.append(f"{name}_count{{{self.labels}}} {self._counter(histogram.count)}\n")
        return "".join(lines)

    def render(self, engine: LiveEngine) -> str:
        names, stats = VLLM.metrics, engine.stats
        assert names.waiting and names.running and names.kv_usage  # vLLM has them all
        assert names.prompt_tokens and names.generation_tokens and names.e2e_histogram
        parts = [
            self._family(names.waiting, "gauge", "Requests waiting.", ("", engine.waiting)),
            self._family(names.running, "gauge", "Requests running.", ("", engine.running)),
            self._family(names.kv_usage, "gauge", "KV-cache usage, 1 is full.",
                         ("", engine.kv_usage)),
            self._family(names.prompt_tokens, "counter", "Prompt tokens processed.",
                         ("", stats.prompt_tokens_total)),
            self._family(_PROMPT_BY_SOURCE, "counter", "Prompt tokens by where their KV came from.",
                         (',source="local_compute"', stats.prompt_tokens_local),
                         (',source="external_kv_transfer"', stats.prompt_tokens_transferred)),
            self._family(names.generation_tokens, "counter", "Tokens generated.",
                         ("", stats.generation_tokens_total)),
            self._family(_REQUEST_SUCCESS, "counter", "Requests finished.",
                         (',finished_reason="length"', stats.requests_total)),
            self._histogram(names.ttft_histogram, "Time to first token in seconds.", stats.ttft),
            self._histogram(names.itl_histogram, "Inter-token latency in seconds.", stats.itl),
            self._histogram(names.e2e_histogram, "End-to-end request latency.", stats.e2e),
        ]  # fmt: skip
        return "".join(parts)


async def start_engine(config: EngineConfig) -> tuple[EngineServer, web.AppRunner]:
    """Start the engine and serve it on `config.host:config.port` (in the running loop)."""
    engine = LiveEngine(
        config.spec,
        kv_bytes_per_token=config.kv_bytes_per_token,
        max_waiting=config.max_waiting,
        time_scale=config.time_scale,
    )
    engine.start()
    server = EngineServer(config, engine)
    # handler_cancellation: a client that hangs up cancels its handler, which frees the
    # sequence; cleanup() waits up to shutdown_timeout for in-flight requests, then cancels.
    runner = web.AppRunner(
        server.app(),
        handler_cancellation=True,
        shutdown_timeout=config.drain_seconds,
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        await engine.stop()
        raise
    return server, runner


async def stop_engine(server: EngineServer, runner: web.AppRunner) -> None:
    """Drain: refuse new requests, let in-flight ones finish (up to the drain time), stop."""
    server.draining = True
    await runner.cleanup()
    await server.engine.stop()


async def serve(config: EngineConfig) -> int:
    """Serve until SIGTERM or SIGINT, then drain; the process's exit code."""
    try:
        server, runner = await start_engine(config)
    except OSError as error:
        log.error("cannot listen on %s:%s: %s", config.host, config.port, error)
        return 1
    spec = config.spec
    log.info(
        "serving %s as %s (%s x %s, KV %d tokens, max %d running + %d waiting) on "
        "http://%s:%d; ready in %.1f s",
        config.served_names[0], config.role, config.kv_endpoint.tp_size,
        config.hardware.name, spec.kv_capacity_tokens, spec.max_batch_sequences,
        config.max_waiting, config.host, config.port, config.load_seconds * config.time_scale,
    )  # fmt: skip
    if config.ignored_args:
        log.info("not modelled, ignored: %s", " ".join(config.ignored_args))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("draining for up to %.0f s", config.drain_seconds)
    await stop_engine(server, runner)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pd_operator.sim.http_engine vllm serve MODEL ...`: the process's exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as error:
        print(f"pd-sim engine: {error}", file=sys.stderr)
        return 2
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())

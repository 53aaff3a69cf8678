"""A simulated vLLM or SGLang engine process for one pod: its API over HTTP, timed by the model.

    PD_SIM_HARDWARE=h200 PD_SIM_MODEL=glm-4.5-fp8 python -m pd_tools.enginesim.http_engine \\
        vllm serve zai-org/GLM-4.6-FP8 --host 127.0.5.3 --port 8000 --tensor-parallel-size 8 \\
        --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'
    PD_SIM_HARDWARE=h200 PD_SIM_MODEL=glm-4.5-fp8 python -m pd_tools.enginesim.http_engine \\
        python3 -m sglang.launch_server --model-path zai-org/GLM-4.6-FP8 --host 127.0.5.4 \\
        --tp-size 8 --enable-metrics --disaggregation-mode prefill

It takes the engine's own command line verbatim (core/engine_args.py builds it), models the
flags that change what a client or router sees and ignores the rest; what a real engine has no
flag for comes from `PD_SIM_*` variables. `live_engine.py` times the requests,
`vllm_api.py` and `sglang_api.py` speak the protocols; this module is the command line,
the aiohttp servers (an SGLang prefill engine also runs its bootstrap server) and /metrics. The
unmodified `vllm-router --vllm-pd-disaggregation` and `sglang_router.launch_router
--pd-disaggregation` drive a prefill and a decode engine of it: docs/engine-simulator.md,
"Serving over HTTP".
"""

import argparse
import asyncio
import dataclasses
import itertools
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

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from pd_operator.core.engine_args import SGLANG_BOOTSTRAP_PORT, engine_port
from pd_operator.core.hardware import (
    HARDWARE_PROFILES,
    MODEL_PROFILES,
    HardwareProfile,
    ModelProfile,
)
from pd_operator.core.perfmodel import kv_bytes_per_token
from pd_tools.enginesim.engine import (
    DEFAULT_MAX_BATCH_SEQUENCES,
    DEFAULT_MAX_BATCH_TOKENS,
    Histogram,
    LatencyBuckets,
    ReplicaSpec,
)
from pd_tools.enginesim.live_engine import LiveEngine, LiveRequest, OverloadedError, State
from pd_tools.enginesim.metrics import CONTENT_TYPE, SGLANG, VLLM, Dialect
from pd_tools.enginesim.sglang_api import (
    ROOM_PATH,
    ROOM_POLL_SECONDS,
    Bootstrap,
    RoomOutcome,
    RoomState,
    RoomTable,
    bootstrap_of,
    generate_body,
    generate_frame,
    model_info,
    openai_body,
    parse_generate,
    server_info,
)
from pd_tools.enginesim.sglang_api import error_body as sglang_error_body
from pd_tools.enginesim.vllm_api import (
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
    "PD_SIM_MAX_WAITING": "requests held beyond the running ones before a refusal (default: "
    "--max-num-seqs, or SGLang's --max-queued-requests, else --max-running-requests)",
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
# SGLang's --kv-cache-dtype choices and their element size.
_SGLANG_KV_DTYPE_BYTES = {"fp8_e4m3": 1, "fp8_e5m2": 1, "bf16": 2, "bfloat16": 2}
_KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
# SGLang's --disaggregation-mode as the KV role of a vLLM connector.
_SGLANG_MODES = {"null": None, "prefill": "kv_producer", "decode": "kv_consumer"}
# SGLang's own bounds on the hand-off (sglang/srt/environ.py), in model seconds here: how long a
# decode engine waits for a room's KV, and a prefill engine for its decode engine.
SGLANG_WAITING_TIMEOUT = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"
SGLANG_BOOTSTRAP_TIMEOUT = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
_SGLANG_TIMEOUT_DEFAULT = 300.0
_NO_MODEL = (
    "no model: give it as `vllm serve MODEL` or `python3 -m sglang.launch_server "
    "--model-path MODEL`"
)
# vLLM's defaults for the side channel a decode engine pulls the KV cache through (vllm/envs.py).
_NIXL_HOST_DEFAULT, _NIXL_PORT_DEFAULT, _MOONCAKE_PORT_DEFAULT = "localhost", 5600, 8998
# After the drain, how long a decode engine's wait on the bootstrap server may still end.
BOOTSTRAP_DRAIN_S = 1.0
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
    dialect: Dialect = VLLM  # the engine it plays: its API, metric names and default buckets
    # The latency histograms' bounds where the command line sets them (SGLang's --bucket-*).
    bounds: LatencyBuckets | None = None
    metrics_enabled: bool = True  # SGLang serves /metrics only with --enable-metrics
    # SGLang: the prefill engine's bootstrap server, the default of a request that names none.
    bootstrap_port: int = SGLANG_BOOTSTRAP_PORT
    kv_wait_seconds: float = _SGLANG_TIMEOUT_DEFAULT  # SGLang decode: a room's KV, at most
    room_ttl_seconds: float = _SGLANG_TIMEOUT_DEFAULT  # SGLang prefill: an uncollected room

    @property
    def sglang(self) -> bool:
        return self.dialect is SGLANG

    @property
    def buckets(self) -> LatencyBuckets:
        """The bounds its latency histograms export."""
        return self.bounds or self.dialect.buckets

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


def _sglang_parser() -> _Parser:
    parser = _Parser(prog="python3 -m sglang.launch_server", add_help=False, allow_abbrev=False)
    parser.add_argument("--model-path", "--model")
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=engine_port("SGLang"))
    parser.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    parser.add_argument("--context-length", type=int)
    parser.add_argument("--max-running-requests", type=int, default=DEFAULT_MAX_BATCH_SEQUENCES)
    parser.add_argument("--max-prefill-tokens", type=int, default=DEFAULT_MAX_BATCH_TOKENS)
    parser.add_argument("--max-queued-requests", type=int)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--enable-metrics", action="store_true")
    parser.add_argument("--disaggregation-mode", default="null", choices=list(_SGLANG_MODES))
    parser.add_argument("--disaggregation-transfer-backend", default="mooncake")
    parser.add_argument("--disaggregation-bootstrap-port", type=int, default=SGLANG_BOOTSTRAP_PORT)
    parser.add_argument("--bucket-time-to-first-token", type=float, nargs="+")
    parser.add_argument("--bucket-inter-token-latency", type=float, nargs="+")
    return parser


def _is_sglang(argv: Sequence[str]) -> bool:
    return (
        len(argv) >= 3
        and os.path.basename(argv[0]).startswith("python")
        and list(argv[1:3]) == ["-m", "sglang.launch_server"]
    )


def _profiles(
    env: Mapping[str, str], kv_dtype: str, dtype_bytes: Mapping[str, int]
) -> tuple[HardwareProfile, ModelProfile]:
    """The hardware and model profiles, the model's KV element size set by --kv-cache-dtype."""
    hardware = HARDWARE_PROFILES[_env_choice(env, "PD_SIM_HARDWARE", HARDWARE_PROFILES)]
    model = MODEL_PROFILES[_env_choice(env, "PD_SIM_MODEL", MODEL_PROFILES)]
    if kv_dtype != "auto":
        if kv_dtype not in dtype_bytes:
            choices = ", ".join(["auto", *dtype_bytes])
            raise ConfigError(f"--kv-cache-dtype {kv_dtype!r}: one of {choices}")
        model = dataclasses.replace(model, kv_dtype_bytes=dtype_bytes[kv_dtype])
    return hardware, model


def _replica_spec(
    hardware: HardwareProfile,
    model: ModelProfile,
    cards: int,
    *,
    max_batch_tokens: int,
    max_batch_sequences: int,
    cards_flag: str,
) -> ReplicaSpec:
    try:
        return ReplicaSpec.from_profiles(
            hardware,
            model,
            cards,
            max_batch_tokens=max_batch_tokens,
            max_batch_sequences=max_batch_sequences,
        )
    except ValueError as error:
        raise ConfigError(
            f"{model.name} on {cards} x {hardware.name}: {error}; raise {cards_flag}"
        ) from None


def _max_waiting(env: Mapping[str, str], default: int) -> int:
    max_waiting = env.get("PD_SIM_MAX_WAITING", str(default))
    if not max_waiting.isdigit() or int(max_waiting) < 1:
        raise ConfigError(f"PD_SIM_MAX_WAITING={max_waiting!r}: must be a whole number, 1 or more")
    return int(max_waiting)


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> EngineConfig:
    """The engine's configuration from its command line (`vllm serve ...` or `python3 -m
    sglang.launch_server ...`) and the `PD_SIM_*` variables."""
    if list(argv[:2]) != ["vllm", "serve"] and not _is_sglang(argv):
        raise ConfigError(
            "expected the engine's command line, `vllm serve MODEL [flags]` or `python3 -m "
            f"sglang.launch_server --model-path MODEL [flags]`, got {list(argv[:3])}"
        )
    unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in ENV_VARIABLES)
    if unknown:
        raise ConfigError(f"unknown variable {unknown[0]}; known: {', '.join(ENV_VARIABLES)}")
    if _is_sglang(argv):
        return _sglang_config(argv[3:], env)
    return _vllm_config(argv[2:], env)


def _vllm_config(argv: Sequence[str], env: Mapping[str, str]) -> EngineConfig:
    args, ignored = _vllm_parser().parse_known_args(list(argv))
    model_name = args.model or args.model_arg
    if not model_name:
        raise ConfigError(_NO_MODEL)
    hardware, model = _profiles(env, args.kv_cache_dtype, _KV_DTYPE_BYTES)
    cards = _positive("--tensor-parallel-size", args.tensor_parallel_size)
    max_num_seqs = _positive("--max-num-seqs", args.max_num_seqs)
    spec = _replica_spec(
        hardware,
        model,
        cards,
        max_batch_tokens=_positive("--max-num-batched-tokens", args.max_num_batched_tokens),
        max_batch_sequences=max_num_seqs,
        cards_flag="--tensor-parallel-size",
    )
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
        time_scale=_env_float(env, "PD_SIM_TIME_SCALE", 1.0, positive=True),
        max_waiting=_max_waiting(env, max_num_seqs),
        drain_seconds=_env_float(
            env, "PD_SIM_DRAIN_SECONDS", DEFAULT_DRAIN_SECONDS, positive=False
        ),
        ignored_args=tuple(ignored),
    )


def _sglang_config(argv: Sequence[str], env: Mapping[str, str]) -> EngineConfig:
    args, ignored = _sglang_parser().parse_known_args(list(argv))
    if not args.model_path:
        raise ConfigError(_NO_MODEL)
    hardware, model = _profiles(env, args.kv_cache_dtype, _SGLANG_KV_DTYPE_BYTES)
    cards = _positive("--tp-size", args.tp_size)
    max_running = _positive("--max-running-requests", args.max_running_requests)
    spec = _replica_spec(
        hardware,
        model,
        cards,
        max_batch_tokens=_positive("--max-prefill-tokens", args.max_prefill_tokens),
        max_batch_sequences=max_running,
        cards_flag="--tp-size",
    )
    context_length = args.context_length or model.max_context_tokens
    if context_length is None:
        raise ConfigError(f"{model.name} states no context length: give --context-length")
    _positive("--context-length", context_length)
    if args.max_queued_requests is None:
        max_waiting = _max_waiting(env, max_running)
    else:
        max_waiting = _positive("--max-queued-requests", args.max_queued_requests)
    role = _SGLANG_MODES[args.disaggregation_mode]
    backend = args.disaggregation_transfer_backend
    bootstrap_port = args.disaggregation_bootstrap_port
    if not 0 <= bootstrap_port < 65_536:  # 0: any free port, as with --port
        raise ConfigError(f"--disaggregation-bootstrap-port {bootstrap_port} is not a port")
    bounds = SGLANG.buckets.with_latency(
        _bounds("--bucket-time-to-first-token", args.bucket_time_to_first_token),
        _bounds("--bucket-inter-token-latency", args.bucket_inter_token_latency),
    )
    return EngineConfig(
        served_names=(args.served_model_name or args.model_path,),
        host=args.host,
        port=args.port,
        hardware=hardware,
        spec=spec,
        kv_bytes_per_token=kv_bytes_per_token(model),
        max_model_len=context_length,
        kv_connector=backend if role else None,
        kv_role=role,
        kv_endpoint=KVEndpoint(
            connector=backend,
            engine_id=str(uuid.uuid4()),
            host=args.host,
            port=bootstrap_port,
            tp_size=cards,
        ),
        load_seconds=_env_float(env, "PD_SIM_LOAD_SECONDS", spec.load_seconds, positive=False),
        time_scale=_env_float(env, "PD_SIM_TIME_SCALE", 1.0, positive=True),
        max_waiting=max_waiting,
        drain_seconds=_env_float(
            env, "PD_SIM_DRAIN_SECONDS", DEFAULT_DRAIN_SECONDS, positive=False
        ),
        ignored_args=tuple(ignored),
        dialect=SGLANG,
        bounds=bounds,
        metrics_enabled=args.enable_metrics,
        bootstrap_port=bootstrap_port,
        kv_wait_seconds=_env_float(
            env, SGLANG_WAITING_TIMEOUT, _SGLANG_TIMEOUT_DEFAULT, positive=True
        ),
        room_ttl_seconds=_env_float(
            env, SGLANG_BOOTSTRAP_TIMEOUT, _SGLANG_TIMEOUT_DEFAULT, positive=True
        ),
    )


def _bounds(flag: str, values: Sequence[float] | None) -> tuple[float, ...]:
    """A histogram's bounds from the command line; () when not given. Prometheus' client,
    which SGLang's histograms use, refuses bounds out of order, and a bound given twice would
    be two series of one name."""
    bounds = tuple(values or ())
    if any(b >= c for b, c in itertools.pairwise(bounds)):
        raise ConfigError(f"{flag} {' '.join(map(str, bounds))}: bounds must increase")
    return bounds


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
        self._metrics_text = _MetricsText(config.served_names[0], config.time_scale, config.dialect)
        # SGLang: a prefill engine's rooms, which decode engines wait on; the client they wait
        # with (opened with the engine's runner, one connection per waiting request).
        self.rooms: RoomTable | None = None
        if config.sglang and config.hands_off_kv:
            ttl_s = config.room_ttl_seconds * config.time_scale
            self.rooms = RoomTable(ttl_s=ttl_s, clock=clock)
        self.session: aiohttp.ClientSession | None = None
        self.bootstrap_runner: web.AppRunner | None = None

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
        if self.config.sglang:
            app.router.add_get("/health_generate", self.health)
            app.router.add_post("/generate", self.generate)
            # sglang-router 0.3.2 asks for the new names first, then the old ones.
            for path in ("/server_info", "/get_server_info"):
                app.router.add_get(path, self.server_info)
            for path in ("/model_info", "/get_model_info"):
                app.router.add_get(path, self.model_info)
        return app

    def bootstrap_app(self) -> web.Application:
        """An SGLang prefill engine's bootstrap server: where decode engines wait for rooms."""
        app = web.Application()
        app.router.add_get("/health", self.bootstrap_health)
        app.router.add_get(ROOM_PATH.replace("{room}", r"{room:\d+}"), self.room)
        return app

    def _error(self, status: int, message: str, error_type: str, **headers: str) -> web.Response:
        make_body = sglang_error_body if self.config.sglang else error_body
        return web.json_response(
            make_body(message, error_type, status), status=status, headers=headers
        )

    def _unready(self, room: int | None = None) -> web.Response:
        why = "shutting down" if self.draining else "loading the model"
        return self._refuse(503, f"the engine is {why}", "ServiceUnavailableError", room)

    async def health(self, request: web.Request) -> web.Response:
        """200 once the model is loaded; 503 while loading and while draining."""
        return web.Response(status=200 if self.ready else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.config.metrics_enabled:
            raise web.HTTPNotFound()  # SGLang without --enable-metrics
        text = self._metrics_text.render(self.engine)
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        owner = self.config.dialect.name
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": owner,
             "root": self.config.served_names[0], "parent": None,
             "max_model_len": self.config.max_model_len}
            for name in self.config.served_names
        ]  # fmt: skip
        return web.json_response({"object": "list", "data": data})

    async def server_info(self, request: web.Request) -> web.Response:
        config = self.config
        return web.json_response(
            server_info(
                served_name=config.served_names[0],
                host=config.host,
                port=config.port,
                tp_size=config.kv_endpoint.tp_size,
                context_length=config.max_model_len,
                max_running_requests=config.spec.max_batch_sequences,
                max_total_num_tokens=config.spec.kv_capacity_tokens,
                disaggregation_mode=config.role if config.kv_role else "null",
                transfer_backend=config.kv_endpoint.connector,
                bootstrap_port=config.bootstrap_port,
            )
        )

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(model_info())

    async def bootstrap_health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def room(self, request: web.Request) -> web.Response:
        """Wait (up to `timeout_s`, at most ROOM_POLL_SECONDS) for a room's outcome."""
        assert self.rooms is not None
        room = int(request.match_info["room"])
        try:
            timeout_s = min(float(request.query.get("timeout_s", ROOM_POLL_SECONDS)),
                            ROOM_POLL_SECONDS)  # fmt: skip
        except ValueError:
            timeout_s = float("nan")
        if not timeout_s >= 0:
            raise web.HTTPBadRequest(text="timeout_s must be a number of seconds, 0 or more")
        outcome = await self.rooms.wait(room, timeout_s)
        return web.json_response(outcome.body(room))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.COMPLETIONS)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.CHAT)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's native /generate."""
        return await self._sglang_generate(request, None)

    async def _generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        if self.config.sglang:
            return await self._sglang_generate(request, endpoint)
        if not self.ready:
            return self._unready()
        try:
            body = await request.json()
        except ValueError:
            return self._error(400, "the request body is not JSON", "BadRequestError")
        config = self.config
        try:
            gen = parse_request(
                endpoint, body, served_names=config.served_names, max_model_len=config.max_model_len
            )
        except RequestError as error:
            return self._error(error.status, str(error), error.error_type)
        params = gen.kv_transfer_params
        remote_kv = config.pulls_kv and remote_prefill_usable(config.kv_endpoint.connector, params)
        if params and params.get("do_remote_prefill") and not remote_kv:
            log.warning("kv_transfer_params %s are not usable here: computing the prompt", params)
        try:
            seq = self.engine.submit(gen.prompt_tokens, gen.max_tokens, remote_kv=remote_kv)
        except OverloadedError as error:
            # 429 + Retry-After: the request was fine, the engine is full for now. vllm-router
            # 0.1.17 hands a prefill engine's 429 to the client as it is (a 503 becomes a 500).
            return self._error(429, str(error), "TooManyRequestsError", **{"Retry-After": "1"})
        # vLLM names a request after the client's X-Request-Id (the router's PD coordination id).
        base_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        request_id = f"{endpoint.id_prefix}-{base_id}"
        try:
            if gen.stream:
                return await self._stream_openai(request, gen, seq, request_id)
            await seq.wait_for(gen.max_tokens)
            if seq.state is State.ABORTED:
                return self._error(503, "the engine is shutting down", "ServiceUnavailableError")
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

    def _refuse(
        self, status: int, message: str, error_type: str, room: int | None, **headers: str
    ) -> web.Response:
        """An error answer; a prefill engine also fails the request's room, so that its decode
        engine stops waiting at once."""
        if room is not None and self.rooms is not None:
            self.rooms.finish(room, RoomOutcome(RoomState.FAILED, status, message))
        return self._error(status, message, error_type, **headers)

    async def _sglang_generate(
        self, request: web.Request, endpoint: Endpoint | None
    ) -> web.StreamResponse:
        """SGLang's OpenAI endpoints and (`endpoint` None) /generate. A request with a room is
        one half of the PD hand-off: a prefill engine computes the prompt and one token, then
        marks the room ready; a decode engine waits for that, pulls the KV and generates."""
        try:
            body = await request.json()
        except ValueError:
            return self._error(400, "the request body is not JSON", "BadRequestError")
        config = self.config
        try:
            boot = bootstrap_of(body, config.bootstrap_port) if isinstance(body, dict) else None
        except RequestError as error:
            return self._error(error.status, str(error), error.error_type)
        room = boot.room if boot is not None and self.rooms is not None else None
        if not self.ready:
            return self._unready(room)
        names, context = config.served_names, config.max_model_len
        try:
            if endpoint is None:
                gen = parse_generate(body, served_names=names, max_model_len=context)
            else:
                gen = parse_request(endpoint, body, served_names=names, max_model_len=context)
        except RequestError as error:
            return self._refuse(error.status, str(error), error.error_type, room)
        if room is not None:
            gen = dataclasses.replace(gen, max_tokens=1)  # SGLang's prefill stops at one token
        remote = boot is not None and config.pulls_kv
        try:
            seq = self.engine.submit(
                gen.prompt_tokens, gen.max_tokens, remote_kv=remote, kv_ready=not remote
            )
        except OverloadedError as error:
            # 503, not vLLM's 429: sglang-router 0.3.2 passes a 503 on (and retries it), but
            # turns a 429 into a 500.
            return self._refuse(
                503, str(error), "ServiceUnavailableError", room, **{"Retry-After": "1"}
            )
        rid = uuid.uuid4().hex if endpoint is None else f"{endpoint.id_prefix}-{uuid.uuid4().hex}"
        try:
            if room is not None:
                try:
                    await seq.wait_for(1)
                finally:
                    self._finish_room(room, seq)
            elif boot is not None and remote:
                failure = await self._await_room(boot, seq)
                if failure is not None:
                    return failure
            if gen.stream:
                if endpoint is not None:
                    return await self._stream_openai(request, gen, seq, rid)
                return await self._stream(
                    request, seq, gen.max_tokens, b"", lambda _, n: generate_frame(gen, rid, n)
                )
            await seq.wait_for(gen.max_tokens)
            if seq.state is State.ABORTED:
                return self._error(503, "the engine is shutting down", "ServiceUnavailableError")
            if endpoint is None:
                return web.json_response(generate_body(gen, rid, seq.emitted))
            return web.json_response(openai_body(gen, rid, int(time.time()), seq.emitted))
        finally:
            self.engine.release(seq)

    def _finish_room(self, room: int, seq: LiveRequest) -> None:
        assert self.rooms is not None
        if seq.emitted >= 1:
            self.rooms.finish(room, RoomOutcome(RoomState.READY))
        else:
            why = "shutting down" if seq.state is State.ABORTED else "gone"
            outcome = RoomOutcome(RoomState.FAILED, 503, f"the prefill request is {why}")
            self.rooms.finish(room, outcome)

    async def _await_room(self, boot: Bootstrap, seq: LiveRequest) -> web.Response | None:
        """Wait for the prefill of the room, then start the KV transfer (None); or the error
        answer when it never comes. Bounded by SGLANG_DISAGGREGATION_WAITING_TIMEOUT, after
        which SGLang's decode fails the request with a 500."""
        assert self.session is not None
        bound_s = self.config.kv_wait_seconds * self.config.time_scale
        deadline = self._clock() + bound_s
        where = f"room {boot.room} of the prefill engine at {boot.host}:{boot.port}"
        # Every poll but the last waits ROOM_POLL_SECONDS: the count is bounded by the deadline.
        for _ in range(int(bound_s // ROOM_POLL_SECONDS) + 2):
            left = deadline - self._clock()
            if left <= 0 or seq.finished:
                break
            try:
                params = {"timeout_s": f"{min(left, ROOM_POLL_SECONDS):.3f}"}
                timeout = aiohttp.ClientTimeout(total=ROOM_POLL_SECONDS + 10)
                async with self.session.get(boot.room_url, params=params, timeout=timeout) as r:
                    outcome = RoomOutcome.parse(await r.json())
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                message = f"cannot reach the bootstrap server for {where}: {error}"
                return self._error(500, message, "InternalServerError")
            if outcome.state is RoomState.READY:
                self.engine.kv_ready(seq)
                return None
            if outcome.state is RoomState.FAILED:
                message = f"{where} failed: {outcome.message}"
                if outcome.status in (429, 503):
                    # A full or stopping prefill engine: a busy pair, which the router retries.
                    return self._error(503, message, "ServiceUnavailableError")
                return self._error(500, message, "InternalServerError")
        if seq.finished:
            return self._error(503, "the engine is shutting down", "ServiceUnavailableError")
        message = f"the KV cache of {where} did not come within {bound_s:g} s"
        return self._error(500, f"{message} ({SGLANG_WAITING_TIMEOUT})", "InternalServerError")

    async def _stream_openai(
        self, request: web.Request, gen: GenerationRequest, seq: LiveRequest, request_id: str
    ) -> web.StreamResponse:
        frames = stream_frames(gen, request_id, int(time.time()))

        def chunk(sent: int, emitted: int) -> bytes:
            if emitted < gen.max_tokens:
                return frames.token * (emitted - sent)
            return frames.token * (emitted - sent - 1) + frames.last_token + frames.closing

        return await self._stream(request, seq, gen.max_tokens, frames.opening, chunk)

    async def _stream(
        self,
        request: web.Request,
        seq: LiveRequest,
        total: int,
        opening: bytes,
        chunk: Callable[[int, int], bytes],
    ) -> web.StreamResponse:
        """An SSE answer: `opening`, then `chunk(sent, emitted)` each time tokens came (every
        token written since the last write goes out in one write); the last ends the stream."""
        response = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await response.prepare(request)
            if opening:
                await response.write(opening)
            sent = 0
            while sent < total:
                emitted = await seq.wait_for(sent + 1)
                if seq.state is State.ABORTED:
                    break  # shutting down: the stream ends without [DONE]
                await response.write(chunk(sent, emitted))
                sent = emitted
            await response.write_eof()
        except ConnectionResetError:
            log.debug("a client went away")
        return response


# vLLM's prompt-token counter split by where the tokens' KV came from (vllm/v1/metrics).
_PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source"
_REQUEST_SUCCESS = "vllm:request_success"
# SGLang's finished-request and prefix-cache counters (sglang/srt/metrics/collector.py).
_SGLANG_REQUESTS = "sglang:num_requests"
_SGLANG_CACHED = "sglang:cached_tokens"


class _MetricsText:
    """/metrics in vLLM's or SGLang's names, labels and bucket bounds (metrics.py's dialects).

    Latencies are model seconds; counters (histogram buckets, sums and counts included) are
    scaled by the time scale, so rates per wall second come out per model second, as
    `EngineMetricsServer(counter_scale=...)` does for the discrete-event engine.
    """

    def __init__(self, model_name: str, counter_scale: float, dialect: Dialect = VLLM) -> None:
        self.dialect = dialect
        labels = [("model_name", model_name), *dialect.constant_labels]
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
        names, stats = self.dialect.metrics, engine.stats
        assert names.waiting and names.running and names.kv_usage  # both engines have them all
        assert names.prompt_tokens and names.generation_tokens and names.e2e_histogram
        family = self._family
        parts = [
            family(names.waiting, "gauge", "Requests waiting.", ("", engine.waiting)),
            family(names.running, "gauge", "Requests running.", ("", engine.running)),
            family(names.kv_usage, "gauge", "KV-cache usage, 1 is full.", ("", engine.kv_usage)),
            family(
                names.prompt_tokens,
                "counter",
                "Prompt tokens processed.",
                ("", stats.prompt_tokens_total),
            ),
        ]
        generated = ("", stats.generation_tokens_total)
        if self.dialect is VLLM:
            parts += [
                family(
                    _PROMPT_BY_SOURCE,
                    "counter",
                    "Prompt tokens by where their KV came from.",
                    (',source="local_compute"', stats.prompt_tokens_local),
                    (',source="external_kv_transfer"', stats.prompt_tokens_transferred),
                ),
                family(names.generation_tokens, "counter", "Tokens generated.", generated),
                family(
                    _REQUEST_SUCCESS,
                    "counter",
                    "Requests finished.",
                    (',finished_reason="length"', stats.requests_total),
                ),
            ]
        else:
            parts += [
                family(names.generation_tokens, "counter", "Tokens generated.", generated),
                family(_SGLANG_CACHED, "counter", "Prompt tokens found cached.", ("", 0)),
                family(_SGLANG_REQUESTS, "counter", "Requests done.", ("", stats.requests_total)),
            ]
        parts += [
            self._histogram(names.ttft_histogram, "Time to first token in seconds.", stats.ttft),
            self._histogram(names.itl_histogram, "Inter-token latency in seconds.", stats.itl),
            self._histogram(names.e2e_histogram, "End-to-end request latency.", stats.e2e),
        ]
        return "".join(parts)


async def _listen(app: web.Application, host: str, port: int, drain_s: float) -> web.AppRunner:
    # handler_cancellation: a client that hangs up cancels its handler, which frees the
    # sequence; cleanup() waits up to shutdown_timeout for in-flight requests, then cancels.
    runner = web.AppRunner(
        app, handler_cancellation=True, shutdown_timeout=drain_s, access_log=None
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner


async def start_engine(config: EngineConfig) -> tuple[EngineServer, web.AppRunner]:
    """Start the engine and serve it on `config.host:config.port` (in the running loop); an
    SGLang prefill engine also serves its bootstrap server on `config.bootstrap_port`."""
    engine = LiveEngine(
        config.spec,
        kv_bytes_per_token=config.kv_bytes_per_token,
        max_waiting=config.max_waiting,
        time_scale=config.time_scale,
        buckets=config.buckets,
    )
    engine.start()
    server = EngineServer(config, engine)
    try:
        if server.rooms is not None:
            # Waits end when their rooms do, which the drain lets finish; the rest are cut.
            server.bootstrap_runner = await _listen(
                server.bootstrap_app(), config.host, config.bootstrap_port, BOOTSTRAP_DRAIN_S
            )
        runner = await _listen(server.app(), config.host, config.port, config.drain_seconds)
    except OSError:
        await _close(server)
        raise
    if config.sglang and config.pulls_kv:
        # One connection per request waiting for its room: the engine's bound bounds them.
        server.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    return server, runner


async def _close(server: EngineServer) -> None:
    if server.bootstrap_runner is not None:
        await server.bootstrap_runner.cleanup()
    if server.session is not None:
        await server.session.close()
    await server.engine.stop()


async def stop_engine(server: EngineServer, runner: web.AppRunner) -> None:
    """Drain: refuse new requests, let in-flight ones finish (up to the drain time), stop."""
    server.draining = True
    await runner.cleanup()
    await _close(server)


async def serve(config: EngineConfig) -> int:
    """Serve until SIGTERM or SIGINT, then drain; the process's exit code."""
    try:
        server, runner = await start_engine(config)
    except OSError as error:
        log.error("cannot listen on %s (port %s): %s", config.host, config.port, error)
        return 1
    spec = config.spec
    log.info(
        "serving %s as %s (%s x %s, KV %d tokens, max %d running + %d waiting) on "
        "http://%s:%d; ready in %.1f s",
        config.served_names[0], config.role, config.kv_endpoint.tp_size,
        config.hardware.name, spec.kv_capacity_tokens, spec.max_batch_sequences,
        config.max_waiting, config.host, config.port, config.load_seconds * config.time_scale,
    )  # fmt: skip
    if server.bootstrap_runner is not None:
        log.info("bootstrap server on http://%s:%d", config.host, config.bootstrap_port)
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


class _GrpcProbeFilter(logging.Filter):
    """sglang-router probes every worker for gRPC (an HTTP/2 preface on its HTTP port) before it
    settles on HTTP; aiohttp would log each probe as an error with a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, BadHttpMessage) and "PRI" in str(error))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pd_tools.enginesim.http_engine vllm serve MODEL ...` (or `python3 -m
    sglang.launch_server ...`): the process's exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.server").addFilter(_GrpcProbeFilter())
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as error:
        print(f"pd-sim engine: {error}", file=sys.stderr)
        return 2
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())

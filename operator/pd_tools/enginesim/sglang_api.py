"""What a simulated SGLang engine reads and writes on the wire: its API and the PD hand-off.

The OpenAI endpoints parse and answer as vLLM's do (vllm_api.py, shared); this module adds
what SGLang does its own way: the native `/generate`, `/get_server_info` and `/get_model_info`,
the flat error body, the bootstrap fields sglang-router injects into every request
(`bootstrap_host`, `bootstrap_port`, `bootstrap_room`), and the prefill engine's table of rooms
that a decode engine waits on through the prefill's bootstrap server. No I/O here.
docs/engine-simulator.md ("Serving over HTTP", "SGLang") lists the protocol and its sources.
"""

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pd_operator.core.engine_args import SGLANG_BOOTSTRAP_PORT
from pd_tools.enginesim.vllm_api import (
    FILLER_TOKEN,
    Endpoint,
    GenerationRequest,
    RequestError,
    count_tokens,
    response_body,
)

# SamplingParams' default max_new_tokens for the native /generate.
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128
# The simulator's own route on the prefill engine's bootstrap server (SGLang's serves /route
# and /health; its per-room "KV is ready" travels over ZMQ, which this replaces).
ROOM_PATH = "/pd-sim/rooms/{room}"
# The longest one wait request is held before it answers "pending" (the decode asks again).
ROOM_POLL_SECONDS = 30.0
# Rooms whose outcome no decode engine has collected yet, at most (the oldest are dropped).
MAX_ROOMS = 65_536


def error_body(message: str, error_type: str, status: int) -> dict[str, Any]:
    """SGLang's OpenAI ErrorResponse: flat, `{"object": "error", message, type, param, code}`."""
    return {"object": "error", "message": message, "type": error_type, "param": None,
            "code": status}  # fmt: skip


def openai_body(request: GenerationRequest, rid: str, created: int, tokens: int) -> dict[str, Any]:
    """A non-streaming OpenAI answer: vLLM's shape, without vLLM's `kv_transfer_params`."""
    body = response_body(request, rid, created, tokens, None)
    del body["kv_transfer_params"]
    return body


# --- the PD hand-off: bootstrap fields and rooms -----------------------------------------------


@dataclass(frozen=True)
class Bootstrap:
    """Where the prefill engine of this request listens for its decode engine, and the room."""

    host: str
    port: int
    room: int

    @property
    def room_url(self) -> str:
        return f"http://{self.host}:{self.port}{ROOM_PATH.format(room=self.room)}"


def _integer(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"`{key}` must be a whole number, 0 or more (one prompt a request)")
    return value


def bootstrap_of(
    body: Mapping[str, Any], default_port: int = SGLANG_BOOTSTRAP_PORT
) -> Bootstrap | None:
    """The bootstrap fields sglang-router injects; None when the request carries no room.

    A missing port is the engine's own --disaggregation-bootstrap-port, as SGLang's scheduler
    fills it (`--prefill URL` given without a port makes the router send null).
    """
    room = _integer(body, "bootstrap_room")
    if room is None:
        return None
    host = body.get("bootstrap_host")
    if not isinstance(host, str) or not host:
        raise RequestError("`bootstrap_host` must name the prefill engine's host")
    port = _integer(body, "bootstrap_port")
    port = default_port if port is None else port
    if not 0 < port < 65_536:
        raise RequestError(f"`bootstrap_port` {port} is not a port")
    return Bootstrap(host, port, room)


class RoomState(StrEnum):
    READY = "ready"  # the prefill engine is done: the KV can be pulled
    FAILED = "failed"  # the prefill engine refused or dropped the request: it never will be
    PENDING = "pending"  # nothing yet (the wait ran out; ask again)


@dataclass(frozen=True)
class RoomOutcome:
    """A room's state as the prefill engine answers it; `status` is its own answer's status."""

    state: RoomState
    status: int = 200
    message: str = ""

    def body(self, room: int) -> dict[str, Any]:
        """The wait request's JSON answer."""
        return {"room": room, "state": self.state.value, "status": self.status,
                "message": self.message}  # fmt: skip

    @classmethod
    def parse(cls, body: object) -> "RoomOutcome":
        """A wait request's answer; ValueError when it is not one."""
        if not isinstance(body, dict) or not isinstance(body.get("status"), int):
            raise ValueError(f"not a room answer: {body!r}"[:200])
        return cls(RoomState(str(body.get("state"))), body["status"], str(body.get("message", "")))


PENDING = RoomOutcome(RoomState.PENDING)


class RoomTable:
    """The prefill engine's rooms: which prompts' KV a decode engine can pull, or never will.

    An outcome waits for its decode engine up to `ttl_s` (SGLang's prefill gives up on a decode
    that never comes after SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT) and at most `capacity`
    outcomes are held, so a decode engine that never asks costs nothing for long. A READY
    outcome is handed out once: the decode engine that collects it pulls the KV.
    """

    def __init__(
        self, *, ttl_s: float, clock: Callable[[], float], capacity: int = MAX_ROOMS
    ) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._clock = clock
        self._outcomes: OrderedDict[int, tuple[float, RoomOutcome]] = OrderedDict()
        self._waiters: dict[int, list[asyncio.Future[RoomOutcome]]] = {}

    def __len__(self) -> int:
        return len(self._outcomes)

    @property
    def waiting(self) -> int:
        """Wait requests held now."""
        return sum(len(waiters) for waiters in self._waiters.values())

    def finish(self, room: int, outcome: RoomOutcome) -> None:
        """The prefill of `room` is over, done (READY) or not (FAILED)."""
        now = self._clock()
        waiters = self._waiters.pop(room, [])
        pending = [w for w in waiters if not w.done()]
        for waiter in pending:
            waiter.set_result(outcome)
        if not (pending and outcome.state is RoomState.READY):
            self._outcomes[room] = (now, outcome)
            self._outcomes.move_to_end(room)
        while self._outcomes:
            oldest, _ = next(iter(self._outcomes.values()))
            if len(self._outcomes) <= self.capacity and now - oldest <= self.ttl_s:
                break
            self._outcomes.popitem(last=False)

    async def wait(self, room: int, timeout_s: float) -> RoomOutcome:
        """The room's outcome, once there is one, or PENDING after `timeout_s`."""
        held = self._outcomes.get(room)
        if held is not None and self._clock() - held[0] <= self.ttl_s:
            if held[1].state is RoomState.READY:
                del self._outcomes[room]
            return held[1]
        waiter: asyncio.Future[RoomOutcome] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(room, []).append(waiter)
        try:
            return await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            return PENDING
        finally:
            waiters = self._waiters.get(room)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiters[room]


# --- the native API ----------------------------------------------------------------------------


def _generate_prompt_tokens(body: Mapping[str, Any]) -> int:
    # One prompt per request: text, token ids, or a one-element batch of either.
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list) and len(text) == 1:
        text = text[0]
    if isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], list):
        ids = ids[0]
    if isinstance(text, str) and ids is None:
        return count_tokens(text)
    if text is None and isinstance(ids, list) and all(isinstance(t, int) for t in ids):
        return len(ids)
    raise RequestError("give one of `text` (a string) or `input_ids` (one prompt a request)")


def parse_generate(
    body: object, *, served_names: Sequence[str], max_model_len: int
) -> GenerationRequest:
    """Validate a native /generate body; `RequestError` says what SGLang would answer."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    prompt_tokens = max(1, _generate_prompt_tokens(body))
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise RequestError("`sampling_params` must be an object")
    max_tokens = params.get("max_new_tokens", GENERATE_DEFAULT_MAX_NEW_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(f"max_new_tokens must be a whole number, 1 or more: {max_tokens!r}")
    if prompt_tokens + max_tokens > max_model_len:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of "
            f"{max_model_len} tokens. You requested a total of {prompt_tokens + max_tokens} "
            f"tokens: {prompt_tokens} tokens from the input messages and {max_tokens} tokens "
            "for the completion. Please reduce the number of tokens in the input messages or "
            "the completion to fit within the limit."
        )
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RequestError("`stream` must be a boolean")
    return GenerationRequest(
        endpoint=Endpoint.COMPLETIONS,
        model=served_names[0],
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=False,
        kv_transfer_params=None,
    )


def generate_body(request: GenerationRequest, rid: str, tokens: int) -> dict[str, Any]:
    """A native answer (or, streamed, its state so far) of `tokens` filler tokens."""
    done = tokens >= request.max_tokens
    return {
        "text": FILLER_TOKEN * tokens,
        "meta_info": {
            "id": rid,
            "finish_reason": {"type": "length", "length": tokens} if done else None,
            "prompt_tokens": request.prompt_tokens,
            "completion_tokens": tokens,
            "cached_tokens": 0,
        },
    }


def generate_frame(request: GenerationRequest, rid: str, tokens: int) -> bytes:
    """One SSE frame of a streamed /generate: the whole text so far, as SGLang streams it by
    default (no --incremental-streaming-output); [DONE] follows the last."""
    frame = b"data: " + json.dumps(generate_body(request, rid, tokens)).encode() + b"\n\n"
    return frame + (b"data: [DONE]\n\n" if tokens >= request.max_tokens else b"")


def server_info(
    *,
    served_name: str,
    host: str,
    port: int,
    tp_size: int,
    context_length: int,
    max_running_requests: int,
    max_total_num_tokens: int,
    disaggregation_mode: str,
    transfer_backend: str,
    bootstrap_port: int,
) -> dict[str, Any]:
    """/get_server_info: the server arguments a router reads. `model_path` and `tokenizer_path`
    are left out on purpose: sglang-router would load the tokenizer from them (from HuggingFace
    for a model id), and a simulated pod dials nothing but loopback; `served_model_name` still
    names the model."""
    return {
        "served_model_name": served_name,
        "host": host,
        "port": port,
        "tp_size": tp_size,
        "dp_size": 1,
        "context_length": context_length,
        "max_running_requests": max_running_requests,
        "max_total_num_tokens": max_total_num_tokens,
        "disaggregation_mode": disaggregation_mode,
        "disaggregation_transfer_backend": transfer_backend,
        "disaggregation_bootstrap_port": bootstrap_port,
        "enable_metrics": True,
        "version": "pd-sim",
    }


def model_info() -> dict[str, Any]:
    """/get_model_info, without `model_path` and `tokenizer_path` (see `server_info`)."""
    return {"is_generation": True, "preferred_sampling_params": None, "weight_version": "default"}

"""What a simulated vLLM engine reads and writes on the wire: the OpenAI API and the PD hand-off.

Pure: parses `/v1/completions` and `/v1/chat/completions` bodies into a `GenerationRequest`,
builds response bodies and SSE frames, and the `kv_transfer_params` a KV connector hands from the
prefill engine to the decode engine through the router. docs/engine-simulator.md ("Serving over
HTTP") lists the protocol and where in vLLM and vllm-router it was read.
"""

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# Every generated token is this text: the answer's length in tokens is its count.
FILLER_TOKEN = "tok "
# vLLM's default KV block (--block-size); remote_block_ids name blocks of this many tokens.
DEFAULT_BLOCK_TOKENS = 16
# vLLM's CompletionRequest default; chat requests default to the rest of the context instead.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

NIXL = "NixlConnector"
MOONCAKE = "MooncakeConnector"
# What each connector needs in the decode request to pull the KV cache instead of recomputing
# it (NixlConnectorScheduler / MooncakeConnectorScheduler.update_state_after_alloc). Other
# connectors are checked like NIXL.
_REMOTE_PREFILL_KEYS: dict[str, tuple[str, ...]] = {
    NIXL: (
        "remote_block_ids",
        "remote_engine_id",
        "remote_request_id",
        "remote_host",
        "remote_port",
    ),
    MOONCAKE: ("remote_host", "remote_port"),
}


class Endpoint(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"

    @property
    def id_prefix(self) -> str:
        return "cmpl" if self is Endpoint.COMPLETIONS else "chatcmpl"


class RequestError(Exception):
    """A request vLLM would refuse: the HTTP status and OpenAI error type it answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status

    @property
    def error_type(self) -> str:
        return "NotFoundError" if self.status == 404 else "BadRequestError"


def error_body(message: str, error_type: str, status: int) -> dict[str, Any]:
    """vLLM's ErrorResponse: `{"error": {message, type, param, code}}`."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": status}}


@dataclass(frozen=True)
class GenerationRequest:
    """What the engine needs from one OpenAI request."""

    endpoint: Endpoint
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    kv_transfer_params: Mapping[str, Any] | None


def count_tokens(text: str) -> int:
    """Prompt tokens of a text: its whitespace-separated words (no tokenizer is loaded)."""
    return len(text.split())


def _completion_prompt_tokens(prompt: object) -> int:
    # One prompt per request: text, token ids, or a one-element batch of either.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    raise RequestError("`prompt` must be a string or a list of token ids (one prompt a request)")


def _chat_prompt_tokens(messages: object) -> int:
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list")
    tokens = 0
    for message in messages:
        if not isinstance(message, dict):
            raise RequestError("every message must be an object")
        content = message.get("content")
        if isinstance(content, str):
            tokens += count_tokens(content)
        elif isinstance(content, list):
            tokens += sum(
                count_tokens(part["text"])
                for part in content
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
        elif content is not None:
            raise RequestError("message `content` must be a string or a list of parts")
    return tokens


def _optional_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"`{key}` must be an integer")
    return value


def parse_request(
    endpoint: Endpoint, body: object, *, served_names: Sequence[str], max_model_len: int
) -> GenerationRequest:
    """Validate a request body as vLLM would; `RequestError` says what vLLM would answer."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model") or served_names[0]
    if model not in served_names:
        raise RequestError(f"The model `{model}` does not exist.", status=404)
    if endpoint is Endpoint.COMPLETIONS:
        prompt_tokens = _completion_prompt_tokens(body.get("prompt"))
        max_tokens = _optional_int(body, "max_tokens")
        default = COMPLETIONS_DEFAULT_MAX_TOKENS
    else:
        prompt_tokens = _chat_prompt_tokens(body.get("messages"))
        max_tokens = _optional_int(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _optional_int(body, "max_tokens")
        default = max_model_len - prompt_tokens
    # A tokenizer would add at least a BOS token: an empty prompt still costs one.
    prompt_tokens = max(1, prompt_tokens)
    max_tokens = default if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise RequestError(f"max_tokens must be at least 1, got {max_tokens}.")
    if prompt_tokens + max_tokens > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion."
        )
    min_tokens = _optional_int(body, "min_tokens") or 0
    if not 0 <= min_tokens <= max_tokens:
        raise RequestError(f"min_tokens must lie in [0, max_tokens={max_tokens}], got {min_tokens}")
    n = _optional_int(body, "n")
    if n not in (None, 1):
        raise RequestError("the simulator serves n=1 only")
    stream = body.get("stream") or False
    options = body.get("stream_options")
    if not isinstance(stream, bool) or not (options is None or isinstance(options, dict)):
        raise RequestError("`stream` must be a boolean and `stream_options` an object")
    if options is not None and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.")
    params = body.get("kv_transfer_params")
    if not (params is None or isinstance(params, dict)):
        raise RequestError("`kv_transfer_params` must be an object")
    return GenerationRequest(
        endpoint=endpoint,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        kv_transfer_params=params,
    )


def wants_remote_decode(params: Mapping[str, Any] | None) -> bool:
    """The router asks the prefill engine to keep the KV cache for a decode engine."""
    return bool(params and params.get("do_remote_decode"))


def remote_prefill_usable(connector: str, params: Mapping[str, Any] | None) -> bool:
    """The decode request carries what `connector` needs to pull the prompt's KV cache; without
    it vLLM logs a warning and computes the prompt itself."""
    if not params or not params.get("do_remote_prefill"):
        return False
    keys = _REMOTE_PREFILL_KEYS.get(connector, _REMOTE_PREFILL_KEYS[NIXL])
    return all(params.get(key) not in (None, [], "") for key in keys)


@dataclass(frozen=True)
class KVEndpoint:
    """Where this engine's KV cache can be pulled from (its connector's side channel)."""

    connector: str
    engine_id: str
    host: str
    port: int
    tp_size: int
    block_tokens: int = DEFAULT_BLOCK_TOKENS

    def blocks(self, prompt_tokens: int) -> int:
        return math.ceil(prompt_tokens / self.block_tokens)

    def transfer_params(
        self, request_id: str, first_block: int, prompt_tokens: int
    ) -> dict[str, Any]:
        """The `kv_transfer_params` a prefill response carries (the connector's
        `request_finished`), which the router copies into the decode request."""
        params: dict[str, Any] = {"do_remote_prefill": True, "do_remote_decode": False}
        if self.connector == MOONCAKE:
            return params | {"remote_host": self.host, "remote_port": self.port}
        return params | {
            "remote_block_ids": list(range(first_block, first_block + self.blocks(prompt_tokens))),
            "remote_engine_id": self.engine_id,
            "remote_request_id": request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": self.tp_size,
        }


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def response_body(
    request: GenerationRequest,
    request_id: str,
    created: int,
    completion_tokens: int,
    kv_transfer_params: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A non-streaming answer of `completion_tokens` filler tokens, stopped by max_tokens."""
    text = FILLER_TOKEN * completion_tokens
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
    if request.endpoint is Endpoint.COMPLETIONS:
        choice |= {"text": text, "stop_reason": None, "prompt_logprobs": None}
        obj = "text_completion"
    else:
        choice |= {
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "stop_reason": None,
        }
        obj = "chat.completion"
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": request.model,
        "choices": [choice],
        "usage": usage(request.prompt_tokens, completion_tokens),
        "kv_transfer_params": dict(kv_transfer_params) if kv_transfer_params else None,
    }


@dataclass(frozen=True)
class StreamFrames:
    """The SSE frames of one streamed answer, encoded once: every token's frame is the same."""

    opening: bytes  # the chat role delta; empty for completions
    token: bytes
    last_token: bytes  # carries finish_reason "length"
    closing: bytes  # the usage chunk when asked for, then [DONE]


def stream_frames(request: GenerationRequest, request_id: str, created: int) -> StreamFrames:
    """SSE `data: {...}\\n\\n` frames in OpenAI's chunk shapes, as vLLM streams them."""
    chat = request.endpoint is Endpoint.CHAT
    head = {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": request.model,
    }

    def frame(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + _json(head | {"choices": choices} | extra) + b"\n\n"

    def token_choice(finish: str | None) -> dict[str, Any]:
        body: dict[str, Any] = (
            {"delta": {"content": FILLER_TOKEN}} if chat else {"text": FILLER_TOKEN}
        )
        return {"index": 0, **body, "logprobs": None, "finish_reason": finish, "stop_reason": None}

    opening = b""
    if chat:
        opening = frame(
            [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
              "finish_reason": None}]
        )  # fmt: skip
    closing = b"data: [DONE]\n\n"
    if request.include_usage:
        closing = frame([], usage=usage(request.prompt_tokens, request.max_tokens)) + closing
    return StreamFrames(
        opening, frame([token_choice(None)]), frame([token_choice("length")]), closing
    )

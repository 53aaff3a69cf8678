"""How an offline replay judges each request against the SLO.

Which requests the engines take at all (the context length), how fast each could be served
alone on an idle deployment (what makes it feasible), and each finished request's TTFT and
inter-token time as vLLM's disaggregated decode reports them, against the targets.
"""

import math
from collections.abc import Sequence

from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.hardware import HARDWARE_PROFILES, ModelProfile
from pd_operator.core.perfmodel import kv_transfer_seconds
from pd_operator.core.placement import replica_cards
from pd_tools.enginesim.engine import DEFAULT_LINK_BYTES_PER_SECOND, ReplicaSpec, RequestRecord
from pd_tools.replay.baselines import ROLES
from pd_tools.replay.cluster import accelerator_profile
from pd_tools.replay.results import RequestOutcome
from pd_tools.workloads.traces import MOONCAKE_BLOCK_TOKENS, Request, reused_prefix_tokens


def context_limit(spec: PDDeploymentSpec, model: ModelProfile) -> int | None:
    """The most tokens, prompt plus answer, a replica takes: the spec's `model.contextLength`
    (vLLM's --max-model-len), else the model's own; None when neither is known."""
    return spec.model.context_length or model.max_context_tokens


def admitted(
    requests: Sequence[Request], limit: int | None
) -> tuple[Sequence[Request], list[Request]]:
    """The requests the engines take, and those they refuse: vLLM answers 400 at once to a
    prompt that, with its answer, exceeds the context length; it never reaches a queue."""
    if limit is None:
        return requests, []
    taken: list[Request] = []
    refused: list[Request] = []
    for request in requests:
        fits = request.input_tokens + request.output_tokens <= limit
        (taken if fits else refused).append(request)
    return (requests, []) if not refused else (taken, refused)


def idle_latencies(
    spec: PDDeploymentSpec,
    requests: Sequence[Request],
    model: ModelProfile,
    *,
    link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> list[tuple[float, float]]:
    """Each request's TTFT and mean inter-token time (s) alone on an idle deployment.

    The prompt is a prefill batch of its own on the fastest prefill pool's replica, with every
    prefix block that an earlier request of the trace carried already cached (an unbounded
    cache shared by all replicas), then its KV moves to decode; the answer runs alone in a
    decode batch on the fastest decode pool's replica. The engine can only be slower, so a
    request slower than a target here misses it on any capacity, under any policy.
    """
    replicas = {
        role: [
            ReplicaSpec.from_profiles(
                HARDWARE_PROFILES[accelerator_profile(p)], model, replica_cards(p)
            )
            for p in spec.pools(role)
        ]
        for role in ROLES
    }
    out = []
    for request, cached in zip(requests, reused_prefix_tokens(requests, block_tokens), strict=True):
        n = request.input_tokens
        prefill_ms = min(r.prefill.batch_ms([n], [cached]) for r in replicas["prefill"])
        ttft, tpot = prefill_ms / 1000, math.nan
        if request.output_tokens > 1:  # a one-token answer is done at prefill, no KV moves
            ttft += kv_transfer_seconds(n, model, link_bytes_per_second)
            # Context at the first step is prompt + first token, one more each step.
            context = n + 1 + (request.output_tokens - 2) / 2
            tpot = (
                min(
                    r.decode.fixed_ms(1) + r.decode.b_ms_per_context_token * context
                    for r in replicas["decode"]
                )
                / 1000
            )
        out.append((ttft, tpot))
    return out


def feasibility(spec: PDDeploymentSpec, idle: Sequence[tuple[float, float]]) -> list[bool]:
    """Per request, whether its `idle_latencies` meet both targets: what a policy can serve."""
    ttft_target = spec.slo.ttft.target_milliseconds / 1000
    itl_target = spec.slo.itl.target_milliseconds / 1000
    return [
        ttft <= ttft_target + 1e-12 and (math.isnan(tpot) or tpot <= itl_target + 1e-12)
        for ttft, tpot in idle
    ]


def _latencies(record: RequestRecord) -> tuple[float, float]:
    """TTFT and mean inter-token time as vLLM's disaggregated decode reports them.

    The engine delivers the first token with the KV and lets the request wait for the decode
    step in progress before its first step, so that wait (up to one step, ~15 ms on an H200
    replica) would land in the first inter-token gap; a 2-token answer then shows one gap of
    up to two steps. vLLM's P/D decode instead samples the first token in the request's first
    step on the decode instance: the wait is part of TTFT and every gap is a whole step.
    """
    joined = record.decode_start_s
    if record.output_tokens < 2 or math.isnan(joined):
        return record.ttft_s, record.itl_mean_s
    return joined - record.arrival_s, (record.finish_s - joined) / (record.output_tokens - 1)


def request_outcome(
    spec: PDDeploymentSpec, request: Request, record: RequestRecord | None, feasible: bool
) -> RequestOutcome:
    """The request's outcome from its record (None: unfinished), judged against the targets."""
    ttft_target = spec.slo.ttft.target_milliseconds / 1000
    itl_target = spec.slo.itl.target_milliseconds / 1000
    if record is None:
        return RequestOutcome(
            request.arrival_s,
            request.input_tokens,
            request.output_tokens,
            math.nan,
            math.nan,
            False,
            False,
            feasible,
        )
    ttft, tpot = _latencies(record)
    return RequestOutcome(
        request.arrival_s,
        request.input_tokens,
        request.output_tokens,
        ttft,
        tpot,
        ttft <= ttft_target,
        math.isnan(tpot) or tpot <= itl_target,
        feasible,
    )


def meets_slo(spec: PDDeploymentSpec, request: Request, record: RequestRecord | None) -> bool:
    """Whether the request finished meeting both the TTFT and the ITL target."""
    outcome = request_outcome(spec, request, record, True)
    return outcome.ttft_ok and outcome.itl_ok

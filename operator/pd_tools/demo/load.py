"""The load the client sends: phases of a trace (or of synthetic prompts) at chosen rates."""

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pd_operator.core.hardware import GLM_45_FP8, MTT_S5000
from pd_operator.core.perfmodel import PrefillCoefficients
from pd_tools.demo.settings import ROOT, DemoOptions
from pd_tools.workloads.traces import ReplayOptions, Request, TokenLengths, read_trace

TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
SLICE = ROOT / "data" / "traces" / "mooncake_conversation_head300.jsonl"
# The decode step asks 1.5x what one H200 generates within the ITL target (one: ~13 ms, two:
# ~7 ms); its answers are lengthened, up to the trace's longest (2,000 tokens), to ask it.
DECODE_STEP_TOKENS_PER_S = 2400.0
LONGEST_ANSWER = 2000
# The decode step's prompts: the trace's requests with prompts up to this long (a third of them),
# so that prefill stays calm while decode is not; long answers keep streams for tens of seconds
# and a stream stays on its replica, so the step's answers must also stay short enough (~800
# tokens, ~10 s) for a new decode replica to take over within the phase.
SHORT_PROMPT_TOKENS = 4096
# Synthetic prompts when no trace is wanted: one S5000 prefills ~4.8 of them per second.
SYNTHETIC = TokenLengths(6000, 150, input_cv=0.25, output_cv=0.5)
SYNTHETIC_SHORT = TokenLengths(1700, 150, input_cv=0.25, output_cv=0.5)  # the trace's short ones
STRATUM_S = 5.0  # a phase's rate holds over each stretch this long
SINGLE_REPLICA_CARDS = 8  # the sample's perReplica on the S5000 pool


@dataclass(frozen=True)
class Phase:
    """A stretch of the load: its share of the run, its request rate as a multiple of what one
    S5000 replica prefills of its prompts, the generated tokens/s it asks (None: the load's own
    answers), and whether its prompts are the short ones."""

    name: str
    share: float
    prefill_load: float
    decode_tokens_per_s: float | None = None
    short_prompts: bool = False


# Calm; a decode step that keeps prefill as calm (30% of one S5000) and asks 1.5x of one H200;
# a prefill surge that two S5000 cannot serve (1.3x their capacity: a queue, TTFT past the
# target); calm again. Two, because the sample's prefill-to-decode ratio (at least 100%) grows
# prefill to two with decode. The decode step comes first: after a surge, the queue that
# prefill drains once it has grown reaches decode as one burst of streams, which breaches ITL
# by itself and would blur which phase scaled decode.
PHASES = (
    Phase("calm", 0.10, 0.3),
    Phase("decode step", 0.45, 0.3, DECODE_STEP_TOKENS_PER_S, short_prompts=True),
    Phase("prefill surge", 0.30, 2.6),
    Phase("calm", 0.15, 0.3),
)


@dataclass(frozen=True)
class PhaseLoad:
    """One phase as built: where it lies in the run and what it sends."""

    name: str
    start_s: float
    end_s: float
    rate_rps: float
    answer_tokens: float  # mean answer length
    lengthened: bool  # answers longer than in the load


@dataclass
class Load:
    """What the client sends: requests with arrivals in seconds from the load's start."""

    what: str
    source: str  # where the requests come from
    requests: list[Request]
    phases: list[PhaseLoad]
    skipped: int = 0  # trace requests longer than the model's context, left out


def prefill_capacity_rps(prompts: Sequence[int]) -> float:
    """Requests/s one 8-card S5000 replica prefills of these prompts, one at a time (most are
    longer than half a batch of 8,192 tokens): the performance model the engines run."""
    model = PrefillCoefficients.from_profiles(MTT_S5000, GLM_45_FP8, SINGLE_REPLICA_CARDS)
    seconds = sum(model.batch_ms([n]) for n in prompts) / 1000 / len(prompts)
    return 1 / seconds


def lengthen(requests: list[Request], tokens: float, context: int) -> tuple[list[Request], float]:
    """The requests with their answers scaled to add up to `tokens`, each at most
    LONGEST_ANSWER and within the context; and the scale."""

    def scaled(scale: float) -> list[int]:
        return [
            max(1, min(LONGEST_ANSWER, context - r.input_tokens, round(r.output_tokens * scale)))
            for r in requests
        ]

    low, high = 1.0, 64.0
    for _ in range(40):  # bisection: the capped total grows with the scale
        middle = (low + high) / 2
        low, high = (middle, high) if sum(scaled(middle)) < tokens else (low, middle)
    answers = scaled(high)
    return [replace(r, output_tokens=n) for r, n in zip(requests, answers, strict=True)], high


def _phase_bounds(duration_s: float) -> list[tuple[Phase, float, float]]:
    bounds, start = [], 0.0
    for phase in PHASES:
        end = start + phase.share * duration_s
        bounds.append((phase, start, end))
        start = end
    return bounds


def trace_load(
    path: Path, duration_s: float, context: int, *, name: str, where: str, seed: int = 1
) -> Load:
    """The trace end to end over the run (its timeline compressed, or stretched, to the run's
    length), each phase keeping as many of its requests as give the phase its rate: a seeded
    sample of them (of copies of them where the trace has too few), drawn per STRATUM_S of the
    run, so that the rate holds through the phase while the trace's own bursts stay. Requests
    longer than the context are left out."""
    fits = [r for r in read_trace(path) if r.input_tokens + r.output_tokens <= context]
    skipped = sum(1 for _ in read_trace(path)) - len(fits)
    if not fits:
        raise ValueError(f"{path}: no request fits the model's {context:,}-token context")
    compression = max(fits[-1].arrival_s, 1.0) / duration_s

    def takes(phase: Phase, request: Request) -> bool:
        short = not phase.short_prompts or request.input_tokens <= SHORT_PROMPT_TOKENS
        return short and request.input_tokens + request.output_tokens <= context

    draws = random.Random(seed)
    requests: list[Request] = []
    phases: list[PhaseLoad] = []
    for phase, start, end in _phase_bounds(duration_s):
        capacity = prefill_capacity_rps([r.input_tokens for r in fits if takes(phase, r)])
        count = max(1, round((end - start) / STRATUM_S))
        edges = [start + (end - start) * i / count for i in range(count + 1)]
        wanted = [
            round(phase.prefill_load * capacity * edges[i + 1])
            - round(phase.prefill_load * capacity * edges[i])
            for i in range(count)
        ]
        present = [
            sum(1 for r in fits if takes(phase, r) and low <= r.arrival_s / compression < high)
            for low, high in itertools.pairwise(edges)
        ]
        copies = max(math.ceil(w / p) for w, p in zip(wanted, present, strict=True) if p)
        options = ReplayOptions(
            start_s=start * compression,
            duration_s=(end - start) * compression,
            rate_scale=max(1, copies),
            time_compression=compression,
            seed=draws.randrange(1 << 30),
        )
        offered = [
            replace(r, arrival_s=start + r.arrival_s)
            for r in read_trace(path, options)
            if takes(phase, r)
        ]
        chosen: list[Request] = []
        for index, (low, high) in enumerate(itertools.pairwise(edges)):
            # What a stratum with too few requests could not take is spread over the rest.
            need = round((sum(wanted) - len(chosen)) / (count - index))
            stratum = [r for r in offered if low <= r.arrival_s < high]
            chosen += sorted(
                draws.sample(stratum, min(need, len(stratum))), key=lambda r: r.arrival_s
            )
        chosen, shape = _shaped(phase, chosen, (start, end), context)
        requests += chosen
        phases.append(shape)
    span = fits[-1].arrival_s
    what = f"{name}, its {span:,.0f} s played over {duration_s:,.0f} s"
    return Load(what, where, requests, phases, skipped)


def synthetic_load(duration_s: float, context: int, seed: int = 1) -> Load:
    """SYNTHETIC prompts (SYNTHETIC_SHORT for short-prompt phases) at each phase's rate: as many
    as the rate asks, at uniformly drawn times (Poisson arrivals given their number)."""
    draws = random.Random(seed)
    requests: list[Request] = []
    phases: list[PhaseLoad] = []
    for phase, start, end in _phase_bounds(duration_s):
        lengths = SYNTHETIC_SHORT if phase.short_prompts else SYNTHETIC
        capacity = prefill_capacity_rps([lengths.sample(draws)[0] for _ in range(1000)])
        times = sorted(
            draws.uniform(start, end)
            for _ in range(round(phase.prefill_load * capacity * (end - start)))
        )
        chosen = []
        for at in times:
            prompt, answer, _ = lengths.sample(draws)
            chosen.append(Request(at, prompt, min(answer, context - prompt)))
        chosen, shape = _shaped(phase, chosen, (start, end), context)
        requests += chosen
        phases.append(shape)
    what = f"synthetic {SYNTHETIC.input_mean:,.0f}-token prompts, Poisson arrivals"
    return Load(what, f"sim.workload.TokenLengths, seed {seed}", requests, phases)


def _shaped(
    phase: Phase, chosen: list[Request], span: tuple[float, float], context: int
) -> tuple[list[Request], PhaseLoad]:
    """A phase's requests, their answers lengthened when it asks for generated tokens."""
    scale = 1.0
    if phase.decode_tokens_per_s is not None and chosen:
        wanted = phase.decode_tokens_per_s * (span[1] - span[0])
        chosen, scale = lengthen(chosen, wanted, context)
    rate = len(chosen) / (span[1] - span[0])
    answers = sum(r.output_tokens for r in chosen) / max(len(chosen), 1)
    return chosen, PhaseLoad(phase.name, *span, rate, answers, scale > 1)


def build_load(options: DemoOptions, context: int) -> Load:
    """The requests the client sends, from the option `--workload`."""
    if options.load == "synthetic":
        return synthetic_load(options.duration_s, context)
    path = (
        TRACE if options.load == "trace" or (options.load == "auto" and TRACE.exists()) else SLICE
    )
    if path == TRACE:
        name, where = "Mooncake conversation trace", str(path.relative_to(ROOT.parent))
    else:
        name, where = "Mooncake conversation trace, first 300 requests", str(path.relative_to(ROOT))
    return trace_load(path, options.duration_s, context, name=name, where=where)


def describe(load: Load) -> list[str]:
    """The load's phases, one line each."""
    lines = []
    for p in load.phases:
        longer = " (lengthened)" if p.lengthened else ""
        lines.append(
            f"  {p.start_s:4.0f}-{p.end_s:3.0f} s  {p.name:<14}{p.rate_rps:5.1f} req/s, answers "
            f"{p.answer_tokens:5,.0f} tokens on average{longer}"
        )
    return lines


def phase_of(load: Load, t: float) -> str:
    """The name of the phase the load is in at `t`."""
    return next((p.name for p in load.phases if p.start_s <= t < p.end_s), "end")

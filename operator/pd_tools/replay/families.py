"""Workload families: scenarios drawn from a seed that cover the space a policy must hold in.

A scenario is a family (what the requests are: short chat, long reasoning answers, long
contexts, a mix of them), an arrival shape (steady, waves, on/off bursts, a compressed day, a
slow drift) around a mean rate with Gamma inter-arrival times, a prefix-reuse share, and a
deployment (a model profile on prefill and decode hardware profiles the simulator knows).
`draw_scenarios(seed, count)` draws them; a `Scenario` is plain data (`to_json`,
`from_json`) and `Scenario.requests()` replays it the same way from any machine: every random
draw comes from seeds the scenario holds.

Distributions, and why:

* arrivals: a Gamma renewal process in operational time (`workload.synthetic_requests`): CV 1
  is Poisson, above 1 the bursts ServeGen fits to real traffic (CV 1-3), below 1 a smoothed
  load such as a batch client's;
* lengths: lognormal (the shared traces' logs are close to normal: Azure's conversation trace
  has log-sigma 0.99 for prompts and 0.86 for answers, Mooncake's 1.2 and 1.4), truncated to
  the family's range and to the model's context, prompt plus answer, as vLLM refuses longer
  ones;
* prefix reuse: each request belongs to one of `PREFIX_GROUPS` shared prefixes (system
  prompts, documents, conversations) with Zipf popularity (exponent 1: a few dominate), and
  that prefix covers `prefix_reuse` of its prompt in expectation, in the simulator's 512-token
  blocks (`workload.MOONCAKE_BLOCK_TOKENS`), so caches warm, miss on new replicas and evict as
  in the engine, rather than a fixed hit share.
"""

import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from statistics import NormalDist
from typing import Any

from pd_operator.api.document import parse_pddeployment
from pd_operator.api.spec import PDDeploymentSpec, Role
from pd_operator.core.hardware import HARDWARE_PROFILES, MODEL_PROFILES, ModelProfile
from pd_operator.core.learning import seed_capacity
from pd_operator.core.resolved import resolve
from pd_tools.replay.example import example_document
from pd_tools.workloads.traces import (
    MOONCAKE_BLOCK_TOKENS,
    RateProfile,
    RateSegment,
    Request,
    TokenLengths,
    synthetic_requests,
)

# Shared prefixes per scenario, and how their popularity falls with rank (Zipf's exponent).
PREFIX_GROUPS = 16
PREFIX_ZIPF = 1.0
# Ids of a group's prefix blocks are `(group + 1) << GROUP_SHIFT | block`; a prompt's own
# blocks count up from UNIQUE_BLOCKS, above every group's.
GROUP_SHIFT = 24
UNIQUE_BLOCKS = 1 << 40
# Pool bounds a scenario's PDDeployment gets: its sizing need (at the peak rate, from the
# profiles) times HEADROOM plus SPARE, within [MIN_MAX_REPLICAS, MAX_MAX_REPLICAS], so that
# neither the oracle nor a policy is held back by the bound, as a user would set it.
HEADROOM = 4.0
SPARE = 2
MIN_MAX_REPLICAS = 8
MAX_MAX_REPLICAS = 64
# Rate-profile pieces of smooth shapes: at most this long, so a sine reads as a sine.
SMOOTH_STEP_S = 10.0

SHAPES = ("steady", "waves", "onoff", "diurnal", "drift")


@dataclass(frozen=True)
class Deployment:
    """A model profile served by a prefill pool and a decode pool of known hardware."""

    name: str
    model: str  # a key of core.hardware.MODEL_PROFILES
    model_name: str  # spec.model.name; its last path component names the model profile
    prefill: str  # a key of core.hardware.HARDWARE_PROFILES
    prefill_cards: int
    decode: str
    decode_cards: int

    @property
    def profile(self) -> ModelProfile:
        return MODEL_PROFILES[self.model]

    @property
    def context_tokens(self) -> int:
        """The most tokens, prompt plus answer, a replica takes."""
        return self.profile.max_context_tokens or 1 << 30


# Each is a deployment whose weights fit and whose decode meets a 20 ms ITL on its cards.
DEPLOYMENTS: dict[str, Deployment] = {
    d.name: d
    for d in (
        # The articles' topology: S5000 prefill, H200 decode.
        Deployment(
            "glm/s5000-h200", "glm-4.5-fp8", "zai-org/GLM-4.5-FP8", "mtt-s5000", 8, "h200", 8
        ),
        # One vendor on both sides.
        Deployment("glm/h200-h200", "glm-4.5-fp8", "zai-org/GLM-4.5-FP8", "h200", 8, "h200", 8),
        # A cheap, bandwidth-rich decode card.
        Deployment("glm/s5000-h20", "glm-4.5-fp8", "zai-org/GLM-4.5-FP8", "mtt-s5000", 8, "h20", 8),
        # 671B in FP8 needs 16 S5000 cards (80 GB each) to leave room for KV.
        Deployment(
            "dsv3/s5000x16-h200",
            "deepseek-v3-fp8",
            "deepseek-ai/DeepSeek-V3-FP8",
            "mtt-s5000",
            16,
            "h200",
            8,
        ),
        # 1T parameters: 16 cards on both sides.
        Deployment(
            "kimi/s5000x16-h200x16",
            "kimi-k2-fp8",
            "moonshotai/Kimi-K2-FP8",
            "mtt-s5000",
            16,
            "h200",
            16,
        ),
        # A dense BF16 model with a 4K context, on one NVIDIA generation older.
        Deployment(
            "llama70b/h100-h100", "llama-2-70b", "meta-llama/Llama-2-70B", "h100", 8, "h100", 8
        ),
    )
}


@dataclass(frozen=True)
class LogNormal:
    """Token counts ~ lognormal of `mean` (before truncation) and log-sigma `sigma`, truncated
    to [low, high] (drawn from the truncated distribution, no mass piles up at the bounds)."""

    mean: float
    sigma: float
    low: int
    high: int

    def __post_init__(self) -> None:
        if self.mean <= 0 or self.sigma <= 0 or not 1 <= self.low <= self.high:
            raise ValueError(f"need mean > 0, sigma > 0 and 1 <= low <= high: {self}")

    @property
    def mu(self) -> float:
        return math.log(self.mean) - self.sigma**2 / 2

    def _bounds(self) -> tuple[float, float]:
        unit = NormalDist()
        return (
            unit.cdf((math.log(self.low) - self.mu) / self.sigma),
            unit.cdf((math.log(self.high) - self.mu) / self.sigma),
        )

    def sample(self, rng: random.Random) -> int:
        """One draw by inverting the truncated distribution's CDF."""
        below, above = self._bounds()
        share = below + (above - below) * rng.random()
        share = min(max(share, 1e-12), 1 - 1e-12)
        value = math.exp(self.mu + self.sigma * NormalDist().inv_cdf(share))
        return max(self.low, min(self.high, round(value)))

    def expected(self) -> float:
        """The truncated distribution's mean."""
        below, above = self._bounds()
        if above - below < 1e-12:
            return (self.low + self.high) / 2
        unit, s = NormalDist(), self.sigma
        inside = unit.cdf((math.log(self.high) - self.mu - s * s) / s) - unit.cdf(
            (math.log(self.low) - self.mu - s * s) / s
        )
        return math.exp(self.mu + s * s / 2) * inside / (above - below)

    def capped(self, high: int) -> "LogNormal":
        """The same distribution truncated at `high` too."""
        top = max(1, min(self.high, high))
        return replace(self, high=top, low=min(self.low, top))


@dataclass(frozen=True)
class LengthMix:
    """A mixture of `LogNormal` lengths: (weight, part) pairs."""

    parts: tuple[tuple[float, LogNormal], ...]

    def __post_init__(self) -> None:
        if not self.parts or any(w <= 0 for w, _ in self.parts):
            raise ValueError(f"a mix needs parts of positive weight: {self}")

    def sample(self, rng: random.Random) -> int:
        if len(self.parts) == 1:
            return self.parts[0][1].sample(rng)
        weights = [w for w, _ in self.parts]
        part = rng.choices([p for _, p in self.parts], weights=weights)[0]
        return part.sample(rng)

    def expected(self) -> float:
        total = sum(w for w, _ in self.parts)
        return sum(w * p.expected() for w, p in self.parts) / total

    @property
    def high(self) -> int:
        return max(p.high for _, p in self.parts)

    def capped(self, high: int) -> "LengthMix":
        return LengthMix(tuple((w, p.capped(high)) for w, p in self.parts))

    def short(self) -> str:
        """The mean, in tokens (K above 10,000)."""
        mean = self.expected()
        return f"{mean / 1000:.0f}K" if mean >= 10_000 else f"{mean:.0f}"


def single(part: LogNormal) -> LengthMix:
    return LengthMix(((1.0, part),))


@dataclass(frozen=True)
class Arrivals:
    """When requests arrive: a shape around a mean rate, Gamma gaps of CV `cv`.

    `swing` is the shape's size: waves, the sine's relative amplitude; onoff, the burst's rate
    over the rate between bursts; diurnal, the peak's rate over the trough's; drift, the end's
    rate over the start's. `period_s` is a wave's period or a burst cycle; `on_s` a burst's
    length; `phase` the share of a period already past at the replay's start.
    """

    shape: str
    rate_rps: float  # the mean over the measured window
    cv: float
    swing: float = 0.0
    period_s: float = 0.0
    on_s: float = 0.0
    phase: float = 0.0

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; choose from {', '.join(SHAPES)}")
        if self.rate_rps <= 0 or self.cv <= 0:
            raise ValueError(f"need a positive rate and CV: {self}")
        if self.shape in ("waves", "onoff") and self.period_s <= 0:
            raise ValueError(f"{self.shape} needs a positive period: {self}")
        if self.shape == "onoff" and not 0 < self.on_s < self.period_s:
            raise ValueError(f"a burst must be shorter than its cycle: {self}")

    def profile(self, warmup_s: float, duration_s: float) -> RateProfile:
        """The rate over the replay (warm-up, then the measured window), scaled so that the
        measured window's mean is `rate_rps`."""
        total = warmup_s + duration_s
        shape = _shape_profile(self, total)
        mean = window_mean(shape, warmup_s, total)
        return shape.scaled(self.rate_rps / mean)

    def short(self) -> str:
        base = f"{self.rate_rps:.3g} rps"
        detail = {
            "steady": "steady",
            "waves": f"waves {self.period_s:.0f}s ±{self.swing:.0%}",
            "onoff": f"bursts x{self.swing:.1f} {self.on_s:.0f}/{self.period_s:.0f}s",
            "diurnal": f"day x{self.swing:.1f}",
            "drift": f"drift x{self.swing:.2f}",
        }[self.shape]
        return f"{base} {detail} cv{self.cv:.1f}"


def _shape_profile(arrivals: Arrivals, total_s: float) -> RateProfile:
    """The shape's unscaled rate over `total_s` seconds (mean about 1)."""
    a = arrivals
    if a.shape == "steady":
        return RateProfile((RateSegment(0.0, total_s, 1.0, 1.0),))
    if a.shape == "drift":
        return RateProfile((RateSegment(0.0, total_s, 1.0, a.swing),))
    if a.shape == "onoff":
        return _onoff(a, total_s)
    if a.shape == "waves":
        period = a.period_s

        def rate(t: float) -> float:
            return 1.0 + a.swing * math.sin(2 * math.pi * (t / period + a.phase))

        return _smooth(rate, total_s, min(SMOOTH_STEP_S, period / 24))
    # diurnal: one cycle over the replay, from the trough up to the peak and back
    depth = (a.swing - 1) / (a.swing + 1)

    def day(t: float) -> float:
        return 1.0 - depth * math.cos(2 * math.pi * (t / total_s + a.phase))

    return _smooth(day, total_s, min(SMOOTH_STEP_S, total_s / 96))


def _smooth(rate: Callable[[float], float], total_s: float, step_s: float) -> RateProfile:
    pieces = max(1, math.ceil(total_s / step_s))
    width = total_s / pieces
    return RateProfile(
        tuple(
            RateSegment(
                k * width, width, max(0.0, rate(k * width)), max(0.0, rate((k + 1) * width))
            )
            for k in range(pieces)
        )
    )


def _onoff(a: Arrivals, total_s: float) -> RateProfile:
    """Bursts of `on_s` at `swing` times the rate between them, one per `period_s`."""
    segments: list[RateSegment] = []
    t = 0.0
    offset = a.phase * a.period_s  # how far into a cycle the replay starts
    while t < total_s - 1e-9:
        into = (t + offset) % a.period_s
        on = into < a.on_s
        left = (a.on_s - into) if on else (a.period_s - into)
        length = min(left, total_s - t)
        level = a.swing if on else 1.0
        if length > 1e-9:
            segments.append(RateSegment(t, length, level, level))
        t += max(length, 1e-9)
    return RateProfile(tuple(segments))


def window_mean(profile: RateProfile, start_s: float, end_s: float) -> float:
    """The profile's mean rate over [start_s, end_s)."""
    area = 0.0
    for s in profile.segments:
        low, high = max(start_s, s.start_s), min(end_s, s.start_s + s.duration_s)
        if high <= low:
            continue
        slope = (s.end_rps - s.start_rps) / s.duration_s
        at_low = s.start_rps + slope * (low - s.start_s)
        at_high = s.start_rps + slope * (high - s.start_s)
        area += (at_low + at_high) / 2 * (high - low)
    return area / (end_s - start_s)


def peak_rate(profile: RateProfile) -> float:
    return max(max(s.start_rps, s.end_rps) for s in profile.segments)


@dataclass(frozen=True)
class Scenario:
    """One drawn workload on one deployment: everything `requests()` and `spec()` need."""

    id: str
    family: str
    deployment: str
    arrivals: Arrivals
    input: LengthMix
    output: LengthMix
    prefix_reuse: float  # expected share of each prompt that a shared prefix covers
    duration_s: float
    warmup_s: float
    seed: int  # of the requests' draws
    max_replicas: tuple[int, int] = (MIN_MAX_REPLICAS, MIN_MAX_REPLICAS)  # prefill, decode
    prefix_groups: int = PREFIX_GROUPS

    def __post_init__(self) -> None:
        if self.deployment not in DEPLOYMENTS:
            raise ValueError(f"unknown deployment {self.deployment!r}")
        if not 0 <= self.prefix_reuse < 1 or self.prefix_groups < 1:
            raise ValueError(f"need prefix reuse in [0, 1) and a group: {self}")
        if self.duration_s <= 0 or self.warmup_s < 0:
            raise ValueError(f"need a positive duration and a warm-up >= 0: {self}")
        context = DEPLOYMENTS[self.deployment].context_tokens
        if self.input.high + self.output.high > context:
            raise ValueError(f"{self.id}: prompt and answer may exceed the context ({context})")

    @property
    def model(self) -> ModelProfile:
        return DEPLOYMENTS[self.deployment].profile

    def short(self) -> str:
        """The family's parameters in a line."""
        return (
            f"{self.family} {self.arrivals.short()}, in {self.input.short()}"
            f" out {self.output.short()}, reuse {self.prefix_reuse:.0%}, {self.deployment}"
        )

    def spec_document(self) -> dict[str, Any]:
        """The PDDeployment: the example's SLO (TTFT 6 s, ITL 20 ms at P99) and timing, on
        this scenario's model and pools, bounded by `max_replicas`."""
        return deployment_document(DEPLOYMENTS[self.deployment], self.max_replicas)

    def spec(self) -> PDDeploymentSpec:
        return parse_pddeployment(self.spec_document()).spec

    def rate_profile(self) -> RateProfile:
        return self.arrivals.profile(self.warmup_s, self.duration_s)

    def requests(self) -> list[Request]:
        """The replay: warm-up and measured window, sorted by arrival."""
        times = [
            r.arrival_s
            for r in synthetic_requests(
                self.rate_profile(), TokenLengths(1, 1), arrival_cv=self.arrivals.cv, seed=self.seed
            )
        ]
        rng = random.Random(f"{self.seed}/lengths")
        context = DEPLOYMENTS[self.deployment].context_tokens
        ranks = range(self.prefix_groups)
        zipf = list(itertools.accumulate(1 / (k + 1) ** PREFIX_ZIPF for k in ranks))
        unique = UNIQUE_BLOCKS
        out = []
        for arrival in times:
            output_tokens = self.output.sample(rng)
            input_tokens = min(self.input.sample(rng), context - output_tokens)
            group = rng.choices(ranks, cum_weights=zipf)[0]
            shared = _prefix_blocks(rng, input_tokens, self.prefix_reuse)
            blocks = math.ceil(input_tokens / MOONCAKE_BLOCK_TOKENS)
            ids = [(group + 1) << GROUP_SHIFT | j for j in range(shared)]
            ids += range(unique, unique + blocks - shared)
            unique += blocks - shared
            out.append(Request(arrival, input_tokens, output_tokens, hash_ids=tuple(ids)))
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Scenario":
        def mix(value: Mapping[str, Sequence[Any]]) -> LengthMix:
            return LengthMix(tuple((float(w), LogNormal(**p)) for w, p in value["parts"]))

        fields = dict(data)
        fields["arrivals"] = Arrivals(**data["arrivals"])
        fields["input"] = mix(data["input"])
        fields["output"] = mix(data["output"])
        fields["max_replicas"] = tuple(data["max_replicas"])
        return cls(**fields)


def _prefix_blocks(rng: random.Random, input_tokens: int, reuse: float) -> int:
    """Leading blocks a request shares with its group: `reuse` of its prompt in expectation
    (the last prompt token is never cached), rounded at random to whole blocks."""
    if reuse <= 0 or input_tokens < 2:
        return 0
    block = MOONCAKE_BLOCK_TOKENS
    wanted = reuse * input_tokens
    whole = math.floor(wanted / block)
    below, above = whole * block, min((whole + 1) * block, input_tokens - 1)
    extra = above > below and rng.random() < (wanted - below) / (above - below)
    return min(whole + int(extra), math.ceil(input_tokens / block))


def deployment_document(deployment: Deployment, max_replicas: tuple[int, int]) -> dict[str, Any]:
    """The example PDDeployment (replay.example.example_document at P99) on `deployment`."""
    document = example_document(model_name=deployment.model_name, percentile="P99")
    pools = {
        "prefill": (deployment.prefill, deployment.prefill_cards, max_replicas[0]),
        "decode": (deployment.decode, deployment.decode_cards, max_replicas[1]),
    }
    for role, (hardware, cards, most) in pools.items():
        pool = document["spec"][role]["pools"][0]
        pool["name"] = hardware.removeprefix("mtt-")
        pool["accelerator"] = {
            "resourceName": HARDWARE_PROFILES[hardware].resource_name,
            "perReplica": cards,
            "profile": hardware,
        }
        pool["replicas"]["max"] = most
    return document


def replicas_needed(
    deployment: Deployment, peak_rps: float, inputs: LengthMix, outputs: LengthMix, reuse: float
) -> tuple[float, float]:
    """Prefill and decode replicas the peak rate needs at the profiles' capacity (the seeds
    the operator starts from), at the mean lengths."""
    spec = parse_pddeployment(
        deployment_document(deployment, (MIN_MAX_REPLICAS, MIN_MAX_REPLICAS))
    ).spec
    prompt, answer = inputs.expected(), outputs.expected()
    need = []
    roles: tuple[tuple[Role, float, float], ...] = (
        ("prefill", prompt, peak_rps * prompt),
        ("decode", prompt + answer / 2, peak_rps * answer),
    )
    resolved = resolve(spec)
    for role, context, demand in roles:
        pool = spec.pools(role)[0]
        each = seed_capacity(
            resolved,
            role,
            pool,
            max(1, round(context)),
            cached_share=reuse if role == "prefill" else 0,
        )
        if not each:
            raise ValueError(f"{deployment.name}: no {role} capacity at {context:.0f} tokens")
        need.append(demand / each)
    return need[0], need[1]


# --- families -------------------------------------------------------------------------------


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def chat_input(rng: random.Random) -> LogNormal:
    """Chat prompts: ~770 tokens (from 550 to 1,100 per scenario), log-sigma 1.0 (Azure's)."""
    return LogNormal(_log_uniform(rng, 550, 1100), 1.0, 16, 16_384)


def chat_output(rng: random.Random) -> LogNormal:
    """Chat answers: ~75 tokens (50 to 110), log-sigma 0.9 (Azure's 0.86)."""
    return LogNormal(_log_uniform(rng, 50, 110), 0.9, 1, 2048)


def reasoning_output(rng: random.Random) -> LogNormal:
    """Reasoning answers: thinking plus answer, 1K to 8K tokens, mean 1,500 to 4,000."""
    return LogNormal(_log_uniform(rng, 1500, 4000), 0.6, 1024, 8192)


def long_input(rng: random.Random) -> LogNormal:
    """Long contexts (documents, repositories, agents' histories): 32K to 128K, mean 40K-80K."""
    return LogNormal(_log_uniform(rng, 40_000, 80_000), 0.5, 32_768, 131_072)


def rag_input(rng: random.Random) -> LogNormal:
    """Retrieval-augmented prompts: 2K to 32K, mean about 6K."""
    return LogNormal(_log_uniform(rng, 4000, 8000), 0.7, 2048, 32_768)


@dataclass(frozen=True)
class Family:
    """What the requests of a scenario are, and at what rates they come."""

    name: str
    rate_rps: tuple[float, float]  # drawn log-uniformly
    min_context: int  # deployments with a shorter context are not drawn
    inputs: Callable[[random.Random], LengthMix]
    outputs: Callable[[random.Random], LengthMix]


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        # Short prompts and answers: one replica serves tens of requests/s.
        Family(
            "chat",
            (0.5, 100.0),
            4096,
            lambda rng: single(chat_input(rng)),
            lambda rng: single(chat_output(rng)),
        ),
        # Decode-bound: 25 requests/s of 3K-token answers keep tens of decode replicas busy.
        Family(
            "reasoning",
            (0.5, 25.0),
            16_384,
            lambda rng: single(chat_input(rng)),
            lambda rng: single(reasoning_output(rng)),
        ),
        # Prefill-bound: 2 requests/s of 60K-token prompts keep about ten S5000 replicas busy.
        Family(
            "long-context",
            (0.5, 2.0),
            131_072,
            lambda rng: single(long_input(rng)),
            lambda rng: single(chat_output(rng)),
        ),
        # Chat, retrieval-augmented and long prompts, some reasoning answers at once.
        Family(
            "mixed",
            (0.5, 20.0),
            131_072,
            lambda rng: LengthMix(
                ((0.75, chat_input(rng)), (0.20, rag_input(rng)), (0.05, long_input(rng)))
            ),
            lambda rng: LengthMix(((0.85, chat_output(rng)), (0.15, reasoning_output(rng)))),
        ),
    )
}


def _arrivals(rng: random.Random, shape: str, rate: float) -> Arrivals:
    phase = rng.random()
    if shape == "steady":
        return Arrivals(shape, rate, _log_uniform(rng, 0.5, 4.0))
    cv = _log_uniform(rng, 0.5, 2.0)
    if shape == "waves":
        period = _log_uniform(rng, 120, 600)
        return Arrivals(shape, rate, cv, rng.uniform(0.3, 0.7), period, phase=phase)
    if shape == "onoff":
        on = rng.uniform(20, 120)
        period = on + _log_uniform(rng, 60, 600)
        return Arrivals(shape, rate, cv, rng.uniform(2.0, 6.0), period, on, phase)
    if shape == "diurnal":
        # The replay starts anywhere in the day but not at the peak: a ramp up or down.
        return Arrivals(shape, rate, cv, _log_uniform(rng, 3, 10), phase=rng.uniform(-0.3, 0.3))
    up = rng.random() < 0.5
    factor = _log_uniform(rng, 1.5, 3.0)
    return Arrivals(shape, rate, cv, factor if up else 1 / factor)


def draw_scenario(
    rng: random.Random,
    index: str,
    family: Family,
    shape: str,
    *,
    duration_s: float,
    warmup_s: float,
    seed: int,
) -> Scenario:
    """One scenario of `family` and `shape`, the rest drawn from `rng`."""
    fits = [d for d in DEPLOYMENTS.values() if d.context_tokens >= family.min_context]
    deployment = fits[rng.randrange(len(fits))]
    rate = _log_uniform(rng, *family.rate_rps)
    arrivals = _arrivals(rng, shape, rate)
    outputs = family.outputs(rng)
    inputs = family.inputs(rng).capped(deployment.context_tokens - outputs.high)
    reuse = round(rng.uniform(0.0, 0.9), 2)
    return bounded(
        Scenario(
            index,
            family.name,
            deployment.name,
            arrivals,
            inputs,
            outputs,
            reuse,
            duration_s,
            warmup_s,
            seed,
        )
    )


def draw_scenarios(
    seed: int, count: int = 40, *, duration_s: float = 900.0, warmup_s: float = 300.0
) -> list[Scenario]:
    """`count` scenarios, deterministic from `seed`: every family with every shape in turn
    (the pairs in a shuffled order, reshuffled each round), the rest drawn."""
    if count < 1:
        raise ValueError(f"need at least one scenario, got {count}")
    rng = random.Random(seed)
    pairs = [(f, s) for f in FAMILIES.values() for s in SHAPES]
    order: list[tuple[Family, str]] = []
    while len(order) < count:
        round_ = list(pairs)
        rng.shuffle(round_)
        order += round_
    return [
        draw_scenario(
            rng,
            f"{seed}-{k + 1:02d}",
            family,
            shape,
            duration_s=duration_s,
            warmup_s=warmup_s,
            seed=seed * 1000 + k,
        )
        for k, (family, shape) in enumerate(order[:count])
    ]


def bounded(scenario: Scenario) -> Scenario:
    """The scenario with the pool bounds `draw_scenario` gives: its sizing need times
    HEADROOM plus SPARE, within [MIN_MAX_REPLICAS, MAX_MAX_REPLICAS]."""
    peak = peak_rate(scenario.rate_profile())
    need = replicas_needed(
        DEPLOYMENTS[scenario.deployment],
        peak,
        scenario.input,
        scenario.output,
        scenario.prefix_reuse,
    )
    bounds = [
        min(MAX_MAX_REPLICAS, max(MIN_MAX_REPLICAS, math.ceil(HEADROOM * n) + SPARE)) for n in need
    ]
    return replace(scenario, max_replicas=(bounds[0], bounds[1]))


def examples(*, duration_s: float = 900.0, warmup_s: float = 300.0) -> list[Scenario]:
    """The two shapes issue #29 names on the articles' deployment: short chat at 60 requests/s
    in waves (prefill moves between one and two replicas), and reasoning at 20 requests/s
    (decode at four to five replicas, its ITL read at the bucket above the target)."""
    chat_in = single(LogNormal(770, 1.0, 16, 16_384))
    chat_out = single(LogNormal(75, 0.9, 1, 2048))
    shapes = (
        ("x-chat60-waves", "chat", Arrivals("waves", 60.0, 1.0, 0.5, 300.0), chat_out),
        (
            "x-reasoning20",
            "reasoning",
            Arrivals("steady", 20.0, 1.0),
            single(LogNormal(2500, 0.6, 1024, 8192)),
        ),
    )
    return [
        bounded(
            Scenario(
                name,
                family,
                "glm/s5000-h200",
                arrivals,
                chat_in,
                outputs,
                0.0,
                duration_s,
                warmup_s,
                seed,
            )
        )
        for seed, (name, family, arrivals, outputs) in enumerate(shapes, start=29_000)
    ]

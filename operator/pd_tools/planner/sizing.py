"""Capacity planning: the cheapest prefill and decode pools that meet an SLO for a workload.

Pure functions of the performance model (`core.perfmodel`). For each role and each candidate
card, one replica's capacity within the SLO is computed; the planner then tries every count of
one or two candidate pools per role (two pools of different vendors make a mixed pool) and keeps
the cheapest feasible one per role. How each estimate is made:

* Lengths: a workload is a mix of (input, output) length classes (a trace's requests, or
  one class of the mean lengths). The attention term makes a prompt's prefill cost grow with
  its square, so sizing for the mean prompt misses what a long tail costs.
* Prefill: each class's service time `s` is its own prefill work (the prefix-cache hit rate
  taken off its compute) plus its share of a batch of up to 8,192 new tokens (vLLM's
  default). Requests queue at a replica like an M/G/1 queue (`core.queueing`): the mean wait
  at utilisation rho is `W = rho * E[s**2] / (2 E[s] (1 - rho))` (Pollaczek-Khinchine); a
  request waits not at all with probability 1 - rho, else an exponential time of mean
  `W / rho`. A request's TTFT is its wait plus its own `s` plus its KV transfer; the predicted
  TTFT is the one that the target's share of the requests meets (by default 99%, of those
  that an idle replica of the fastest candidate serves in time; the rest are reported as
  infeasible). Replicas are added until it meets the TTFT target.
* Decode: each request holds a slot for `output * ITL` seconds (Little's law); the mean batch
  per replica is the fixed point of `B = rate * E[output] * ITL(B) / replicas`, the context of
  a slot averaged over the requests by how long each holds one (its output length). The batch
  swings around B (`decode_itl_at`): the plan is feasible when the step at the batch that the
  target's share of the requests see meets the ITL target, and that batch fits in the KV cache.
* Nodes per replica: a replica whose weights do not fit the cards of one node (a candidate's
  `cards`) spans as many such nodes as it takes, `nodesPerReplica` (an LWS group placed whole),
  and the time model counts all of its cards; a plan asks for whole groups of nodes.
* Cost per million tokens counts input and output tokens; revenue uses the token prices
  (CONTEXT.md: 8 CNY per million uncached input, 2 per million cached, 2.6 blended); payback is
  the purchase price of the cards over the hourly margin (revenue minus card-hour cost).
"""

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

from pd_operator.core.hardware import HardwareProfile, ModelProfile
from pd_operator.core.perfmodel import (
    PrefillCoefficients,
    decode_itl_ms,
    kv_capacity_tokens,
    kv_transfer_seconds,
    max_concurrent_sequences,
)
from pd_operator.core.queueing import MAX_UTILISATION, attained_share
from pd_operator.core.tuning import TUNING

MAX_REPLICAS = 256
MAX_NODES_PER_REPLICA = 16  # as accelerator.nodesPerReplica allows
DEFAULT_LINK_BYTES_PER_SECOND = 100e9  # as the engine simulator (Mooncake's low end)
ROLES = ("prefill", "decode")
# A trace's distinct (input, output) pairs beyond this are merged into classes of lengths
# within a few percent of each other (the planner's work grows with the classes: 10 minutes of
# ServeGen at its published rate hold 324K distinct pairs).
MAX_LENGTH_CLASSES = 2000
LENGTH_BIN_RATIO = 1.02


@dataclass(frozen=True)
class Workload:
    """Mean request rate and lengths; `cache_hit_rate` is the share of prompt tokens cached.

    `lengths` is the length distribution as (input, output, weight) classes; empty: every
    request has the mean lengths. Build one from observed requests with `from_lengths`.
    """

    rate_rps: float
    input_tokens: float
    output_tokens: float
    cache_hit_rate: float = 0.0
    lengths: tuple[tuple[float, float, float], ...] = ()

    def __post_init__(self) -> None:
        if self.rate_rps <= 0 or self.input_tokens < 1 or self.output_tokens < 1:
            raise ValueError("rate must be positive and lengths at least one token")
        if not 0 <= self.cache_hit_rate < 1:
            raise ValueError("cache hit rate must lie in [0, 1)")
        if any(i < 1 or o < 1 or w <= 0 for i, o, w in self.lengths):
            raise ValueError("length classes need lengths >= 1 token and a positive weight")

    @classmethod
    def from_lengths(
        cls, rate_rps: float, pairs: Sequence[tuple[int, int]], cache_hit_rate: float = 0.0
    ) -> "Workload":
        """A workload whose lengths are those of `pairs` (input, output), e.g. a trace's."""
        if not pairs:
            raise ValueError("need at least one (input, output) pair")
        counts: dict[tuple[float, float], float] = {}
        for pair in pairs:
            counts[pair] = counts.get(pair, 0) + 1
        ratio = LENGTH_BIN_RATIO
        while len(counts) > MAX_LENGTH_CLASSES:
            counts = _merged(counts, ratio)
            ratio *= ratio
        return cls(
            rate_rps,
            sum(i for i, _ in pairs) / len(pairs),
            sum(o for _, o in pairs) / len(pairs),
            cache_hit_rate,
            tuple((i, o, n / len(pairs)) for (i, o), n in sorted(counts.items())),
        )

    def classes(self) -> list[tuple[float, float, float]]:
        """(input, output, weight) classes, weights summing to 1."""
        if not self.lengths:
            return [(self.input_tokens, self.output_tokens, 1.0)]
        total = sum(w for _, _, w in self.lengths)
        return [(i, o, w / total) for i, o, w in self.lengths]

    @property
    def tokens_per_second(self) -> float:
        return self.rate_rps * (self.input_tokens + self.output_tokens)


def _merged(
    counts: Mapping[tuple[float, float], float], ratio: float
) -> dict[tuple[float, float], float]:
    """Classes whose input and output lengths fall in the same log bin of width `ratio`
    merged into one at their weighted mean lengths."""
    bins: dict[tuple[int, int], list[float]] = {}
    step = math.log(ratio)
    for (i, o), n in counts.items():
        key = (round(math.log(i) / step), round(math.log(o) / step))
        acc = bins.setdefault(key, [0.0, 0.0, 0.0])
        acc[0] += n
        acc[1] += n * i
        acc[2] += n * o
    return {(a[1] / a[0], a[2] / a[0]): a[0] for a in bins.values()}


@dataclass(frozen=True)
class Target:
    """Latency targets, met by `share` of the requests an idle replica serves in time."""

    ttft_ms: float
    itl_ms: float
    share: float = 0.99

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError("the share of requests to serve in time must lie in (0, 1]")


@dataclass(frozen=True)
class Candidate:
    """A card the planner may use: its profile, cards per replica (on each node), prices,
    availability."""

    hardware: HardwareProfile
    cards_per_replica: int = 8  # accelerator.perReplica: cards on each node of a replica
    card_hour_price: float | None = None  # None: the profile's placeholder price
    purchase_price: float | None = None  # per card, for the payback time
    max_cards: int | None = None  # cards available of this type, both roles together
    nodes_per_replica: int = 1  # at least; `fitted` raises it until the weights fit

    @property
    def replica_cards(self) -> int:
        """Every card of one replica, over all its nodes."""
        return self.cards_per_replica * self.nodes_per_replica

    @property
    def price(self) -> float:
        if self.card_hour_price is not None:
            return self.card_hour_price
        return self.hardware.hourly_price_usd


@dataclass(frozen=True)
class TokenPrices:
    """Prices per million tokens (CONTEXT.md's business case, in CNY)."""

    input_per_million: float = 8.0
    cached_per_million: float = 2.0
    output_per_million: float = 8.0
    blended_per_million: float | None = 2.6  # when set, every token earns this

    def revenue_per_hour(self, workload: Workload) -> float:
        hour = workload.rate_rps * 3600 / 1e6
        if self.blended_per_million is not None:
            return (
                hour * (workload.input_tokens + workload.output_tokens) * (self.blended_per_million)
            )
        cached = workload.input_tokens * workload.cache_hit_rate
        return hour * (
            (workload.input_tokens - cached) * self.input_per_million
            + cached * self.cached_per_million
            + workload.output_tokens * self.output_per_million
        )


@dataclass(frozen=True)
class PoolPlan:
    role: str
    candidate: Candidate
    replicas: int

    @property
    def name(self) -> str:
        """The pool's name in the PDDeployment `deployment_document` makes (a DNS label)."""
        return self.candidate.hardware.name.replace(".", "-")

    @property
    def cards(self) -> int:
        return self.replicas * self.candidate.replica_cards

    @property
    def nodes(self) -> int:
        """Nodes (pods) of the pool: whole groups of `nodes_per_replica`."""
        return self.replicas * self.candidate.nodes_per_replica

    @property
    def cost_per_hour(self) -> float:
        return self.cards * self.candidate.price


@dataclass(frozen=True)
class Plan:
    """The cheapest feasible pools and what they are predicted to do."""

    workload: Workload
    target: Target
    pools: tuple[PoolPlan, ...]
    ttft_ms: float
    itl_ms: float
    revenue_per_hour: float
    # Share of requests (by the length mix) that miss the TTFT target even on an idle replica
    # of the fastest candidate: no plan serves them in time, so they are not planned for.
    infeasible_share: float = 0.0
    # The KV fabric between prefill and decode the plan was sized for (its hand-off is in TTFT).
    link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND

    @property
    def cost_per_hour(self) -> float:
        return sum(p.cost_per_hour for p in self.pools)

    @property
    def cost_per_million_tokens(self) -> float:
        return self.cost_per_hour / (self.workload.tokens_per_second * 3600 / 1e6)

    def cards(self, role: str | None = None) -> int:
        return sum(p.cards for p in self.pools if role is None or p.role == role)

    @property
    def payback_hours(self) -> float | None:
        """Purchase price of every card over the hourly margin; None without prices or margin."""
        prices = [p.candidate.purchase_price for p in self.pools]
        margin = self.revenue_per_hour - self.cost_per_hour
        if any(price is None for price in prices) or margin <= 0:
            return None
        capex = sum(p.cards * (p.candidate.purchase_price or 0.0) for p in self.pools)
        return capex / margin

    def to_dict(self) -> dict[str, Any]:
        return {
            "pools": [
                {
                    "role": p.role,
                    "profile": p.candidate.hardware.name,
                    "replicas": p.replicas,
                    "cards_per_replica": p.candidate.cards_per_replica,
                    "nodes_per_replica": p.candidate.nodes_per_replica,
                    "cards": p.cards,
                    "cost_per_hour": p.cost_per_hour,
                }
                for p in self.pools
            ],
            "predicted_ttft_ms": self.ttft_ms,
            "predicted_itl_ms": self.itl_ms,
            "cost_per_hour": self.cost_per_hour,
            "cost_per_million_tokens": self.cost_per_million_tokens,
            "revenue_per_hour": self.revenue_per_hour,
            "payback_hours": self.payback_hours,
            "infeasible_share": self.infeasible_share,
            "kv_link_gb_per_second": self.link_bytes_per_second / 1e9,
        }


def fitted(candidate: Candidate, model: ModelProfile) -> Candidate:
    """The candidate with the fewest nodes per replica (at least its own) whose cards hold the
    model's weights with room for KV cache; unchanged when not even MAX_NODES_PER_REPLICA do."""
    for nodes in range(candidate.nodes_per_replica, MAX_NODES_PER_REPLICA + 1):
        cards = candidate.cards_per_replica * nodes
        if kv_capacity_tokens(candidate.hardware, model, cards) > 0:
            return replace(candidate, nodes_per_replica=nodes)
    return candidate


def _service_s(
    coefficients: PrefillCoefficients, prompt_tokens: float, cache_hit_rate: float
) -> float:
    """One prompt's own prefill work plus its share of a batch's fixed cost."""
    prompt = max(1, round(prompt_tokens))
    cached = min(prompt - 1, math.floor(prompt * cache_hit_rate))
    batch = max(1, TUNING.prefill_batch_tokens // max(1, prompt - cached))
    return coefficients.batch_ms([prompt] * batch, [cached] * batch) / 1000 / batch


@dataclass(frozen=True)
class PrefillStats:
    """One candidate replica's prefill service over the length mix."""

    mean_s: float  # E[s]
    second_moment_s2: float  # E[s**2]
    # (service + KV transfer, share of the requests) of the requests served in time when
    # idle, in at most LATENCY_GROUPS groups each at its slowest member (so never optimistic)
    latencies: tuple[tuple[float, float], ...]

    @classmethod
    def of(
        cls,
        candidate: Candidate,
        model: ModelProfile,
        workload: Workload,
        transfer_s: Sequence[float],
        served: Sequence[bool],
    ) -> "PrefillStats":
        """`transfer_s` and `served` (counted in the latencies) per length class."""
        coefficients = PrefillCoefficients.from_profiles(
            candidate.hardware, model, candidate.replica_cards
        )
        classes = workload.classes()
        service = [_service_s(coefficients, i, workload.cache_hit_rate) for i, _, _ in classes]
        weights = [w for _, _, w in classes]
        mean = sum(w * x for w, x in zip(weights, service, strict=True))
        second = sum(w * x * x for w, x in zip(weights, service, strict=True))
        latency = sorted(
            (x + t, w)
            for x, t, w, ok in zip(service, transfer_s, weights, served, strict=True)
            if ok
        )
        return cls(mean, second, _grouped(latency))


LATENCY_GROUPS = 128


def _grouped(values: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Sorted (value, weight) pairs in at most LATENCY_GROUPS groups of about equal weight,
    each at its largest value; weights normalised to 1."""
    total = sum(w for _, w in values)
    out: list[tuple[float, float]] = []
    weight = 0.0
    for value, w in values:
        weight += w
        if weight * LATENCY_GROUPS >= total:
            out.append((value, weight / total))
            weight = 0.0
    if weight > 0:
        out.append((values[-1][0], weight / total))
    return tuple(out)


def predicted_ttft_s(
    stats: Sequence[PrefillStats], replicas: Sequence[int], rate_rps: float, share: float
) -> float:
    """TTFT (s) that `share` of the requests meet on the slowest pool (the load shared in
    proportion to each pool's throughput, each replica an M/G/1 queue); inf if full."""
    throughput = sum(n / p.mean_s for n, p in zip(replicas, stats, strict=True))
    if throughput <= 0:
        return math.inf
    rho = rate_rps / throughput
    if rho >= MAX_UTILISATION:
        return math.inf
    worst = max((p for n, p in zip(replicas, stats, strict=True) if n > 0), key=lambda p: p.mean_s)
    if not worst.latencies:
        return math.inf
    wait = rho * worst.second_moment_s2 / (2 * worst.mean_s * (1 - rho))

    def attained(t: float) -> float:  # each replica an M/G/1 queue: waits with probability rho
        return attained_share(worst.latencies, rho, wait / rho if rho > 0 else 0.0, t)

    low, high = 0.0, worst.latencies[-1][0] + wait + 1e-9
    while attained(high) < share - 1e-12:
        low, high = high, 2 * high
    for _ in range(40):
        middle = (low + high) / 2
        if attained(middle) >= share - 1e-12:
            high = middle
        else:
            low = middle
    return high


def decode_itl_at(
    candidates: Sequence[Candidate],
    replicas: Sequence[int],
    model: ModelProfile,
    work: Workload,
    share: float = 0.5,
) -> float:
    """ITL (ms) that `share` of the requests meet; inf when the slots or the KV do not suffice.

    The mean batch is the fixed point of Little's law. A request holds a slot for as long as its
    output runs, so a slot's context (and the KV it needs) is averaged over the length mix
    weighted by output length. The batch swings around its mean: the sequences decoding at once
    are a Poisson count (an M/G/inf queue), shared evenly by the replicas, so a replica's batch
    has the variance mean / replicas; a request's ITL averages the steps over its own life,
    which leaves two thirds of it (service times taken as equal). A share above one half is met
    at the batch that far above the mean (a normal approximation); at one half, the mean's."""
    classes = work.classes()
    held = sum(w * o for _, o, w in classes)
    context = round(sum(w * o * (i + o / 2) for i, o, w in classes) / held)
    footprint = round(sum(w * o * (i + o) for i, o, w in classes) / held)
    output = held  # mean output tokens per request
    total = sum(replicas)
    if total == 0:
        return math.inf
    pools = [(c, n) for c, n in zip(candidates, replicas, strict=True) if n > 0]
    fits = {
        c: min(
            TUNING.max_decode_batch,
            max_concurrent_sequences(c.hardware, model, c.replica_cards, footprint),
        )
        for c, _ in pools
    }

    def itl_at(batch: float) -> float:
        """The slowest pool's step with `batch` sequences (rounded up) on each replica."""
        b = max(1, math.ceil(batch))
        if any(b > fits[c] for c, _ in pools):
            return math.inf
        return max(decode_itl_ms(c.hardware, model, c.replica_cards, b, context) for c, _ in pools)

    # The router spreads sequences evenly over replicas; each pool's batch follows its ITL.
    itl = 20.0
    for _ in range(50):
        worst = itl_at(work.rate_rps * output * itl / 1000 / total)
        if math.isinf(worst) or abs(worst - itl) < 1e-3:
            break
        itl = worst
    if share <= 0.5 or math.isinf(worst):
        return worst
    mean = work.rate_rps * output * worst / 1000 / total
    swing = NormalDist().inv_cdf(share) * math.sqrt(2 * mean / 3 / total)
    return itl_at(mean + swing)


def _options(candidates: Sequence[Candidate]) -> list[tuple[Candidate, ...]]:
    singles = [(c,) for c in candidates]
    return singles + list(itertools.combinations(candidates, 2))


def _cheapest(
    role: str,
    candidates: Sequence[Candidate],
    feasible: Any,
    cards_left: dict[str, int],
) -> tuple[tuple[PoolPlan, ...], float] | None:
    best: tuple[tuple[PoolPlan, ...], float] | None = None
    best_cost = math.inf
    for option in _options(candidates):
        limits = [
            min(MAX_REPLICAS, cards_left.get(c.hardware.name, 10**9) // c.replica_cards)
            for c in option
        ]
        for n0 in range(1, limits[0] + 1):
            if n0 * option[0].replica_cards * option[0].price >= best_cost:
                break  # the first pool alone already costs more than the best plan
            counts = [n0]
            if len(option) == 2:
                # The fewest of the second pool that make it feasible, by bisection.
                low, high = 1, limits[1]
                if high < 1 or feasible(option, [n0, high]) is None:
                    continue
                while low < high:
                    middle = (low + high) // 2
                    if feasible(option, [n0, middle]) is None:
                        low = middle + 1
                    else:
                        high = middle
                counts.append(low)
            latency = feasible(option, counts)
            if latency is None:
                continue
            plans = tuple(PoolPlan(role, c, n) for c, n in zip(option, counts, strict=True))
            cost = sum(p.cost_per_hour for p in plans)
            if cost < best_cost - 1e-9:
                best, best_cost = (plans, latency), cost
            if len(option) == 1:
                break  # more replicas of one pool only cost more
    return best


def plan(
    workload: Workload,
    target: Target,
    model: ModelProfile,
    candidates: Sequence[Candidate],
    *,
    prices: TokenPrices = TokenPrices(),
    link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND,
) -> Plan | None:
    """The cheapest feasible plan, or None when no candidate mix meets the SLO
    (`no_plan_reason` says why)."""
    found = _search(
        workload,
        target,
        model,
        [fitted(c, model) for c in candidates],
        prices=prices,
        link_bytes_per_second=link_bytes_per_second,
    )
    return found if isinstance(found, Plan) else None


@dataclass(frozen=True)
class DomainFit:
    """How a plan sits in topology domains (racks, RDMA fabrics) of `nodes` nodes of each card
    type, where `spec.placement` keeps prefill and decode together: the domains the plan needs,
    and the cheapest plan that fits one (the plan itself when it does; None: none meets the SLO
    within one domain)."""

    nodes: int
    domains: int
    within_one: Plan | None

    def to_dict(self) -> dict[str, Any]:
        within = self.within_one
        return {
            "domain_nodes": self.nodes,
            "domains": self.domains,
            "within_one_domain": None if within is None else within.to_dict(),
        }


def domains_needed(result: Plan, nodes: int) -> int:
    """Domains of `nodes` nodes per card type the plan's pools take: one replica pod per node,
    both roles together, the card type that needs most."""
    per_type: dict[str, int] = {}
    for pool in result.pools:
        name = pool.candidate.hardware.name
        per_type[name] = per_type.get(name, 0) + pool.nodes
    return max((math.ceil(count / nodes) for count in per_type.values()), default=0)


def fit_domain(
    result: Plan,
    model: ModelProfile,
    candidates: Sequence[Candidate],
    nodes: int,
    *,
    prices: TokenPrices = TokenPrices(),
) -> DomainFit:
    """The plan against domains of `nodes` nodes per card type; when it needs more than one, the
    search again with each card type capped at one domain's whole replicas."""
    if nodes < 1:
        raise ValueError("a domain holds at least one node")
    needed = domains_needed(result, nodes)
    if needed <= 1:
        return DomainFit(nodes, needed, result)
    capped = []
    for candidate in (fitted(c, model) for c in candidates):
        room = (nodes // candidate.nodes_per_replica) * candidate.replica_cards
        limit = room if candidate.max_cards is None else min(room, candidate.max_cards)
        capped.append(replace(candidate, max_cards=limit))
    within = plan(
        result.workload,
        result.target,
        model,
        capped,
        prices=prices,
        link_bytes_per_second=result.link_bytes_per_second,
    )
    return DomainFit(nodes, needed, within)


@dataclass(frozen=True)
class _Shortfall:
    """Why the search found no plan: the role no mix serves ("prompts": none is served in time
    even alone), with the cards each capped type had left for it."""

    role: str
    stats: dict[Candidate, "PrefillStats"]
    cards_left: dict[str, int]


def _search(
    workload: Workload,
    target: Target,
    model: ModelProfile,
    candidates: Sequence[Candidate],
    *,
    prices: TokenPrices,
    link_bytes_per_second: float,
) -> "Plan | _Shortfall":
    stats, infeasible = _prefill_stats(workload, target, model, candidates, link_bytes_per_second)
    cards_left = {c.hardware.name: c.max_cards for c in candidates if c.max_cards is not None}
    if infeasible >= 1 - 1e-12:
        return _Shortfall("prompts", stats, cards_left)  # none served in time even alone

    def prefill_ok(option: Sequence[Candidate], counts: Sequence[int]) -> float | None:
        ttft = predicted_ttft_s([stats[c] for c in option], counts, workload.rate_rps, target.share)
        ttft *= 1000
        return ttft if ttft <= target.ttft_ms else None

    def decode_ok(option: Sequence[Candidate], counts: Sequence[int]) -> float | None:
        itl = decode_itl_at(option, counts, model, workload, target.share)
        return itl if itl <= target.itl_ms else None

    # Decode first: it is usually the scarcer pool on shared card types.
    decode = _cheapest("decode", candidates, decode_ok, dict(cards_left))
    if decode is None:
        return _Shortfall("decode", stats, cards_left)
    for pool in decode[0]:
        name = pool.candidate.hardware.name
        if name in cards_left:
            cards_left[name] -= pool.cards
    prefill = _cheapest("prefill", candidates, prefill_ok, cards_left)
    if prefill is None:
        return _Shortfall("prefill", stats, cards_left)
    return Plan(
        workload=workload,
        target=target,
        pools=prefill[0] + decode[0],
        ttft_ms=prefill[1],
        itl_ms=decode[1],
        revenue_per_hour=prices.revenue_per_hour(workload),
        infeasible_share=infeasible,
        link_bytes_per_second=link_bytes_per_second,
    )


def _prefill_stats(
    workload: Workload,
    target: Target,
    model: ModelProfile,
    candidates: Sequence[Candidate],
    link_bytes_per_second: float,
) -> tuple[dict[Candidate, PrefillStats], float]:
    """Each candidate's prefill stats, and the share of requests no candidate serves in time
    even idle (left out of the tail)."""
    classes = workload.classes()
    transfer = [kv_transfer_seconds(round(i), model, link_bytes_per_second) for i, _, _ in classes]
    fastest = _fastest_alone(workload, model, candidates, transfer)
    served = [t * 1000 <= target.ttft_ms for t in fastest]
    infeasible = sum(w for (_, _, w), ok in zip(classes, served, strict=True) if not ok)
    stats = {c: PrefillStats.of(c, model, workload, transfer, served) for c in candidates}
    return stats, infeasible


def _fastest_alone(
    workload: Workload,
    model: ModelProfile,
    candidates: Sequence[Candidate],
    transfer_s: Sequence[float],
) -> list[float]:
    """Per length class, the TTFT (s) of its prompt alone on the fastest idle candidate."""
    fastest = [math.inf] * len(transfer_s)
    classes = workload.classes()
    for candidate in candidates:
        coefficients = PrefillCoefficients.from_profiles(
            candidate.hardware, model, candidate.replica_cards
        )
        for k, (i, _, _) in enumerate(classes):
            prompt = max(1, round(i))
            cached = min(prompt - 1, math.floor(prompt * workload.cache_hit_rate))
            alone = coefficients.batch_ms([prompt], [cached]) / 1000  # a batch of its own
            fastest[k] = min(fastest[k], alone + transfer_s[k])
    return fastest


def no_plan_reason(
    workload: Workload,
    target: Target,
    model: ModelProfile,
    candidates: Sequence[Candidate],
    *,
    link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND,
) -> str:
    """Why `plan` finds nothing, in words a user can act on: the role no mix serves, and what
    each candidate's largest pool would give it ("" when there is a plan)."""
    candidates = [fitted(c, model) for c in candidates]
    found = _search(
        workload,
        target,
        model,
        candidates,
        prices=TokenPrices(),
        link_bytes_per_second=link_bytes_per_second,
    )
    if isinstance(found, Plan):
        return ""
    if found.role == "prompts":
        transfer = [
            kv_transfer_seconds(round(i), model, link_bytes_per_second)
            for i, _, _ in workload.classes()
        ]
        alone = _fastest_alone(workload, model, candidates, transfer)
        fastest = min(range(len(alone)), key=alone.__getitem__)
        shortest, hand_off = alone[fastest] * 1000, transfer[fastest] * 1000
        if hand_off >= target.ttft_ms / 2:  # the fabric, not the cards, is what is too slow
            return (
                f"no prompt meets the TTFT target of {target.ttft_ms:g} ms even alone on an idle "
                f"replica (the shortest takes {shortest:,.0f} ms, {hand_off:,.0f} ms of it the KV "
                f"hand-off over {link_bytes_per_second / 1e9:g} GB/s): a faster KV fabric "
                "(--kv-link) or a higher --ttft-ms"
            )
        return (
            f"no prompt meets the TTFT target of {target.ttft_ms:g} ms even alone on an idle "
            f"replica (the shortest takes {shortest:,.0f} ms on the fastest candidate): raise "
            "--ttft-ms or add a faster candidate"
        )
    limits = {
        c: min(MAX_REPLICAS, found.cards_left.get(c.hardware.name, 10**9) // c.replica_cards)
        for c in candidates
    }
    if found.role == "decode":
        itl = {
            c: decode_itl_at([c], [limits[c]], model, workload, target.share) for c in candidates
        }
        return _largest_pools("decode", "ITL", target.itl_ms, itl, limits)
    ttft = {
        c: predicted_ttft_s([found.stats[c]], [limits[c]], workload.rate_rps, target.share) * 1000
        for c in candidates
    }
    return _largest_pools("prefill", "TTFT", target.ttft_ms, ttft, limits)


def _largest_pools(
    role: str,
    latency: str,
    target_ms: float,
    predicted: Mapping[Candidate, float],
    limits: Mapping[Candidate, int],
) -> str:
    def said(c: Candidate) -> str:
        value, at = predicted[c], f"{c.hardware.name} x{limits[c]}"
        if limits[c] < 1:
            return f"{c.hardware.name}: no cards left"
        return f"{at}: {value:,.0f} ms" if math.isfinite(value) else f"{at}: cannot keep up"

    shown = "; ".join(said(c) for c in sorted(predicted, key=lambda c: predicted[c]))
    flag = "--itl-ms" if latency == "ITL" else "--ttft-ms"
    return (
        f"no {role} pool meets the {latency} target of {target_ms:g} ms even at its largest "
        f"({shown}): lower --rate, raise {flag}, or allow more cards (:max=, :cards=)"
    )


def evaluate(
    workload: Workload,
    target: Target,
    model: ModelProfile,
    pools: Sequence[PoolPlan],
    *,
    link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND,
) -> tuple[float, float]:
    """Predicted (TTFT ms, ITL ms) of given pools; inf where a role cannot keep up."""
    prefill = [p for p in pools if p.role == "prefill"]
    decode = [p for p in pools if p.role == "decode"]
    stats, _ = _prefill_stats(
        workload, target, model, [p.candidate for p in prefill], link_bytes_per_second
    )
    ttft = predicted_ttft_s(
        [stats[p.candidate] for p in prefill],
        [p.replicas for p in prefill],
        workload.rate_rps,
        target.share,
    )
    itl = decode_itl_at(
        [p.candidate for p in decode], [p.replicas for p in decode], model, workload, target.share
    )
    return ttft * 1000, itl


def max_rate(
    workload: Workload,
    target: Target,
    model: ModelProfile,
    pools: Sequence[PoolPlan],
) -> float:
    """Highest request rate the pools serve within the SLO (the plan's goodput), by bisection."""
    low, high = 0.0, workload.rate_rps
    while True:
        ttft, itl = evaluate(_at(workload, high), target, model, pools)
        if ttft > target.ttft_ms or itl > target.itl_ms:
            break
        low, high = high, high * 2
    for _ in range(40):
        middle = (low + high) / 2
        ttft, itl = evaluate(_at(workload, middle), target, model, pools)
        if ttft <= target.ttft_ms and itl <= target.itl_ms:
            low = middle
        else:
            high = middle
    return low


def _at(workload: Workload, rate: float) -> Workload:
    return replace(workload, rate_rps=max(rate, 1e-9))


def deployment_document(
    plan_: Plan,
    *,
    name: str,
    model_name: str,
    image: str = "vllm/vllm-openai:v0.11.0",
    context_length: int | None = None,
    headroom_replicas: int = 2,
) -> dict[str, Any]:
    """A PDDeployment for the plan: each pool starts at the planned replicas (min 1) and may
    grow by `headroom_replicas`; the SLO is the plan's target at P50."""
    roles: dict[str, list[dict[str, Any]]] = {"prefill": [], "decode": []}
    for pool in plan_.pools:
        hardware = pool.candidate.hardware
        vendor = hardware.resource_name.split("/")[0]
        accelerator: dict[str, Any] = {
            "resourceName": hardware.resource_name,
            "perReplica": pool.candidate.cards_per_replica,
            "tolerations": [
                {"key": hardware.resource_name, "operator": "Exists", "effect": "NoSchedule"}
            ],
            "profile": hardware.name,
            "nodeSelector": {f"{vendor}/gpu.product": hardware.gpu_product},
        }
        if pool.candidate.nodes_per_replica > 1:
            accelerator["nodesPerReplica"] = pool.candidate.nodes_per_replica
        roles[pool.role].append(
            {
                "name": pool.name,
                "accelerator": accelerator,
                "replicas": {"min": 1, "max": max(1, pool.replicas) + headroom_replicas},
            }
        )
    model: dict[str, Any] = {"name": model_name, "image": image}
    if context_length is not None:
        model["contextLength"] = context_length
    return {
        "apiVersion": "pdoperator.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": model,
            "kvTransfer": {"connector": "Mooncake", "protocol": "RDMA", "cacheDtype": "FP8"},
            "slo": {
                "ttft": {"percentile": "P50", "targetMilliseconds": round(plan_.target.ttft_ms)},
                "itl": {"percentile": "P50", "targetMilliseconds": round(plan_.target.itl_ms)},
                "windowSeconds": 60,
            },
            "prefill": {"pools": roles["prefill"]},
            "decode": {"pools": roles["decode"]},
            "scaling": {"mode": "Active", "intervalSeconds": 30},
        },
    }


def parse_candidate(text: str, profiles: Mapping[str, HardwareProfile]) -> Candidate:
    """`h200`, or `mtt-s5000:price=1.5:cards=8:buy=20000:max=32:nodes=2` (price per card-hour;
    cards per node of a replica; nodes per replica at least, raised until the weights fit)."""
    name, *options = text.split(":")
    if name not in profiles:
        raise ValueError(f"unknown hardware profile {name!r}; known: {', '.join(profiles)}")
    values: dict[str, float] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key not in ("price", "cards", "buy", "max", "nodes"):
            raise ValueError(
                f"unknown candidate option {key!r}; known: price, cards, buy, max, nodes"
            )
        try:
            values[key] = float(value)
        except ValueError:
            raise ValueError(f"{key}={value!r} is not a number") from None
        counted = key in ("cards", "max", "nodes")
        if key == "nodes" and values[key] > MAX_NODES_PER_REPLICA:
            raise ValueError(f"nodes={value} is more than {MAX_NODES_PER_REPLICA}")
        if not values[key] >= (1 if counted else 0) or (counted and not values[key].is_integer()):
            wants = "a whole number of at least 1" if counted else "a number of at least 0"
            raise ValueError(f"{key}={value} is not {wants}")
    return Candidate(
        profiles[name],
        cards_per_replica=int(values.get("cards", 8)),
        card_hour_price=values.get("price"),
        purchase_price=values.get("buy"),
        max_cards=int(values["max"]) if "max" in values else None,
        nodes_per_replica=int(values.get("nodes", 1)),
    )

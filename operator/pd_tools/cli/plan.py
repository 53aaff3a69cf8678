"""`pdctl plan`: the cheapest prefill and decode pools that meet an SLO, as a table or YAML."""

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from pd_operator.cli.arguments import NON_NEGATIVE, POSITIVE, SHARE, about, known
from pd_tools.cli import tables
from pd_tools.cli.workload import Load, load_options, trace_requests

if TYPE_CHECKING:
    from pd_operator.core.hardware import ModelProfile
    from pd_tools.planner.sizing import DomainFit, Plan, Workload
    from pd_tools.workloads.traces import Request, TokenLengths

PLAN_LENGTH_SAMPLES = 4000  # lengths drawn for `pdctl plan --length-cv`
SYNTHETIC_REPLAY_SECONDS = 600.0  # `pdctl plan --replay` without --trace or --duration
DEFAULT_CANDIDATES = ("mtt-s5000", "h200", "h20")


def _workload_from(
    load: Load, length_cv: float, requests: list["Request"], cache_hit: float
) -> "Workload":
    """The planner's workload: `requests` (a trace's window) or the synthetic options."""
    import random

    from pd_tools.planner.sizing import Workload

    if not requests:
        if length_cv <= 0:
            return Workload(load.rate, load.input_tokens, load.output_tokens, cache_hit)
        # A fixed sample of Gamma lengths (seed 0) stands for the distribution.
        rng = random.Random(0)
        lengths = _lengths(load, length_cv)
        pairs = [lengths.sample(rng)[:2] for _ in range(PLAN_LENGTH_SAMPLES)]
        return Workload.from_lengths(load.rate, pairs, cache_hit)
    span = max(1.0, requests[-1].arrival_s - requests[0].arrival_s)
    pairs = [(r.input_tokens, r.output_tokens) for r in requests]
    return Workload.from_lengths(len(requests) / span, pairs, cache_hit)


def _plan_trace(load: Load, model: "ModelProfile") -> tuple[list["Request"], float]:
    """The --trace window's requests the model takes (none without --trace), and the prefix-
    cache hit rate to plan with: --cache-hit, else the trace's own reuse, else 0."""
    from pd_tools.replay.outcomes import admitted

    trace = trace_requests(load.trace, load) if load.trace else []
    requests, refused = admitted(trace, model.max_context_tokens)
    if refused:
        print(
            f"pdctl plan: {len(refused):,} requests of the trace exceed {model.name}'s context "
            f"length ({model.max_context_tokens:,} tokens with the answer): left out, as the "
            "engines refuse them",
            file=sys.stderr,
        )
    cache_hit = load.cache_hit
    if cache_hit is None:
        cache_hit = _trace_cache_hit(requests) or 0.0
        if cache_hit > 0:
            print(
                f"pdctl plan: the trace's prompts find {cache_hit:.0%} of their tokens in earlier "
                "prompts' prefixes (as if every replica shared one unbounded cache; per-replica "
                "caches find less: --replay measures it); --cache-hit sets another share",
                file=sys.stderr,
            )
    return list(requests), cache_hit


def _trace_cache_hit(requests: Sequence["Request"]) -> float | None:
    """The share of a trace's prompt tokens found in earlier prompts' prefixes (an unbounded
    cache shared by every replica: the best case); None when it carries no block hashes."""
    from pd_tools.workloads.traces import reused_prefix_tokens

    if not any(r.hash_ids for r in requests):
        return None
    prompts = sum(r.input_tokens for r in requests)
    return sum(reused_prefix_tokens(requests)) / prompts if prompts else None


def _synthetic_load(load: Load, length_cv: float) -> list["Request"]:
    """Without --trace, what --replay replays: Poisson arrivals at --rate for --duration (600 s
    when absent) with the lengths the planner was given (Gamma, --length-cv), --cache-hit of
    each prompt cached. It checks the queueing model against a load of its own assumptions."""
    from pd_tools.workloads.traces import constant_rate, synthetic_requests

    duration = load.duration or SYNTHETIC_REPLAY_SECONDS
    arrivals = constant_rate(load.rate, duration)
    return list(synthetic_requests(arrivals, _lengths(load, length_cv), seed=0))


def _lengths(load: Load, length_cv: float) -> "TokenLengths":
    """The lengths the options describe: Gamma with --length-cv around the means, --cache-hit
    of each prompt cached."""
    from pd_tools.workloads.traces import TokenLengths

    return TokenLengths(
        load.input_tokens,
        load.output_tokens,
        length_cv,
        length_cv,
        cached_fraction=load.cache_hit or 0.0,
    )


def plan_text(result: "Plan", domain: "DomainFit | None" = None) -> str:
    """The plan's pools as a table, with the predictions and the money underneath, and how it
    sits in topology domains when asked."""
    rows = [
        {
            "role": pool.role,
            "profile": pool.candidate.hardware.name,
            "replicas": str(pool.replicas),
            "nodes/replica": str(pool.candidate.nodes_per_replica),
            "nodes": str(pool.nodes),
            "cards": str(pool.cards),
            "cost/h": f"{pool.cost_per_hour:.2f}",
        }
        for pool in result.pools
    ]
    # Only a plan whose replicas span several nodes (the weights need them) says how many.
    multi_node = any(pool.candidate.nodes_per_replica > 1 for pool in result.pools)
    nodes = ("nodes/replica", "nodes") if multi_node else ()
    payback = result.payback_hours
    lines = [
        tables.render(("role", "profile", "replicas", *nodes, "cards", "cost/h"), rows),
        f"predicted TTFT {result.ttft_ms:,.0f} ms (target {result.target.ttft_ms:,.0f}; KV "
        f"hand-off over {result.link_bytes_per_second / 1e9:g} GB/s inside it), "
        f"ITL {result.itl_ms:.1f} ms (target {result.target.itl_ms:,.0f})",
        f"cost {result.cost_per_hour:,.2f}/h, {result.cost_per_million_tokens:.3f} per million "
        f"tokens; revenue {result.revenue_per_hour:,.2f}/h",
        "payback " + (f"{payback:,.0f} h ({payback / 24:,.1f} days)" if payback else "n/a"),
    ]
    if result.infeasible_share > 0:
        lines.append(
            f"{result.infeasible_share:.1%} of requests miss the TTFT target even alone on an "
            "idle replica: not planned for"
        )
    if domain is not None:
        lines.append(domain_text(domain))
    return "\n".join(lines)


def domain_text(domain: "DomainFit") -> str:
    """Whether the plan fits one topology domain; if not, how many it needs and what one holds."""
    size = f"{domain.nodes} node(s) of each card type"
    if domain.domains <= 1:
        return f"fits one topology domain of {size}"
    lines = [f"needs {domain.domains} topology domains of {size}"]
    if domain.within_one is None:
        lines.append("within one domain no mix meets the SLO (spec.placement Required cannot)")
    else:
        lines += ["cheapest plan within one domain:", plan_text(domain.within_one)]
    return "\n".join(lines)


@click.command("plan", short_help="cheapest prefill/decode pools meeting an SLO")
@load_options
@click.option("--model", default="glm-4.5-fp8", help="model profile (core/hardware.py)")
@click.option("--model-name", default="zai-org/GLM-4.5-FP8", help="spec.model.name of the YAML")
@click.option("--name", default="planned", help="metadata.name of the YAML")
@click.option(
    "--ttft-ms",
    type=POSITIVE,
    default=6000.0,
    help="time-to-first-token target in milliseconds (the SLO's ttft.targetMilliseconds)",
)
@click.option(
    "--itl-ms",
    type=POSITIVE,
    default=20.0,
    help="inter-token latency target in milliseconds (the SLO's itl.targetMilliseconds)",
)
@click.option(
    "--share",
    type=SHARE,
    default=0.99,
    help="share of the requests (by length) that must meet the targets",
)
@click.option(
    "--length-cv",
    type=NON_NEGATIVE,
    default=0.0,
    help="without --trace: Gamma-distributed lengths with this CV (0: every request the mean)",
)
@click.option(
    "--candidate",
    multiple=True,
    default=DEFAULT_CANDIDATES,
    help=(
        "PROFILE[:price=P][:cards=N][:buy=P][:max=N][:nodes=N] (repeatable; cards per node of "
        "a replica; nodes per replica, raised until the weights fit)"
    ),
)
@click.option(
    "--replay",
    is_flag=True,
    help="replay --trace (else Poisson arrivals at --rate for --duration, 600 s by default) "
    "through the plan's pools in the engine simulator, adding replicas until the share "
    "holds (the queueing model assumes Poisson arrivals at the mean rate; a trace's replay "
    "takes prefix reuse from its hash_ids, not --cache-hit)",
)
@click.option(
    "--kv-link",
    type=POSITIVE,
    default=100.0,
    help="the KV fabric between prefill and decode in GB/s: each prompt's KV cache crosses it "
    "inside the TTFT (default 100, as the engine simulator; e.g. 0.19 for a congested TCP link)",
)
@click.option(
    "--domain-nodes",
    type=click.IntRange(min=1),
    default=None,
    help="nodes of each card type in one topology domain (a rack, an RDMA fabric; "
    "spec.placement): say whether the plan fits one, how many it needs, and the cheapest plan "
    "within one",
)
@click.option("--input-price", type=NON_NEGATIVE, default=8.0, help="per million input tokens")
@click.option("--cached-price", type=NON_NEGATIVE, default=2.0, help="per million cached tokens")
@click.option("--output-price", type=NON_NEGATIVE, default=8.0, help="per million output tokens")
@click.option(
    "--blended-price",
    type=NON_NEGATIVE,
    default=2.6,
    help="per million tokens of any kind; 0: use the three prices above",
)
@click.option(
    "-o",
    "--format",
    "output_format",
    type=click.Choice(["table", "yaml", "json"]),
    default="table",
    help="a table, a PDDeployment to apply (yaml), or the plan as JSON",
)
def plan(
    *,
    trace: str | None,
    start: float,
    duration: float | None,
    rate: float,
    input_tokens: float,
    output_tokens: float,
    cache_hit: float | None,
    model: str,
    model_name: str,
    name: str,
    ttft_ms: float,
    itl_ms: float,
    share: float,
    length_cv: float,
    candidate: tuple[str, ...],
    replay: bool,
    kv_link: float,
    domain_nodes: int | None,
    input_price: float,
    cached_price: float,
    output_price: float,
    blended_price: float,
    output_format: str,
) -> int:
    """Find the cheapest prefill and decode pools (mixed vendors allowed) that meet the TTFT and
    ITL targets for a trace or a synthetic load; exits 1 when no mix does."""
    import json

    import yaml

    from pd_operator.api.document import parse_pddeployment
    from pd_operator.core.hardware import HARDWARE_PROFILES, MODEL_PROFILES
    from pd_tools.planner.plan_replay import (
        cheapest_replayed,
        replay_shortfall,
        replay_table,
        step_line,
    )
    from pd_tools.planner.sizing import (
        Target,
        TokenPrices,
        deployment_document,
        fit_domain,
        no_plan_reason,
        parse_candidate,
    )
    from pd_tools.planner.sizing import plan as cheapest

    load = Load(
        trace=trace,
        start=start,
        duration=duration,
        rate=rate,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_hit=cache_hit,
    )
    profile = MODEL_PROFILES[known(model, "--model", MODEL_PROFILES, "model profile")]
    candidates = []
    for text in candidate:
        with about(f"--candidate {text}"):
            candidates.append(parse_candidate(text, HARDWARE_PROFILES))
    prices = TokenPrices(
        input_per_million=input_price,
        cached_per_million=cached_price,
        output_per_million=output_price,
        blended_per_million=blended_price if blended_price > 0 else None,
    )
    requests, hit = _plan_trace(load, profile)
    workload = _workload_from(load, length_cv, requests, hit)
    target = Target(ttft_ms, itl_ms, share)
    link = kv_link * 1e9
    replayed = None
    if replay:
        replayed = cheapest_replayed(
            workload,
            target,
            profile,
            candidates,
            requests or _synthetic_load(load, length_cv),
            model_name=model_name,
            prices=prices,
            progress=lambda step: print(f"pdctl plan: replayed {step_line(step)}", file=sys.stderr),
            link_bytes_per_second=link,
        )
        result = replayed.chosen.plan if replayed else None
    else:
        result = cheapest(
            workload, target, profile, candidates, prices=prices, link_bytes_per_second=link
        )
    if result is None:
        reason = no_plan_reason(workload, target, profile, candidates, link_bytes_per_second=link)
        print(f"pdctl plan: no candidate mix meets the SLO: {reason}", file=sys.stderr)
        return 1
    shortfall = replay_shortfall(replayed) if replayed is not None and not replayed.met else None
    domain = (
        None
        if domain_nodes is None
        else fit_domain(result, profile, candidates, domain_nodes, prices=prices)
    )
    if output_format == "yaml":
        # No document to apply from a plan that misses: a pipeline that ignores the exit
        # status would deploy it.
        if shortfall is None:
            document = deployment_document(result, name=name, model_name=model_name)
            # Never print a document the CRD would reject; what it could reject comes from flags.
            with about(f"--name {name!r} or --model-name {model_name!r}"):
                parse_pddeployment(document)
            print(yaml.safe_dump(document, sort_keys=False), end="")
    elif output_format == "json":
        summary = result.to_dict()
        if replayed is not None:
            summary["replay"] = replayed.to_dict()
        if domain is not None:
            summary["topology"] = domain.to_dict()
        print(json.dumps(summary, indent=2))
    else:
        print(plan_text(result, domain))
        if replayed is not None:
            print(replay_table(replayed))
        elif requests:
            print("checked by the queueing model only: --replay replays the trace through it")
    if shortfall is not None:
        print(f"pdctl plan: {shortfall}", file=sys.stderr)
        return 1
    return 0

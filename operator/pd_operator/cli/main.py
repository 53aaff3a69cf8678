"""`pdctl`: the pd-operator command line."""

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pd_operator import __version__
from pd_operator.cli.arguments import (
    UsageError,
    about,
    count,
    fraction,
    known,
    non_negative,
    port,
    positive,
    prices,
    share,
    tokens,
    wall_clock,
)

if TYPE_CHECKING:
    from pd_operator.api.spec import PDDeploymentSpec
    from pd_operator.core.hardware import ModelProfile
    from pd_operator.core.planner import Workload
    from pd_operator.sim.cluster import SimCluster
    from pd_operator.sim.offline import Cluster
    from pd_operator.sim.workload import Request, TokenLengths


# Where a pod finds its own namespace (the service account token's projected volume).
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _lease_namespace(args: argparse.Namespace) -> str | None:
    """The leader Lease's namespace; None without --leader-election."""
    if not args.leader_election:
        if args.leader_election_namespace:
            raise UsageError("--leader-election-namespace needs --leader-election")
        return None
    if args.leader_election_namespace:
        return str(args.leader_election_namespace)
    if POD_NAMESPACE_FILE.is_file():
        return POD_NAMESPACE_FILE.read_text().strip()
    raise UsageError("--leader-election outside a pod needs --leader-election-namespace NAMESPACE")


def _run(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server

    from pd_operator.adapters.kube import load_api_client
    from pd_operator.handlers.operator import OperatorConfig, OperatorState, run_operator

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = OperatorConfig(
        namespaces=args.namespace or [],
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        metrics_port=args.metrics_port,
        peering_name=args.peering,
        prometheus_url=args.prometheus_url,
        prometheus_bearer_token_file=args.prometheus_bearer_token_file,
        prometheus_ca_file=args.prometheus_ca_file,
        allow_link_local_prometheus=args.allow_link_local_prometheus,
        autoscale=not args.no_autoscale,
        count_other_pods=not args.ignore_other_pods,
        lease_namespace=_lease_namespace(args),
        lease_name=args.leader_election_id,
    )
    with about("--kubeconfig"):  # before anything listens: a bad config leaves nothing behind
        api = load_api_client(args.kubeconfig)
    if config.metrics_port:
        with about(f"--metrics-port {config.metrics_port}"):
            start_http_server(config.metrics_port)
    state = OperatorState(api, config)
    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    asyncio.run(run_operator(state, liveness_endpoint=liveness))
    if state.lost_leadership:
        print(
            "pdctl run: lost the leader lease; exiting to start again as a standby", file=sys.stderr
        )
        return 1
    return 0


def _sim_report(sim: "SimCluster", target: tuple[str, str], since_s: float) -> str:
    """One status line: Ready pods and the latencies of requests finished since `since_s`."""
    from pd_operator.sim.engine import Role

    now = sim.now_s()
    deployment = sim.deployment(*target)
    if deployment is None:
        return f"t={now:,.0f}s {target[0]}/{target[1]}: no Ready pod yet"
    with deployment.lock:
        ready = {role: deployment.serving(role) for role in Role}
        done = [r for r in deployment.records if r.finish_s > since_s]
    line = f"t={now:,.0f}s prefill {ready[Role.PREFILL]} decode {ready[Role.DECODE]} Ready"
    if not done:
        return f"{line}, no request finished"
    ttft = sorted(r.ttft_s for r in done)
    tpot = sorted(r.itl_mean_s for r in done if r.output_tokens > 1)
    line += f", {len(done) / (now - since_s):.2f} req/s, TTFT p50 {ttft[len(ttft) // 2]:.3f}s"
    line += f" p90 {ttft[len(ttft) * 9 // 10]:.3f}s"
    return f"{line}, TPOT p50 {tpot[len(tpot) // 2] * 1000:.1f}ms" if tpot else line


def _sim_cluster(args: argparse.Namespace) -> int:
    import math
    import time

    from pd_operator.adapters.kube import load_api_client
    from pd_operator.core.hardware import MODEL_PROFILES
    from pd_operator.sim.cluster import SimCluster, parse_load, parse_target
    from pd_operator.sim.metrics import SGLANG, VLLM
    from pd_operator.sim.profile import load_profile
    from pd_operator.sim.workload import ReplayOptions, TokenLengths

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    with about("--target"):
        target = parse_target(args.target)
    lengths = TokenLengths(args.input_tokens, args.output_tokens, args.length_cv, args.length_cv)
    replay = ReplayOptions(
        rate_scale=args.rate_scale, time_compression=args.trace_compression, seed=args.seed
    )
    with about("--load"):
        load = parse_load(
            args.load, lengths, arrival_cv=args.arrival_cv, seed=args.seed, replay=replay
        )
    with about(f"--profile {args.profile}"):
        profile = load_profile(args.profile)
    model = MODEL_PROFILES[known(args.model, "--model", MODEL_PROFILES, "model profile")]
    sd_file = None
    if args.prometheus_sd_dir:
        sd_file = Path(args.prometheus_sd_dir) / f"pd-sim-{profile.name}.json"
    with about("--kubeconfig"):
        api = load_api_client(args.kubeconfig)
    sim = SimCluster(
        api,
        profile,
        loads={target: load},
        model=model,
        time_scale=args.time_scale,
        sd_file=sd_file,
        dialect=SGLANG if args.engine == "sglang" else VLLM,
    )
    with sim:
        print(
            f"{profile.node_count} virtual nodes take pods; load {args.load} waits for a Ready "
            f"prefill and decode pod of {args.target}"
            + (f"; targets in {sd_file}" if sd_file else ""),
            flush=True,
        )
        end_s = args.duration if args.duration else math.inf
        since_s = 0.0
        try:
            while (left_s := end_s - sim.now_s()) > 0:
                time.sleep(min(args.report_seconds, left_s * args.time_scale))
                print(_sim_report(sim, target, since_s), flush=True)
                since_s = sim.now_s()
        except KeyboardInterrupt:
            pass
    return 0


def _add_sim(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    sim = commands.add_parser("sim", help="simulated clusters and engines")
    kinds = sim.add_subparsers(dest="sim_command", required=True)
    run = kinds.add_parser(
        "cluster",
        help="virtual nodes, mock scheduler and kubelet, engines behind Ready pool pods, a load",
        description="Register a cluster profile's nodes on an apiserver, schedule and run "
        "pods that name pd-mock-scheduler, serve engine metrics for every Ready pool pod and "
        "send a load to one PDDeployment, until Ctrl-C or --duration. Times are simulated "
        "seconds; --time-scale maps them to the wall clock.",
    )
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    run.add_argument("--profile", required=True, help="cluster profile YAML (config/clusters/)")
    run.add_argument(
        "--load",
        required=True,
        help="requests per simulated second: constant:RATE[:SECONDS], "
        "step:R1,R2,...:STEP_SECONDS, ramp:FROM,TO:SECONDS or trace:PATH "
        "(Mooncake JSONL, Azure CSV, ServeGen aggregate CSV)",
    )
    run.add_argument("--target", required=True, help="NAMESPACE/NAME of the PDDeployment")
    run.add_argument(
        "--prometheus-sd-dir", help="write file-SD targets to DIR/pd-sim-<profile>.json"
    )
    run.add_argument(
        "--time-scale",
        type=positive,
        default=1.0,
        help="wall seconds per simulated second (0.1: ten times faster)",
    )
    run.add_argument(
        "--duration",
        type=non_negative,
        default=0.0,
        help="simulated seconds to run (0: until Ctrl-C)",
    )
    run.add_argument("--model", default="glm-4.5-fp8", help="a model profile of core/hardware.py")
    run.add_argument("--engine", default="vllm", choices=["vllm", "sglang"], help="metric names")
    run.add_argument("--input-tokens", type=tokens, default=2000, help="mean prompt length")
    run.add_argument("--output-tokens", type=tokens, default=200, help="mean answer length")
    run.add_argument(
        "--length-cv", type=non_negative, default=1.0, help="CV of both lengths (0: fixed)"
    )
    run.add_argument("--arrival-cv", type=positive, default=1.0, help="1: Poisson, >1: bursty")
    run.add_argument(
        "--rate-scale", type=positive, default=1.0, help="trace: keep this many copies"
    )
    run.add_argument(
        "--trace-compression",
        type=positive,
        default=1.0,
        help="trace: replay this many times faster",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--report-seconds",
        type=positive,
        default=10.0,
        help="wall seconds between status lines",
    )
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(handler=_sim_cluster)


def _spec_from(path: str | None) -> "PDDeploymentSpec":
    """The `--spec` file's PDDeployment, or the articles' example without one."""
    from pd_operator.api.document import parse_pddeployment, read_yaml
    from pd_operator.sim.offline import example_document

    if not path:
        return parse_pddeployment(example_document()).spec
    with about(f"--spec {path}"):
        document = read_yaml(path)
        if not isinstance(document, dict):
            raise ValueError("not a PDDeployment document (want a YAML mapping)")
        return parse_pddeployment(document).spec


def _model_for(name: str | None, spec: "PDDeploymentSpec") -> "ModelProfile":
    from pd_operator.core.hardware import MODEL_PROFILES
    from pd_operator.core.learning import model_profile_for

    if name:
        return MODEL_PROFILES[known(name, "--model", MODEL_PROFILES, "model profile")]
    model = model_profile_for(spec.model.name)
    if model is None:
        raise UsageError(
            f"no model profile for spec.model.name {spec.model.name!r}: pass --model, one of "
            + ", ".join(sorted(MODEL_PROFILES))
        )
    return model


def _trace_requests(args: argparse.Namespace, warmup_s: float = 0.0) -> list["Request"]:
    """The `--trace` window's requests (after `warmup_s` of lead-in); an error when empty."""
    from pd_operator.sim.offline import load_trace
    from pd_operator.sim.workload import ReplayOptions

    options = ReplayOptions(
        start_s=args.start,
        duration_s=args.duration,
        rate_scale=getattr(args, "rate_scale", 1.0),
        time_compression=getattr(args, "time_compression", 1.0),
        seed=getattr(args, "seed", 0),
    )
    with about(f"--trace {args.trace}"):
        requests = load_trace(args.trace, options.with_warmup(warmup_s))
        if not requests:
            whole = load_trace(args.trace)
            if not whole:
                raise ValueError("the trace holds no request")
            span = f"{whole[-1].arrival_s:,.0f} s"
            window = f"[{args.start:g}, {args.start + args.duration:g})" if args.duration else ""
            raise ValueError(
                f"no request in the window --start {args.start:g}"
                + (f" --duration {args.duration:g} {window}" if window else "")
                + f"; the trace's last arrival is at {span}"
            )
    return requests


def _cluster_for(args: argparse.Namespace, spec: "PDDeploymentSpec") -> "Cluster":
    """`--cluster` with `--price`, or a cluster that fits every pool at its max."""
    from pd_operator.core.hardware import HARDWARE_PROFILES
    from pd_operator.sim.offline import Cluster, parse_cluster

    price_of = prices(args.price, "--price", HARDWARE_PROFILES)
    with about(f"--spec {args.spec}"):  # every pool must name a profile to be simulated
        fitting = Cluster.fitting(spec)
    with about("--cluster"):
        cluster = (
            parse_cluster(args.cluster, price_of)
            if args.cluster
            else Cluster(fitting.node_types, price_of)
        )
        if missing := cluster.missing_role(spec):
            raise ValueError(missing)  # it would run and serve nothing
    return cluster


def _simulate(args: argparse.Namespace) -> int:
    import json

    from pd_operator.core.learning import model_profile_for
    from pd_operator.sim.offline import (
        TABLE_COLUMNS,
        ProgressBar,
        Timing,
        check_policy_name,
        markdown_table,
        simulate,
        table_row,
    )
    from pd_operator.sim.workload import TokenLengths, constant_rate, synthetic_requests

    spec = _spec_from(args.spec)
    model = _model_for(args.model, spec)
    if model_profile_for(spec.model.name) is None:
        # The operator seeds its capacity from spec.model.name, and the baselines and the
        # starting sizes need a profile too: simulate the spec as naming --model, and say so.
        print(
            f"pdctl simulate: spec.model.name {spec.model.name!r} has no model profile;"
            f" simulated as {model.name} (--model), which also seeds the operator's capacity",
            file=sys.stderr,
        )
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"name": model.name})})
    policies = args.policy or ["pd-operator"]
    for name in policies:  # all checked before any runs: a late typo would waste the others
        with about("--policy"):
            check_policy_name(name)
    # Checked before the runs, which may take minutes, so that their results are not lost.
    if args.output and not Path(args.output).parent.is_dir():
        raise UsageError(f"--output: no folder {Path(args.output).parent} to write into")
    if args.plot and Path(args.plot).exists() and not Path(args.plot).is_dir():
        raise UsageError(f"--plot: {args.plot} is not a folder")
    if args.trace:
        requests = _trace_requests(args, args.warmup)
    else:
        lengths = TokenLengths(
            args.input_tokens, args.output_tokens, 1.0, 1.0, cached_fraction=args.cache_hit or 0.0
        )
        profile = constant_rate(args.rate, (args.duration or 600.0) + args.warmup)
        requests = list(synthetic_requests(profile, lengths, seed=args.seed))
        if not requests:
            raise UsageError(
                f"--rate {args.rate:g} over --duration {args.duration or 600:g} s sends no "
                "request: raise either"
            )
    cluster = _cluster_for(args, spec)
    timing = Timing(
        scrape_interval_s=args.scrape_interval,
        rate_window_s=args.rate_window,
        decision_interval_s=args.decision_interval,
        load_seconds=args.load_seconds,
        # --clock names the measured window's start, which the replay reaches after the warm-up.
        clock_s=0.0 if args.clock is None else args.clock - args.warmup,
    )
    if spec.scaling.schedules and args.clock is None:
        print(
            "pdctl simulate: spec.scaling.schedules read the wall clock, and without --clock "
            "the replay starts at 1970-01-01T00:00:00Z (a Thursday)",
            file=sys.stderr,
        )
    # A bar redrawn in place on a terminal; `--progress` forces a line per tenth elsewhere.
    bar = ProgressBar(sys.stderr) if args.progress or sys.stderr.isatty() else None
    results = []
    for name in policies:
        results.append(
            simulate(
                spec,
                requests,
                name,
                model=model,
                cluster=cluster,
                timing=timing,
                warmup_s=args.warmup,
                progress=bar,
                routing=args.routing,
            )
        )
        if bar:
            bar.close()
    if args.plot:
        from pd_operator.sim.offline_plot import plot_result

        for result in results:
            image = Path(args.plot) / f"simulate-{result.policy.replace(':', '-')}.png"
            print(f"plot: {plot_result(result, spec, image)}", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(json.dumps([r.to_dict() for r in results], indent=1))
    if args.format == "json":
        summaries = [
            r.summary() | ({"changes": r.changes()} if args.explain else {}) for r in results
        ]
        print(json.dumps(summaries, indent=2))
    else:
        print(markdown_table([table_row(r) for r in results], TABLE_COLUMNS))
        if args.explain:
            for result in results:
                print(f"\n{result.policy}: scale changes (seconds from the window's start)")
                print("\n".join(f"  {line}" for line in result.change_lines()) or "  none")
    return 0


PLAN_LENGTH_SAMPLES = 4000  # lengths drawn for `pdctl plan --length-cv`
SYNTHETIC_REPLAY_SECONDS = 600.0  # `pdctl plan --replay` without --trace or --duration


def _workload_from(
    args: argparse.Namespace, requests: list["Request"], cache_hit: float
) -> "Workload":
    """The planner's workload: `requests` (a trace's window) or the synthetic flags."""
    import random

    from pd_operator.core.planner import Workload

    if not requests:
        if args.length_cv <= 0:
            return Workload(args.rate, args.input_tokens, args.output_tokens, cache_hit)
        # A fixed sample of Gamma lengths (seed 0) stands for the distribution.
        rng = random.Random(0)
        pairs = [_plan_lengths(args).sample(rng)[:2] for _ in range(PLAN_LENGTH_SAMPLES)]
        return Workload.from_lengths(args.rate, pairs, cache_hit)
    span = max(1.0, requests[-1].arrival_s - requests[0].arrival_s)
    pairs = [(r.input_tokens, r.output_tokens) for r in requests]
    return Workload.from_lengths(len(requests) / span, pairs, cache_hit)


def _plan_trace(args: argparse.Namespace, model: "ModelProfile") -> tuple[list["Request"], float]:
    """The --trace window's requests the model takes (none without --trace), and the prefix-
    cache hit rate to plan with: --cache-hit, else the trace's own reuse, else 0."""
    from pd_operator.sim.offline import admitted

    trace = _trace_requests(args) if args.trace else []
    requests, refused = admitted(trace, model.max_context_tokens)
    if refused:
        print(
            f"pdctl plan: {len(refused):,} requests of the trace exceed {model.name}'s context "
            f"length ({model.max_context_tokens:,} tokens with the answer): left out, as the "
            "engines refuse them",
            file=sys.stderr,
        )
    cache_hit = args.cache_hit
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
    from pd_operator.sim.workload import reused_prefix_tokens

    if not any(r.hash_ids for r in requests):
        return None
    prompts = sum(r.input_tokens for r in requests)
    return sum(reused_prefix_tokens(requests)) / prompts if prompts else None


def _synthetic_load(args: argparse.Namespace) -> list["Request"]:
    """Without --trace, what --replay replays: Poisson arrivals at --rate for --duration (600 s
    when absent) with the lengths the planner was given (Gamma, --length-cv), --cache-hit of
    each prompt cached. It checks the queueing model against a load of its own assumptions."""
    from pd_operator.sim.workload import constant_rate, synthetic_requests

    duration = args.duration or SYNTHETIC_REPLAY_SECONDS
    return list(synthetic_requests(constant_rate(args.rate, duration), _plan_lengths(args), seed=0))


def _plan_lengths(args: argparse.Namespace) -> "TokenLengths":
    """The lengths `pdctl plan`'s flags describe: Gamma with --length-cv around the means,
    --cache-hit of each prompt cached."""
    from pd_operator.sim.workload import TokenLengths

    return TokenLengths(
        args.input_tokens,
        args.output_tokens,
        args.length_cv,
        args.length_cv,
        cached_fraction=args.cache_hit or 0.0,
    )


def _plan(args: argparse.Namespace) -> int:
    import json

    import yaml

    from pd_operator.api.document import parse_pddeployment
    from pd_operator.core.hardware import HARDWARE_PROFILES, MODEL_PROFILES
    from pd_operator.core.planner import (
        Target,
        TokenPrices,
        deployment_document,
        no_plan_reason,
        parse_candidate,
        plan,
        plan_table,
    )
    from pd_operator.sim.plan_replay import (
        cheapest_replayed,
        replay_shortfall,
        replay_table,
        step_line,
    )

    model = MODEL_PROFILES[known(args.model, "--model", MODEL_PROFILES, "model profile")]
    candidates = []
    for text in args.candidate or ["mtt-s5000", "h200", "h20"]:
        with about(f"--candidate {text}"):
            candidates.append(parse_candidate(text, HARDWARE_PROFILES))
    prices = TokenPrices(
        input_per_million=args.input_price,
        cached_per_million=args.cached_price,
        output_per_million=args.output_price,
        blended_per_million=args.blended_price if args.blended_price > 0 else None,
    )
    requests, cache_hit = _plan_trace(args, model)
    workload = _workload_from(args, requests, cache_hit)
    target = Target(args.ttft_ms, args.itl_ms, args.share)
    replayed = None
    if args.replay:
        replayed = cheapest_replayed(
            workload,
            target,
            model,
            candidates,
            requests or _synthetic_load(args),
            model_name=args.model_name,
            prices=prices,
            progress=lambda step: print(f"pdctl plan: replayed {step_line(step)}", file=sys.stderr),
        )
        result = replayed.chosen.plan if replayed else None
    else:
        result = plan(workload, target, model, candidates, prices=prices)
    if result is None:
        reason = no_plan_reason(workload, target, model, candidates)
        print(f"pdctl plan: no candidate mix meets the SLO: {reason}", file=sys.stderr)
        return 1
    shortfall = replay_shortfall(replayed) if replayed is not None and not replayed.met else None
    if args.format == "yaml":
        # No document to apply from a plan that misses: a pipeline that ignores the exit
        # status would deploy it.
        if shortfall is None:
            document = deployment_document(result, name=args.name, model_name=args.model_name)
            # Never print a document the CRD would reject; what it could reject comes from flags.
            with about(f"--name {args.name!r} or --model-name {args.model_name!r}"):
                parse_pddeployment(document)
            print(yaml.safe_dump(document, sort_keys=False), end="")
    elif args.format == "json":
        document = result.to_dict()
        if replayed is not None:
            document["replay"] = replayed.to_dict()
        print(json.dumps(document, indent=2))
    else:
        print(plan_table(result))
        if replayed is not None:
            print(replay_table(replayed))
        elif requests:
            print("checked by the queueing model only: --replay replays the trace through it")
    if shortfall is not None:
        print(f"pdctl plan: {shortfall}", file=sys.stderr)
        return 1
    return 0


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", help="Mooncake .jsonl, Azure or ServeGen CSV trace")
    parser.add_argument("--start", type=non_negative, default=0.0, help="trace seconds to skip")
    parser.add_argument("--duration", type=positive, help="seconds of trace or synthetic load")
    parser.add_argument("--rate", type=positive, default=1.0, help="synthetic requests per second")
    parser.add_argument("--input-tokens", type=tokens, default=8000.0, help="mean prompt length")
    parser.add_argument("--output-tokens", type=tokens, default=300.0, help="mean output length")
    parser.add_argument(
        "--cache-hit",
        type=fraction,
        help="prefix-cache hit rate (default 0; plan --trace with block hashes: the trace's own)",
    )


def _add_simulate(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from pd_operator.sim.engine import ROUTINGS  # pure Python, no I/O: cheap to import

    sim = commands.add_parser(
        "simulate", help="replay a trace through the engine simulator with a policy in the loop"
    )
    sim.add_argument("--spec", help="PDDeployment YAML (default: S5000 prefill, H200 decode)")
    sim.add_argument("--model", help="model profile (default: from spec.model.name)")
    _add_load_options(sim)
    sim.add_argument("--rate-scale", type=positive, default=1.0, help="multiply the trace's rate")
    sim.add_argument(
        "--time-compression",
        type=positive,
        default=1.0,
        help="replay the trace this many times faster",
    )
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument(
        "--policy",
        action="append",
        help=(
            "pd-operator, static-peak, hpa, dynamo-sla[:arima], llm-d-slo, oracle, prescient"
            " (repeatable)"
        ),
    )
    sim.add_argument("--cluster", help="nodes per profile, e.g. h200=4x8,mtt-s5000=4x8")
    sim.add_argument("--price", action="append", help="card-hour price, e.g. h200=3.5")
    sim.add_argument("--scrape-interval", type=positive, default=15.0, help="seconds")
    sim.add_argument("--rate-window", type=positive, help="seconds (default: spec windowSeconds)")
    sim.add_argument("--decision-interval", type=positive, help="seconds (default: spec)")
    sim.add_argument(
        "--load-seconds", type=non_negative, help="model-load delay (default: profile)"
    )
    sim.add_argument(
        "--routing",
        choices=ROUTINGS,
        default="prefix-aware",
        help="how the router picks a prefill replica: where the request's prefix is cached "
        "unless that queue costs more (prefix-aware), or the least outstanding tokens",
    )
    sim.add_argument(
        "--warmup",
        type=non_negative,
        default=0.0,
        help="seconds of load replayed before the window and not counted (policies start warm); "
        "a trace with less before --start has its window moved to this many seconds in",
    )
    sim.add_argument(
        "--clock",
        type=wall_clock,
        help="wall-clock time of the measured window's start, ISO 8601 (UTC without an "
        "offset), e.g. 2026-12-01T08:30:00+08:00: the time spec.scaling.schedules read "
        "(default: the replay starts at 1970-01-01T00:00:00Z)",
    )
    sim.add_argument("-o", "--format", choices=["table", "json"], default="table")
    sim.add_argument("--output", help="write the full JSON result (per request) here")
    sim.add_argument(
        "--plot", metavar="DIR", help="write a PNG per policy: load, replicas, TTFT/ITL vs targets"
    )
    sim.add_argument(
        "--progress",
        action="store_true",
        help="report progress on stderr also when it is not a terminal (a bar when it is)",
    )
    sim.add_argument(
        "--explain",
        action="store_true",
        help="also list each policy's scale changes with its reason for each",
    )
    sim.set_defaults(handler=_simulate)


def _add_plan(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    plan = commands.add_parser("plan", help="cheapest prefill/decode pools meeting an SLO")
    _add_load_options(plan)
    plan.add_argument("--model", default="glm-4.5-fp8", help="model profile")
    plan.add_argument("--model-name", default="zai-org/GLM-4.5-FP8", help="spec.model.name")
    plan.add_argument("--name", default="planned", help="metadata.name of the YAML")
    plan.add_argument("--ttft-ms", type=positive, default=6000.0)
    plan.add_argument("--itl-ms", type=positive, default=20.0)
    plan.add_argument(
        "--share",
        type=share,
        default=0.99,
        help="share of the requests (by length) that must meet the targets",
    )
    plan.add_argument(
        "--length-cv",
        type=non_negative,
        default=0.0,
        help="without --trace: Gamma-distributed lengths with this CV (0: every request the mean)",
    )
    plan.add_argument(
        "--candidate",
        action="append",
        help="PROFILE[:price=P][:cards=N][:buy=P][:max=N] (repeatable)",
    )
    plan.add_argument(
        "--replay",
        action="store_true",
        help="replay --trace (else Poisson arrivals at --rate for --duration, 600 s by default) "
        "through the plan's pools in the engine simulator, adding replicas until the share "
        "holds (the queueing model assumes Poisson arrivals at the mean rate; a trace's replay "
        "takes prefix reuse from its hash_ids, not --cache-hit)",
    )
    plan.add_argument("--input-price", type=non_negative, default=8.0, help="per million tokens")
    plan.add_argument("--cached-price", type=non_negative, default=2.0, help="per million tokens")
    plan.add_argument("--output-price", type=non_negative, default=8.0, help="per million tokens")
    plan.add_argument(
        "--blended-price",
        type=non_negative,
        default=2.6,
        help="per million tokens; 0: use the others",
    )
    plan.add_argument("-o", "--format", choices=["table", "yaml", "json"], default="table")
    plan.set_defaults(handler=_plan)


def _demo(args: argparse.Namespace) -> int:
    from pd_operator.sim.demo import TRACE, DemoOptions, run_demo

    if args.load == "trace" and not TRACE.exists():
        raise UsageError(
            f"--load trace: {TRACE} is not there; --load slice replays the shipped part"
        )
    # The table is the demo's output; the operator's and kopf's logs would scroll it away (the
    # demo writes them to operator.log in its output folder).
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.ERROR)
    options = DemoOptions(
        duration_s=args.duration,
        load=args.load,
        plot=not args.no_plot,
        output=Path(args.output) if args.output else None,
    )
    return run_demo(options)


def _add_demo(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    demo = commands.add_parser(
        "demo",
        help="the closed loop on one machine: control plane, Prometheus, simulated S5000/H200 "
        "cluster with engine and router processes, operator, a load with a prefill surge and a "
        "decode step sent through the endpoint, a live table",
    )
    demo.add_argument("--duration", type=positive, default=180.0, help="wall seconds of load")
    demo.add_argument(
        "--load",
        choices=("auto", "trace", "slice", "synthetic"),
        default="auto",
        help="trace: the Mooncake conversation trace in ../shared/traces; slice: its first 300 "
        "requests, shipped in data/traces; auto: the trace if it is there, else the slice; "
        "synthetic: Poisson arrivals of 6,000-token prompts",
    )
    demo.add_argument("--no-plot", action="store_true", help="no demo.png")
    demo.add_argument(
        "--output",
        help="folder for the summary, table, requests, decisions, logs and plot "
        "(default: a new pd-demo-YYYYmmdd-HHMMSS in the temporary folder)",
    )
    demo.add_argument("-v", "--verbose", action="store_true")
    demo.set_defaults(handler=_demo)


def build_parser() -> argparse.ArgumentParser:
    """All pdctl subcommands."""
    parser = argparse.ArgumentParser(prog="pdctl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pdctl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the operator")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    run.add_argument("--namespace", action="append", help="watch only this namespace (repeatable)")
    run.add_argument("--workers", type=count, default=4, help="concurrent reconciles")
    run.add_argument(
        "--resync-seconds", type=positive, default=300.0, help="full resync period in seconds"
    )
    run.add_argument("--metrics-port", type=port, default=8000, help="0 disables /metrics")
    run.add_argument("--health-port", type=port, default=8080, help="0 disables /healthz")
    run.add_argument(
        "--peering", help="kopf peering name for HA (default: standalone, one replica)"
    )
    run.add_argument(
        "--leader-election",
        action="store_true",
        help="elect a leader on a Lease: only the replica holding it reconciles and scales, "
        "the others wait with warm caches (default: no election, run one replica)",
    )
    run.add_argument(
        "--leader-election-namespace",
        metavar="NAMESPACE",
        help="the Lease's namespace (default: the operator pod's own)",
    )
    run.add_argument(
        "--leader-election-id",
        default="pd-operator",
        help="the Lease's name (default: %(default)s)",
    )
    run.add_argument(
        "--prometheus-url", help="Prometheus for objects without spec.scaling.prometheus.url"
    )
    run.add_argument(
        "--prometheus-bearer-token-file",
        help="bearer token for --prometheus-url, re-read every minute (e.g. a mounted Secret)",
    )
    run.add_argument(
        "--prometheus-ca-file", help="PEM CA bundle that signs --prometheus-url's certificate"
    )
    run.add_argument(
        "--allow-link-local-prometheus",
        action="store_true",
        help="let spec.scaling.prometheus.url be a link-local or cloud metadata address "
        "(refused by default: the user who writes the spec chooses where the operator calls)",
    )
    run.add_argument("--no-autoscale", action="store_true", help="reconcile only, never scale")
    run.add_argument(
        "--ignore-other-pods",
        action="store_true",
        help="watch pool pods only; free capacity then ignores other workloads on the nodes "
        "(for clusters whose accelerator nodes run nothing else)",
    )
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(handler=_run)
    _add_sim(commands)
    _add_simulate(commands)
    _add_plan(commands)
    _add_demo(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pdctl`. Input it cannot use exits 2 with one line naming the flag."""
    args = build_parser().parse_args(argv)
    try:
        result: int = args.handler(args)
    except UsageError as error:
        command = " ".join(filter(None, (args.command, getattr(args, "sim_command", None))))
        print(f"pdctl {command}: {error}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())

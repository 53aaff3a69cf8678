"""`pdctl sim`: the simulators. `sim replay` replays a load offline with a policy in the loop;
`sim cluster` runs virtual nodes and engines against a real apiserver."""

import dataclasses
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pd_operator.cli.arguments import (
    NON_NEGATIVE,
    POSITIVE,
    TOKENS,
    WALL_CLOCK,
    AnyCase,
    UsageError,
    about,
    known,
    prices,
)
from pd_tools.cli import deprecated, tables
from pd_tools.cli.workload import (
    RATE_SCALE_HELP,
    SEED_HELP,
    TRACE_COMPRESSION_HELP,
    Load,
    load_options,
    trace_requests,
)
from pd_tools.enginesim.engine import ROUTINGS, Routing  # pure Python, no I/O: cheap to import

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pd_operator.api.spec import PDDeploymentSpec
    from pd_operator.core.hardware import ModelProfile
    from pd_tools.replay.cluster import Cluster
    from pd_tools.replay.results import SimResult
    from pd_tools.simcluster.cluster import SimCluster

POLICIES = "pd-operator, static-peak, hpa, dynamo-sla[:arima], llm-d-slo, oracle, prescient"
ENGINES = ("VLLM", "SGLang")  # the API's spelling (spec.model.engine)


@click.group("sim", short_help="simulated clusters and engines")
def sim() -> None:
    """The simulators: replay a load offline (replay) or run a simulated cluster (cluster)."""


def _status_line(cluster: "SimCluster", target: tuple[str, str], since_s: float) -> str:
    """One status line: Ready pods and the latencies of requests finished since `since_s`."""
    from pd_tools.enginesim.engine import Role

    now = cluster.now_s()
    deployment = cluster.deployment(*target)
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


@sim.command(
    "cluster",
    short_help="virtual nodes, mock scheduler and kubelet, engines behind Ready pool pods, a load",
)
@click.option("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
@click.option("--profile", required=True, help="cluster profile YAML (config/clusters/)")
@click.option(
    "--load",
    required=True,
    help="requests per simulated second: constant:RATE[:SECONDS], "
    "step:R1,R2,...:STEP_SECONDS, ramp:FROM,TO:SECONDS or trace:PATH "
    "(Mooncake JSONL, Azure CSV, ServeGen aggregate CSV)",
)
@click.option("--target", required=True, help="NAMESPACE/NAME of the PDDeployment")
@click.option("--prometheus-sd-dir", help="write file-SD targets to DIR/pd-sim-<profile>.json")
@click.option(
    "--time-scale",
    type=POSITIVE,
    default=1.0,
    help="wall seconds per simulated second, for the whole cluster (0.1: ten times faster)",
)
@click.option(
    "--duration", type=NON_NEGATIVE, default=0.0, help="simulated seconds to run (0: until Ctrl-C)"
)
@click.option("--model", default="glm-4.5-fp8", help="a model profile of core/hardware.py")
@click.option(
    "--engine",
    type=AnyCase(ENGINES),
    default="VLLM",
    help="whose metric names the engines serve (spec.model.engine; any case)",
)
@click.option("--input-tokens", type=TOKENS, default=2000.0, help="mean prompt length")
@click.option("--output-tokens", type=TOKENS, default=200.0, help="mean answer length")
@click.option("--length-cv", type=NON_NEGATIVE, default=1.0, help="CV of both lengths (0: fixed)")
@click.option("--arrival-cv", type=POSITIVE, default=1.0, help="1: Poisson, >1: bursty")
@click.option("--rate-scale", type=POSITIVE, default=1.0, help=RATE_SCALE_HELP)
@click.option("--trace-compression", type=POSITIVE, default=1.0, help=TRACE_COMPRESSION_HELP)
@click.option("--seed", type=int, default=0, help=SEED_HELP)
@click.option(
    "--report-seconds", type=POSITIVE, default=10.0, help="wall seconds between status lines"
)
@click.option("-v", "--verbose", is_flag=True, help="log at DEBUG instead of WARNING")
def cluster(
    *,
    kubeconfig: str | None,
    profile: str,
    load: str,
    target: str,
    prometheus_sd_dir: str | None,
    time_scale: float,
    duration: float,
    model: str,
    engine: str,
    input_tokens: float,
    output_tokens: float,
    length_cv: float,
    arrival_cv: float,
    rate_scale: float,
    trace_compression: float,
    seed: int,
    report_seconds: float,
    verbose: bool,
) -> int:
    """Register a cluster profile's nodes on an apiserver, schedule and run pods that name
    pd-mock-scheduler, serve engine metrics for every Ready pool pod and send a load to one
    PDDeployment, until Ctrl-C or --duration. Times are simulated seconds; --time-scale maps
    them to the wall clock."""
    import math
    import time

    from pd_operator.adapters.kube import load_api_client
    from pd_operator.core.hardware import MODEL_PROFILES
    from pd_tools.enginesim.metrics import SGLANG, VLLM
    from pd_tools.simcluster.cluster import SimCluster, parse_load, parse_target
    from pd_tools.simcluster.profile import load_profile
    from pd_tools.workloads.traces import ReplayOptions, TokenLengths

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    with about("--target"):
        where = parse_target(target)
    lengths = TokenLengths(input_tokens, output_tokens, length_cv, length_cv)
    replay = ReplayOptions(rate_scale=rate_scale, time_compression=trace_compression, seed=seed)
    with about("--load"):
        requests = parse_load(load, lengths, arrival_cv=arrival_cv, seed=seed, replay=replay)
    with about(f"--profile {profile}"):
        cluster_profile = load_profile(profile)
    model_profile = MODEL_PROFILES[known(model, "--model", MODEL_PROFILES, "model profile")]
    sd_file = None
    if prometheus_sd_dir:
        sd_file = Path(prometheus_sd_dir) / f"pd-sim-{cluster_profile.name}.json"
    with about("--kubeconfig"):
        api = load_api_client(kubeconfig)
    simulated = SimCluster(
        api,
        cluster_profile,
        loads={where: requests},
        model=model_profile,
        time_scale=time_scale,
        sd_file=sd_file,
        dialect=SGLANG if engine == "SGLang" else VLLM,
    )
    with simulated:
        print(
            f"{cluster_profile.node_count} virtual nodes take pods; load {load} waits for a "
            f"Ready prefill and decode pod of {target}"
            + (f"; targets in {sd_file}" if sd_file else ""),
            flush=True,
        )
        end_s = duration if duration else math.inf
        since_s = 0.0
        try:
            while (left_s := end_s - simulated.now_s()) > 0:
                time.sleep(min(report_seconds, left_s * time_scale))
                print(_status_line(simulated, where, since_s), flush=True)
                since_s = simulated.now_s()
        except KeyboardInterrupt:
            pass
    return 0


def _spec_from(path: str | None) -> "PDDeploymentSpec":
    """The `--spec` file's PDDeployment, or the articles' example without one."""
    from pd_operator.api.document import parse_pddeployment, read_yaml
    from pd_tools.replay.example import example_document

    if not path:
        return parse_pddeployment(example_document()).spec
    with about(f"--spec {path}"):
        document = read_yaml(path)
        if not isinstance(document, dict):
            raise ValueError("not a PDDeployment document (want a YAML mapping)")
        return parse_pddeployment(document).spec


def _model_for(name: str | None, spec: "PDDeploymentSpec") -> "ModelProfile":
    from pd_operator.core.hardware import MODEL_PROFILES
    from pd_operator.core.profiles import model_profile_for

    if name:
        return MODEL_PROFILES[known(name, "--model", MODEL_PROFILES, "model profile")]
    model = model_profile_for(spec.model.name)
    if model is None:
        raise UsageError(
            f"no model profile for spec.model.name {spec.model.name!r}: pass --model, one of "
            + ", ".join(sorted(MODEL_PROFILES))
        )
    return model


def _cluster_for(
    cluster: str | None, price: tuple[str, ...], spec_path: str | None, spec: "PDDeploymentSpec"
) -> "Cluster":
    """`--cluster` with `--price`, or a cluster that fits every pool at its max."""
    from pd_operator.core.hardware import HARDWARE_PROFILES
    from pd_tools.replay.cluster import Cluster, parse_cluster

    price_of = prices(price, "--price", HARDWARE_PROFILES)
    with about(f"--spec {spec_path}"):  # every pool must name a profile to be simulated
        fitting = Cluster.fitting(spec)
    with about("--cluster"):
        nodes = (
            parse_cluster(cluster, price_of) if cluster else Cluster(fitting.node_types, price_of)
        )
        if missing := nodes.missing_role(spec):
            raise ValueError(missing)  # it would run and serve nothing
    return nodes


@sim.command(
    "replay",
    cls=deprecated.Command,
    renamed={"--time-compression": "--trace-compression"},
    short_help="replay a trace through the engine simulator with a policy in the loop",
)
@click.option("--spec", help="PDDeployment YAML (default: S5000 prefill, H200 decode)")
@click.option("--model", help="model profile (default: from spec.model.name)")
@load_options
@click.option("--rate-scale", type=POSITIVE, default=1.0, help=RATE_SCALE_HELP)
@click.option("--trace-compression", type=POSITIVE, default=1.0, help=TRACE_COMPRESSION_HELP)
@click.option("--seed", type=int, default=0, help=SEED_HELP)
@click.option("--policy", multiple=True, default=("pd-operator",), help=f"{POLICIES} (repeatable)")
@click.option("--cluster", help="nodes per profile, e.g. h200=4x8,mtt-s5000=4x8")
@click.option("--price", multiple=True, help="card-hour price, e.g. h200=3.5 (repeatable)")
@click.option(
    "--kv-link",
    type=POSITIVE,
    help="the KV fabric between prefill and decode in GB/s (default 100, the engine "
    "simulator's); e.g. 0.19 for a congested TCP link",
)
@click.option(
    "--scrape-interval", type=POSITIVE, default=15.0, help="seconds between metric scrapes"
)
@click.option(
    "--rate-window", type=POSITIVE, help="rate window in seconds (default: spec windowSeconds)"
)
@click.option(
    "--decision-interval",
    type=POSITIVE,
    help="seconds between scaling decisions (default: spec intervalSeconds)",
)
@click.option(
    "--load-seconds", type=NON_NEGATIVE, help="model-load delay in seconds (default: profile)"
)
@click.option(
    "--routing",
    type=click.Choice(ROUTINGS),
    default="prefix-aware",
    help="how the router picks a prefill replica: where the request's prefix is cached "
    "unless that queue costs more (prefix-aware), or the least outstanding tokens",
)
@click.option(
    "--warmup",
    type=NON_NEGATIVE,
    default=0.0,
    help="seconds of load replayed before the window and not counted (policies start warm); "
    "a trace with less before --start has its window moved to this many seconds in",
)
@click.option(
    "--clock",
    type=WALL_CLOCK,
    help="wall-clock time of the measured window's start, ISO 8601 (UTC without an "
    "offset), e.g. 2026-12-01T08:30:00+08:00: the time spec.scaling.schedules read "
    "(default: the replay starts at 1970-01-01T00:00:00Z)",
)
@click.option(
    "-o",
    "--format",
    "output_format",
    type=click.Choice(["table", "json"]),
    default="table",
    help="print a table of the policies, or their summaries as JSON",
)
@click.option("--output", help="write the full JSON result (per request) to this file")
@click.option(
    "--plot",
    metavar="DIR",
    help="write a PNG per policy into DIR: load, replicas, TTFT/ITL vs targets",
)
@click.option(
    "--progress",
    is_flag=True,
    help="report progress on stderr also when it is not a terminal (a bar when it is)",
)
@click.option(
    "--explain", is_flag=True, help="also list each policy's scale changes with its reason for each"
)
def replay(
    *,
    spec: str | None,
    model: str | None,
    trace: str | None,
    start: float,
    duration: float | None,
    rate: float,
    input_tokens: float,
    output_tokens: float,
    cache_hit: float | None,
    rate_scale: float,
    trace_compression: float,
    seed: int,
    policy: tuple[str, ...],
    cluster: str | None,
    kv_link: float | None,
    price: tuple[str, ...],
    scrape_interval: float,
    rate_window: float | None,
    decision_interval: float | None,
    load_seconds: float | None,
    routing: Routing,
    warmup: float,
    clock: float | None,
    output_format: str,
    output: str | None,
    plot: str | None,
    progress: bool,
    explain: bool,
) -> int:
    """Replay a trace or a synthetic load through the engine simulator with each --policy in
    the loop, and compare them: SLO attainment, card-hours, cost, scale actions."""
    import json

    from pd_operator.core.profiles import model_profile_for
    from pd_tools.replay.offline import Timing, check_policy_name, simulate
    from pd_tools.replay.progress import ProgressBar
    from pd_tools.workloads.traces import TokenLengths, constant_rate, synthetic_requests

    where = click.get_current_context().command_path
    load = Load(
        trace=trace,
        start=start,
        duration=duration,
        rate=rate,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_hit=cache_hit,
    )
    deployment = _spec_from(spec)
    profile = _model_for(model, deployment)
    if model_profile_for(deployment.model.name) is None:
        # The operator seeds its capacity from spec.model.name, and the baselines and the
        # starting sizes need a profile too: simulate the spec as naming --model, and say so.
        print(
            f"{where}: spec.model.name {deployment.model.name!r} has no model profile;"
            f" simulated as {profile.name} (--model), which also seeds the operator's capacity",
            file=sys.stderr,
        )
        renamed = deployment.model.model_copy(update={"name": profile.name})
        deployment = deployment.model_copy(update={"model": renamed})
    for name in policy:  # all checked before any runs: a late typo would waste the others
        with about("--policy"):
            check_policy_name(name)
    # Checked before the runs, which may take minutes, so that their results are not lost.
    if output and not Path(output).parent.is_dir():
        raise UsageError(f"--output: no folder {Path(output).parent} to write into")
    if plot and Path(plot).exists() and not Path(plot).is_dir():
        raise UsageError(f"--plot: {plot} is not a folder")
    if trace:
        requests = trace_requests(
            trace,
            load,
            warmup_s=warmup,
            rate_scale=rate_scale,
            trace_compression=trace_compression,
            seed=seed,
        )
    else:
        lengths = TokenLengths(
            input_tokens, output_tokens, 1.0, 1.0, cached_fraction=cache_hit or 0.0
        )
        arrivals = constant_rate(rate, (duration or 600.0) + warmup)
        requests = list(synthetic_requests(arrivals, lengths, seed=seed))
        if not requests:
            raise UsageError(
                f"--rate {rate:g} over --duration {duration or 600:g} s sends no "
                "request: raise either"
            )
    nodes = _cluster_for(cluster, price, spec, deployment)
    if kv_link is not None:
        nodes = dataclasses.replace(nodes, link_bytes_per_second=kv_link * 1e9)
    timing = Timing(
        scrape_interval_s=scrape_interval,
        rate_window_s=rate_window,
        decision_interval_s=decision_interval,
        load_seconds=load_seconds,
        # --clock names the measured window's start, which the replay reaches after the warm-up.
        clock_s=0.0 if clock is None else clock - warmup,
    )
    if deployment.scaling.schedules and clock is None:
        print(
            f"{where}: spec.scaling.schedules read the wall clock, and without --clock "
            "the replay starts at 1970-01-01T00:00:00Z (a Thursday)",
            file=sys.stderr,
        )
    # A bar redrawn in place on a terminal; `--progress` forces a line per tenth elsewhere.
    bar = ProgressBar(sys.stderr) if progress or sys.stderr.isatty() else None
    results = []
    for name in policy:
        results.append(
            simulate(
                deployment,
                requests,
                name,
                model=profile,
                cluster=nodes,
                timing=timing,
                warmup_s=warmup,
                progress=bar,
                routing=routing,
            )
        )
        if bar:
            bar.close()
    if plot:
        from pd_tools.replay.offline_plot import plot_result

        for result in results:
            image = Path(plot) / f"simulate-{result.policy.replace(':', '-')}.png"
            print(f"plot: {plot_result(result, deployment, image)}", file=sys.stderr)
    if output:
        Path(output).write_text(json.dumps([r.to_dict() for r in results], indent=1))
    _print_results(results, output_format, explain=explain)
    return 0


def _print_results(results: "Sequence[SimResult]", output_format: str, *, explain: bool) -> None:
    """The runs' summaries as JSON, or the comparison table (with each run's scale changes and
    their reasons when `explain`)."""
    import json

    from pd_tools.replay.results import TABLE_COLUMNS, table_row

    if output_format == "json":
        summaries = [r.summary() | ({"changes": r.changes()} if explain else {}) for r in results]
        print(json.dumps(summaries, indent=2))
    else:
        print(tables.render(TABLE_COLUMNS, [table_row(r) for r in results]))
        if explain:
            for result in results:
                print(f"\n{result.policy}: scale changes (seconds from the window's start)")
                print("\n".join(f"  {line}" for line in result.change_lines()) or "  none")

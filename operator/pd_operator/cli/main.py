"""`pdctl`: the pd-operator command line."""

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pd_operator import __version__

if TYPE_CHECKING:
    from pd_operator.sim.cluster import SimCluster


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
        autoscale=not args.no_autoscale,
    )
    if config.metrics_port:
        start_http_server(config.metrics_port)
    state = OperatorState(load_api_client(args.kubeconfig), config)
    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    asyncio.run(run_operator(state, liveness_endpoint=liveness))
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
    try:
        target = parse_target(args.target)
        lengths = TokenLengths(
            args.input_tokens, args.output_tokens, args.length_cv, args.length_cv
        )
        replay = ReplayOptions(
            rate_scale=args.rate_scale, time_compression=args.trace_compression, seed=args.seed
        )
        load = parse_load(
            args.load, lengths, arrival_cv=args.arrival_cv, seed=args.seed, replay=replay
        )
        profile = load_profile(args.profile)
    except (ValueError, OSError) as error:
        sys.exit(f"pdctl sim cluster: {error}")
    model = MODEL_PROFILES.get(args.model)
    if model is None:
        sys.exit(
            f"pdctl sim cluster: unknown model {args.model!r}; known: {sorted(MODEL_PROFILES)}"
        )
    sd_file = None
    if args.prometheus_sd_dir:
        sd_file = Path(args.prometheus_sd_dir) / f"pd-sim-{profile.name}.json"
    sim = SimCluster(
        load_api_client(args.kubeconfig),
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
        type=float,
        default=1.0,
        help="wall seconds per simulated second (0.1: ten times faster)",
    )
    run.add_argument(
        "--duration", type=float, default=0.0, help="simulated seconds to run (0: until Ctrl-C)"
    )
    run.add_argument("--model", default="glm-4.5-fp8", help="a model profile of core/hardware.py")
    run.add_argument("--engine", default="vllm", choices=["vllm", "sglang"], help="metric names")
    run.add_argument("--input-tokens", type=float, default=2000, help="mean prompt length")
    run.add_argument("--output-tokens", type=float, default=200, help="mean answer length")
    run.add_argument("--length-cv", type=float, default=1.0, help="CV of both lengths (0: fixed)")
    run.add_argument("--arrival-cv", type=float, default=1.0, help="1: Poisson, >1: bursty")
    run.add_argument("--rate-scale", type=float, default=1.0, help="trace: keep this many copies")
    run.add_argument(
        "--trace-compression", type=float, default=1.0, help="trace: replay this many times faster"
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--report-seconds", type=float, default=10.0, help="wall seconds between status lines"
    )
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(handler=_sim_cluster)


def build_parser() -> argparse.ArgumentParser:
    """All pdctl subcommands."""
    parser = argparse.ArgumentParser(prog="pdctl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pdctl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the operator")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    run.add_argument("--namespace", action="append", help="watch only this namespace (repeatable)")
    run.add_argument("--workers", type=int, default=4, help="concurrent reconciles")
    run.add_argument(
        "--resync-seconds", type=float, default=300.0, help="full resync period in seconds"
    )
    run.add_argument("--metrics-port", type=int, default=8000, help="0 disables /metrics")
    run.add_argument("--health-port", type=int, default=8080, help="0 disables /healthz")
    run.add_argument(
        "--peering", help="kopf peering name for HA (default: standalone, one replica)"
    )
    run.add_argument(
        "--prometheus-url", help="Prometheus for objects without spec.scaling.prometheus.url"
    )
    run.add_argument("--no-autoscale", action="store_true", help="reconcile only, never scale")
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(handler=_run)
    _add_sim(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pdctl`."""
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())

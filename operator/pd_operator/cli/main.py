"""`pdctl`: the pd-operator command line."""

import argparse
import asyncio
import logging
import sys

from pd_operator import __version__


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
    )
    if config.metrics_port:
        start_http_server(config.metrics_port)
    state = OperatorState(load_api_client(args.kubeconfig), config)
    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    asyncio.run(run_operator(state, liveness_endpoint=liveness))
    return 0


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
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(handler=_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pdctl`."""
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())

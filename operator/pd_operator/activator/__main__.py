"""`python -m pd_operator.activator`: the proxy in front of the router (docs/architecture.md)."""

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry

from pd_operator.activator.proxy import (
    Activator,
    ActivatorConfig,
    ActivatorMetrics,
    metrics_app,
    proxy_app,
)

log = logging.getLogger("pd_operator.activator")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line; every default is ActivatorConfig's."""
    defaults = ActivatorConfig(upstream="")
    parser = argparse.ArgumentParser(
        prog="python -m pd_operator.activator",
        description="Hold requests while the router has no workers; forward everything.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--upstream", required=True, help="the router's URL, http://HOST:PORT")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="the public port (the router's)")
    parser.add_argument("--metrics-port", type=int, default=29001, help="/metrics port")
    parser.add_argument(
        "--hold-seconds",
        type=float,
        default=defaults.hold_seconds,
        help="how long a request waits for the router to have workers before a 503",
    )
    parser.add_argument(
        "--retry-seconds",
        type=float,
        default=defaults.retry_seconds,
        help="how often a held request is tried again",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=defaults.max_body_bytes,
        help="the largest request body (it is buffered to be retried)",
    )
    parser.add_argument(
        "--max-held",
        type=int,
        default=defaults.max_held,
        help="requests held at once; more are answered 503 at once",
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    """Run both servers until SIGTERM or SIGINT."""
    config = ActivatorConfig(
        upstream=args.upstream,
        hold_seconds=args.hold_seconds,
        retry_seconds=args.retry_seconds,
        max_body_bytes=args.max_body_bytes,
        max_held=args.max_held,
    )
    metrics = ActivatorMetrics(CollectorRegistry())
    runners = [
        web.AppRunner(proxy_app(Activator(config, metrics)), access_log=None),
        web.AppRunner(metrics_app(metrics), access_log=None),
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        for runner, port in zip(runners, (args.port, args.metrics_port), strict=True):
            await runner.setup()
            await web.TCPSite(runner, args.host, port).start()
        log.info("activator on %s:%d -> %s", args.host, args.port, config.upstream)
        await stop.wait()
    finally:
        for runner in runners:
            await runner.cleanup()


def main(argv: Sequence[str]) -> int:
    """Entry point."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(serve(parse(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

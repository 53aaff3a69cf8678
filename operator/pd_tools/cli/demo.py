"""`pdctl demo`: the closed loop on one machine, with a live table."""

import logging
from pathlib import Path

import click

from pd_operator.cli.arguments import POSITIVE, UsageError
from pd_tools.cli import deprecated

WORKLOADS = ("auto", "trace", "slice", "synthetic")


@click.command(
    "demo",
    cls=deprecated.Command,
    renamed={"--load": "--workload"},
    short_help="the closed loop on one machine, with a live table",
)
@click.option("--duration", type=POSITIVE, default=180.0, help="wall seconds of load")
@click.option(
    "--workload",
    type=click.Choice(WORKLOADS),
    default="auto",
    help="trace: the Mooncake conversation trace in ../shared/traces; slice: its first 300 "
    "requests, shipped in data/traces; auto: the trace if it is there, else the slice; "
    "synthetic: Poisson arrivals of 6,000-token prompts",
)
@click.option("--no-plot", is_flag=True, help="no demo.png")
@click.option(
    "--output",
    help="folder for the summary, table, requests, decisions, logs and plot "
    "(default: a new pd-demo-YYYYmmdd-HHMMSS in the temporary folder)",
)
@click.option("-v", "--verbose", is_flag=True, help="log at DEBUG on stderr, not errors only")
def demo(
    *, duration: float, workload: str, no_plot: bool, output: str | None, verbose: bool
) -> int:
    """Bring up a local control plane, Prometheus, a simulated S5000/H200 cluster with engine
    and router processes and the operator; send a load with a prefill surge and a decode step
    through the PDDeployment's endpoint; show a live table; leave nothing running."""
    from pd_tools.demo import TRACE, DemoOptions, run_demo

    if workload == "trace" and not TRACE.exists():
        raise UsageError(
            f"--workload trace: {TRACE} is not there; --workload slice replays the shipped part"
        )
    # The table is the demo's output; the operator's and kopf's logs would scroll it away (the
    # demo writes them to operator.log in its output folder).
    logging.basicConfig(level=logging.DEBUG if verbose else logging.ERROR)
    options = DemoOptions(
        duration_s=duration,
        load=workload,
        plot=not no_plot,
        output=Path(output) if output else None,
    )
    return run_demo(options)

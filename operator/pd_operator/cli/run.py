"""`pdctl run` (and `python -m pd_operator`): the operator."""

import asyncio
import logging
import sys
from pathlib import Path

import click

from pd_operator.cli.arguments import COUNT, PORT, POSITIVE, UsageError, about
from pd_operator.core.router import DEFAULT_ACTIVATOR_IMAGE

# Where a pod finds its own namespace (the service account token's projected volume).
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def lease_namespace(leader_election: bool, namespace: str | None) -> str | None:
    """The leader Lease's namespace; None without --leader-election."""
    if not leader_election:
        if namespace:
            raise UsageError("--leader-election-namespace needs --leader-election")
        return None
    if namespace:
        return namespace
    if POD_NAMESPACE_FILE.is_file():
        return POD_NAMESPACE_FILE.read_text().strip()
    raise UsageError("--leader-election outside a pod needs --leader-election-namespace NAMESPACE")


def _peering_removed(_: click.Context, __: click.Parameter, value: str | None) -> None:
    if value is not None:
        raise UsageError(
            "--peering: removed (kopf peering paused its watches only, not the workers and "
            "the autoscaler); run several replicas with --leader-election instead"
        )


@click.command("run", short_help="run the operator")
@click.option("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
@click.option(
    "--namespace", multiple=True, help="watch only this namespace (repeatable; default: all)"
)
@click.option("--workers", type=COUNT, default=4, help="concurrent reconciles")
@click.option(
    "--resync-seconds", type=POSITIVE, default=300.0, help="full resync period in seconds"
)
@click.option("--metrics-port", type=PORT, default=8000, help="port of /metrics; 0 disables it")
@click.option("--health-port", type=PORT, default=8080, help="port of /healthz; 0 disables it")
@click.option(
    "--peering",
    hidden=True,
    expose_value=False,
    callback=_peering_removed,
    help="removed: use --leader-election",
)
@click.option(
    "--leader-election",
    is_flag=True,
    help="elect a leader on a Lease: only the replica holding it reconciles and scales, "
    "the others wait with warm caches (default: no election, run one replica)",
)
@click.option(
    "--leader-election-namespace",
    metavar="NAMESPACE",
    help="the Lease's namespace (default: the operator pod's own)",
)
@click.option("--leader-election-id", default="pd-operator", help="the Lease's name")
@click.option("--prometheus-url", help="Prometheus for objects without spec.scaling.prometheus.url")
@click.option(
    "--prometheus-bearer-token-file",
    help="bearer token for --prometheus-url, re-read every minute (e.g. a mounted Secret)",
)
@click.option(
    "--prometheus-ca-file", help="PEM CA bundle that signs --prometheus-url's certificate"
)
@click.option(
    "--allow-link-local-prometheus",
    is_flag=True,
    help="let spec.scaling.prometheus.url be a link-local or cloud metadata address "
    "(refused by default: the user who writes the spec chooses where the operator calls)",
)
@click.option("--no-autoscale", is_flag=True, help="reconcile only, never scale")
@click.option(
    "--ignore-other-pods",
    is_flag=True,
    help="watch pool pods only; free capacity then ignores other workloads on the nodes "
    "(for clusters whose accelerator nodes run nothing else)",
)
@click.option(
    "--activator-image",
    default=DEFAULT_ACTIVATOR_IMAGE,
    show_default=True,
    help="image of the router pods' activator (spec.scaling.idleSeconds): the operator's own; "
    "the chart passes its image",
)
@click.option("-v", "--verbose", is_flag=True, help="log at DEBUG instead of INFO")
def run(
    *,
    kubeconfig: str | None,
    namespace: tuple[str, ...],
    workers: int,
    resync_seconds: float,
    metrics_port: int,
    health_port: int,
    leader_election: bool,
    leader_election_namespace: str | None,
    leader_election_id: str,
    prometheus_url: str | None,
    prometheus_bearer_token_file: str | None,
    prometheus_ca_file: str | None,
    allow_link_local_prometheus: bool,
    no_autoscale: bool,
    ignore_other_pods: bool,
    activator_image: str,
    verbose: bool,
) -> int:
    """Run the operator: reconcile PDDeployments and scale their pools from SLO metrics."""
    from prometheus_client import start_http_server

    from pd_operator.adapters.kube import load_api_client
    from pd_operator.handlers.operator import OperatorConfig, OperatorState, run_operator

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = OperatorConfig(
        namespaces=list(namespace),
        workers=workers,
        resync_seconds=resync_seconds,
        metrics_port=metrics_port,
        prometheus_url=prometheus_url,
        prometheus_bearer_token_file=prometheus_bearer_token_file,
        prometheus_ca_file=prometheus_ca_file,
        allow_link_local_prometheus=allow_link_local_prometheus,
        autoscale=not no_autoscale,
        count_other_pods=not ignore_other_pods,
        lease_namespace=lease_namespace(leader_election, leader_election_namespace),
        lease_name=leader_election_id,
        activator_image=activator_image,
    )
    with about("--kubeconfig"):  # before anything listens: a bad config leaves nothing behind
        api = load_api_client(kubeconfig)
    if config.metrics_port:
        with about(f"--metrics-port {config.metrics_port}"):
            start_http_server(config.metrics_port)
    state = OperatorState(api, config)
    liveness = f"http://0.0.0.0:{health_port}/healthz" if health_port else None
    asyncio.run(run_operator(state, liveness_endpoint=liveness))
    if state.lost_leadership:
        print(
            "pdctl run: lost the leader lease; exiting to start again as a standby", file=sys.stderr
        )
        return 1
    return 0

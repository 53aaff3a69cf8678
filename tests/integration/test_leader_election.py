"""Leader election against the real apiserver: one replica works, a standby takes over."""

import contextlib
import copy
import threading
import time

from kubernetes import client

from kubetools import RunningOperator, create_pdd, patch_pdd, wait_for
from pd_operator.adapters.lease import LeaseTiming
from pdcases import ROOT, load_sample

HETERO = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
# Short enough for a test, in the same proportions as the defaults (15 / 10 / 2 s).
FAST = LeaseTiming(duration=3.0, renew_deadline=2.0, retry=0.3)
LEASE = "pd-operator"


def replica(cluster, namespace) -> RunningOperator:
    return RunningOperator(
        str(cluster.kubeconfig),
        namespaces=[namespace],
        workers=2,
        resync_seconds=1,
        lease_namespace=namespace,
        lease_timing=FAST,
    ).start()


def holder(api_client, namespace) -> str | None:
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease(LEASE, namespace)
    return lease.spec.holder_identity


def images(api_client, namespace) -> set[str]:
    # The pools' images; the router runs its own.
    apps = client.AppsV1Api(api_client)
    pools = "pdoperator.io/role in (prefill,decode)"
    items = apps.list_namespaced_deployment(namespace, label_selector=pools).items
    return {d.spec.template.spec.containers[0].image for d in items}


def test_one_replica_works_and_a_standby_takes_over_when_it_stops(cluster, api_client, namespace):
    first = replica(cluster, namespace)
    second = None
    try:
        wait_for(lambda: first.state.leading, what="the first replica to lead")
        second = replica(cluster, namespace)
        time.sleep(5 * FAST.retry)
        assert not second.state.leading
        assert holder(api_client, namespace) == first.state.lease.identity
        create_pdd(api_client, namespace, copy.deepcopy(HETERO))
        wait_for(lambda: len(images(api_client, namespace)) == 2, what="the pools' Deployments")

        first.stop()  # a clean stop gives the Lease up: no wait for it to expire
        stopped = time.monotonic()
        wait_for(lambda: second.state.leading, timeout=10, what="the standby to lead")
        assert time.monotonic() - stopped < FAST.duration
        assert holder(api_client, namespace) == second.state.lease.identity

        # The new leader reconciles: the model's new image starts the new revision beside the
        # old one (a rollout across roles; no kubelet runs here, so it goes no further), and
        # the old revision keeps its image (prefill runs its pool's own image throughout).
        before = images(api_client, namespace)
        patch_pdd(api_client, namespace, "glm-hetero", {"spec": {"model": {"image": "img:2"}}})
        wait_for(
            lambda: images(api_client, namespace) == {"img:2", *before},
            what="the new leader's rollout",
        )
    finally:
        for running in (second, first):
            if running is not None and running._thread.is_alive():
                running.stop()


def test_a_holder_that_stopped_renewing_is_replaced_after_the_lease_duration(
    cluster, api_client, namespace
):
    leases = client.CoordinationV1Api(api_client)
    leases.create_namespaced_lease(
        namespace,
        {
            "metadata": {"name": LEASE},
            "spec": {"holderIdentity": "crashed-replica", "leaseDurationSeconds": 3},
        },
    )
    started = time.monotonic()
    standby = replica(cluster, namespace)
    try:
        wait_for(lambda: standby.state.leading, timeout=15, what="the standby to take over")
        # Judged on its own clock: the record had to stay unchanged for a whole duration.
        assert time.monotonic() - started >= FAST.duration
        assert holder(api_client, namespace) == standby.state.lease.identity
    finally:
        standby.stop()


def test_a_leader_that_cannot_renew_stops_reconciling_and_exits(cluster, api_client, namespace):
    leader = replica(cluster, namespace)
    stop_thief = threading.Event()
    try:
        wait_for(lambda: leader.state.leading, what="the replica to lead")
        leases = client.CoordinationV1Api(api_client)

        def steal() -> None:  # another replica that believes it leads, renewing as it should
            while not stop_thief.is_set():
                lease = leases.read_namespaced_lease(LEASE, namespace)
                lease.spec.holder_identity = "thief"
                # A conflict is a race with the leader's own renewal: try again.
                with contextlib.suppress(client.ApiException):
                    leases.replace_namespaced_lease(LEASE, namespace, lease)
                time.sleep(FAST.retry / 2)

        thief = threading.Thread(target=steal, daemon=True)
        thief.start()
        wait_for(
            lambda: not leader._thread.is_alive(),
            timeout=FAST.renew_deadline + 10,
            what="the operator to stop after losing its lease",
        )
        assert leader.state.lost_leadership and not leader.state.leading
        assert leader.state.tasks == []  # workers, resync and autoscaler cancelled
    finally:
        stop_thief.set()
        if leader._thread.is_alive():
            leader.stop()


def test_the_operator_starts_as_a_uid_the_password_database_does_not_know(
    cluster, api_client, namespace, monkeypatch
):
    # The image runs as uid 65532 with no /etc/passwd entry: getpass.getuser() raises there
    # (found by make kind-e2e, where the pod crash-looped in kopf's default identity).
    def unknown_uid() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    monkeypatch.setattr("getpass.getuser", unknown_uid)
    running = replica(cluster, namespace)
    try:
        create_pdd(api_client, namespace, copy.deepcopy(HETERO))
        wait_for(lambda: len(images(api_client, namespace)) == 2, what="the pools' Deployments")
    finally:
        running.stop()

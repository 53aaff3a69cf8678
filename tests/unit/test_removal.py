"""Which replica goes when a pool shrinks (`core.removal`), and the query that reads each pod's
work (`adapters.promql.pod_work_query`)."""

from typing import Any

from pd_operator.adapters.promql import pod_work_query
from pd_operator.core.observe import PodSummary, summarize_pod
from pd_operator.core.removal import (
    choose_removal,
    marks_to_write,
    pool_pods_of,
    shrinking_pools,
)

DEPLOYMENT = "chat-decode-main"


def pod(
    name: str,
    *,
    ready: bool = True,
    created: str = "2026-12-05T10:00:00Z",
    cost: int = 0,
    role: str = "decode",
    replica_set: str = f"{DEPLOYMENT}-abc12",
    template_hash: str = "abc12",
    terminating: bool = False,
) -> PodSummary:
    return PodSummary(
        name=name,
        role=role,
        pool="main",
        ready=ready,
        unschedulable=False,
        uid=f"uid-{name}",
        created=created,
        replica_set=replica_set,
        template_hash=template_hash,
        deletion_cost=cost,
        terminating=terminating,
    )


def test_the_pod_with_the_fewest_running_sequences_goes_not_the_newest():
    pods = [
        pod("old-busy", created="2026-12-05T10:00:00Z"),
        pod("old-idle", created="2026-12-05T10:01:00Z"),
        pod("new-busy", created="2026-12-05T10:02:00Z"),
    ]
    removal = choose_removal(
        "decode", "main", pods, 1, {"old-busy": 9, "old-idle": 1, "new-busy": 30}
    )
    assert removal is not None
    assert [p.name for p in removal.chosen] == ["old-idle"]
    assert removal.cost == -1  # below every other pod's cost (0 when unset)
    assert "old-idle (1)" in removal.summary({"old-idle": 1})


def test_equal_work_removes_the_newest_as_the_replicaset_would():
    pods = [
        pod("a", created="2026-12-05T10:00:00Z"),
        pod("b", created="2026-12-05T10:05:00Z"),
        pod("c", created="2026-12-05T10:02:00Z"),
    ]
    removal = choose_removal("decode", "main", pods, 2, {"a": 0, "b": 0, "c": 0})
    assert removal is not None
    assert [p.name for p in removal.chosen] == ["b", "c"]


def test_pods_not_ready_go_first_so_nothing_is_marked_when_they_cover_the_shrink():
    pods = [pod("loading", ready=False), pod("busy"), pod("idle")]
    assert choose_removal("decode", "main", pods, 1, {"busy": 5, "idle": 0}) is None
    removal = choose_removal("decode", "main", pods, 2, {"busy": 5, "idle": 0})
    assert removal is not None and [p.name for p in removal.chosen] == ["idle"]


def test_no_known_work_leaves_the_replicasets_choice():
    assert choose_removal("decode", "main", [pod("a"), pod("b")], 1, {}) is None


def test_a_pod_whose_work_is_unknown_is_kept_and_the_cost_goes_below_every_other():
    pods = [pod("unread"), pod("user-set", cost=100), pod("stale", cost=-4), pod("idle")]
    removal = choose_removal("decode", "main", pods, 1, {"user-set": 3, "stale": 2, "idle": 0})
    assert removal is not None
    assert [p.name for p in removal.chosen] == ["idle"]
    assert removal.cost == -5  # a mark left by a cancelled shrink never decides this one


def test_a_pod_already_marked_at_the_cost_is_not_written_again():
    pods = [pod("busy"), pod("idle", cost=-1)]
    removal = choose_removal("decode", "main", pods, 1, {"busy": 2, "idle": 0})
    assert removal is not None and marks_to_write(removal) == []
    pods = [pod("busy"), pod("idle")]
    removal = choose_removal("decode", "main", pods, 1, {"busy": 2, "idle": 0})
    assert removal is not None and [p.name for p in marks_to_write(removal)] == ["idle"]


def test_only_pods_of_the_pools_own_replicasets_are_candidates():
    pods = [
        pod("ours"),
        pod("other-rs", replica_set="someone-else-abc12"),
        pod("no-controller", replica_set=""),
        pod("prefill", role="prefill"),
        pod("going", terminating=True),
        pod("old-template", replica_set=f"{DEPLOYMENT}-zzz99", template_hash="zzz99"),
    ]
    names = [p.name for p in pool_pods_of(pods, "decode", "main", DEPLOYMENT)]
    assert names == ["ours", "old-template"]


def deployment(name: str, role: str, pool: str | None, replicas: int) -> dict[str, Any]:
    labels = {"pdoperator.io/role": role} | ({"pdoperator.io/pool": pool} if pool else {})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": replicas},
    }


def test_shrinking_pools_are_the_pool_deployments_whose_replicas_go_down():
    existing = {
        ("apps/v1", "Deployment", d["metadata"]["name"]): d
        for d in (
            deployment("p", "prefill", "main", 3),
            deployment("d", "decode", "main", 4),
            deployment("r", "router", None, 3),
        )
    }
    planned = [
        deployment("p", "prefill", "main", 3),
        deployment("d", "decode", "main", 2),
        deployment("r", "router", None, 1),
        deployment("new", "decode", "other", 1),
    ]
    (shrink,) = shrinking_pools(planned, existing)
    assert (shrink.role, shrink.pool, shrink.deployment, shrink.count) == ("decode", "main", "d", 2)


def test_a_pod_summary_carries_what_the_choice_needs():
    body = {
        "metadata": {
            "name": "x",
            "uid": "u1",
            "creationTimestamp": "2026-12-05T10:00:00Z",
            "labels": {"pod-template-hash": "abc12"},
            "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-3"},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": f"{DEPLOYMENT}-abc12", "controller": True}
            ],
        },
    }
    summary = summarize_pod(body)
    assert (summary.uid, summary.created, summary.replica_set) == (
        "u1",
        "2026-12-05T10:00:00Z",
        f"{DEPLOYMENT}-abc12",
    )
    assert (summary.template_hash, summary.deletion_cost) == ("abc12", -3)
    body["metadata"]["annotations"] = {"controller.kubernetes.io/pod-deletion-cost": "lots"}
    assert summarize_pod(body).deletion_cost == 0  # as the ReplicaSet controller reads it


def test_the_work_query_reads_every_spelling_for_the_role_and_only_the_named_pods():
    decode = pod_work_query("VLLM", "decode", "ns", ["a-1", "b.2"])
    assert decode.startswith("sum by (pod) (")
    assert "vllm:num_requests_running" in decode and "num_requests_waiting" not in decode
    assert 'namespace="ns"' in decode and 'pod=~"a-1|b\\\\.2"' in decode
    prefill = pod_work_query("SGLang", "prefill", "ns", ["a"])
    assert "sglang:num_running_reqs" in prefill and "sglang:num_queue_reqs" in prefill

"""The policy with multi-node replicas (`accelerator.nodesPerReplica`): it asks for whole groups
that fit, never for a group the nodes cannot hold."""

from pd_operator.core.policy import decide
from policycases import T0, calibrated, gpu_nodes, limit, observe, on_nodes, replicas, spec_of

# Decode replicas span two 8-card nodes labelled g=d; prefill is one node of g=p.
GROUPS = spec_of(
    {
        "prefill.pools.0.accelerator": on_nodes("p"),
        "decode.pools.0.accelerator": {**on_nodes("d"), "nodesPerReplica": 2},
    }
)
BREACH = {"ratio": 5.0, "tokens": 50_000.0, "running": 400.0, "kv": 0.97}
# A decode replica carries 5,000 tokens/s within the SLO: the breach wants ten of them.
KNOWN = calibrated(GROUPS, {"prefill": 10_000.0, "decode": 5_000.0})


def test_a_decode_breach_is_met_with_the_whole_groups_that_fit_and_no_more() -> None:
    # Five free decode nodes: two more groups of two fit, a third would be half-placed.
    observation = observe(
        GROUPS, T0, {("prefill", "p"): 1, ("decode", "d"): 1}, gpu_nodes(p=4, d=5), decode=BREACH
    )
    decision = decide(GROUPS, observation, KNOWN, T0)
    assert replicas(decision, "decode", "d") == 3
    assert limit(decision, "decode", "d") == "capacity"


def test_one_free_node_is_no_room_for_a_two_node_replica() -> None:
    observation = observe(
        GROUPS, T0, {("prefill", "p"): 1, ("decode", "d"): 1}, gpu_nodes(p=4, d=1), decode=BREACH
    )
    decision = decide(GROUPS, observation, KNOWN, T0)
    assert replicas(decision, "decode", "d") == 1
    assert limit(decision, "decode", "d") == "capacity"

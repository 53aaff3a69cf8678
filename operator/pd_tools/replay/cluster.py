"""The nodes an offline replay runs on: accelerator types, nodes of each, card-hour prices.

`Cluster` holds what the replay may place replicas on and what a card-hour of each type costs;
`parse_cluster` reads the `--cluster` form (`h200=4x8,mtt-s5000=2x8`).
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from pd_operator.api.spec import PDDeploymentSpec, PoolSpec
from pd_operator.core.hardware import HARDWARE_PROFILES
from pd_operator.core.placement import replica_cards
from pd_tools.enginesim.engine import DEFAULT_LINK_BYTES_PER_SECOND
from pd_tools.replay.baselines import ROLES


@dataclass(frozen=True)
class NodeType:
    """`nodes` nodes of one accelerator profile with `cards_per_node` cards each."""

    profile: str
    nodes: int
    cards_per_node: int = 8


@dataclass(frozen=True)
class Cluster:
    """Nodes per accelerator type and the card-hour price of each (profile's price if absent)."""

    node_types: tuple[NodeType, ...]
    prices: Mapping[str, float] = field(default_factory=dict)
    # The KV fabric between prefill and decode nodes: each hand-off takes the prompt's KV bytes
    # over this link (the engine simulator's model), inside the TTFT.
    link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND

    def price(self, profile: str) -> float:
        if profile in self.prices:
            return self.prices[profile]
        return HARDWARE_PROFILES[profile].hourly_price_usd

    def holds(self, pool: PoolSpec) -> bool:
        """Whether the nodes hold one replica of the pool (its profile, enough cards): a pod on
        one node, or a group of `nodesPerReplica` pods (two on one node if it has room)."""
        slots = sum(
            t.nodes * (t.cards_per_node // pool.accelerator.per_replica)
            for t in self.node_types
            if t.profile == pool.accelerator.profile
        )
        return slots >= pool.accelerator.nodes_per_replica

    def missing_role(self, spec: PDDeploymentSpec) -> str:
        """Why a role has no pool any node can hold ("" when every role has one)."""
        for role in ROLES:
            pools = spec.pools(role)
            if not any(self.holds(pool) for pool in pools):
                wanted = ", ".join(
                    f"{p.name} ({p.accelerator.profile}, {_shape(p)})" for p in pools
                )
                example = pools[0].accelerator.profile
                cards = max(8, pools[0].accelerator.per_replica)
                nodes = max(2, pools[0].accelerator.nodes_per_replica)
                return (
                    f"no node holds a replica of any {role} pool: {wanted}; add nodes, e.g."
                    f" {example}={nodes}x{cards}"
                )
        return ""

    @classmethod
    def fitting(cls, spec: PDDeploymentSpec, cards_per_node: int = 8) -> "Cluster":
        """Enough nodes for every pool at its max: a cluster that never limits the policy."""
        cards: dict[str, int] = {}
        for role in ROLES:
            for pool in spec.pools(role):
                name = accelerator_profile(pool)
                cards[name] = cards.get(name, 0) + pool.replicas.max * replica_cards(pool)
        per_node = max(
            [cards_per_node] + [p.accelerator.per_replica for r in ROLES for p in spec.pools(r)]
        )
        return cls(tuple(NodeType(n, math.ceil(c / per_node), per_node) for n, c in cards.items()))


def _shape(pool: PoolSpec) -> str:
    cards = f"{pool.accelerator.per_replica} cards"
    nodes = pool.accelerator.nodes_per_replica
    return cards if nodes == 1 else f"{nodes} nodes x {cards}"


def accelerator_profile(pool: PoolSpec) -> str:
    """The pool's hardware profile name; ValueError unless it is a known one."""
    name = pool.accelerator.profile
    if name is None or name not in HARDWARE_PROFILES:
        raise ValueError(f"pool {pool.name} needs a known accelerator.profile to be simulated")
    return name


def parse_cluster(text: str, prices: Mapping[str, float] | None = None) -> Cluster:
    """`h200=4x8,mtt-s5000=2x8`: nodes x cards per node of each profile."""
    types = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, shape = part.partition("=")
        nodes, _, cards = shape.partition("x")
        if name not in HARDWARE_PROFILES:
            known = ", ".join(HARDWARE_PROFILES)
            raise ValueError(f"unknown profile in {part!r}; known: {known}")
        if not nodes.isdigit() or not (cards or "8").isdigit() or int(cards or 8) < 1:
            raise ValueError(f"bad entry {part!r}: want PROFILE=NODESxCARDS, e.g. h200=4x8")
        types.append(NodeType(name, int(nodes), int(cards or 8)))
    if not types:
        raise ValueError(f"no node in {text!r}: want PROFILE=NODESxCARDS,..., e.g. h200=4x8")
    return Cluster(tuple(types), dict(prices or {}))

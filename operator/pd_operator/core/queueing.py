"""Queueing estimates shared by the planner and the autoscaler's prefill sizing.

A request's TTFT is its wait for a replica plus its own service. The wait is zero with some
probability and otherwise about exponential (the heavy-traffic form of an M/G/k queue's wait),
so the share of requests meeting a target `t` is

    sum over service classes (s, w) with s <= t of  w * (1 - P(wait) * exp(-(t - s) / D))

where D is the mean wait of a request that waits. Requests whose own service exceeds `t` never
meet it and are left out: they are infeasible whatever the number of replicas.

* The planner models each replica as an M/G/1 queue (requests spread in proportion to
  throughput): P(wait) = rho, D = W / rho with W the Pollaczek-Khinchine mean wait.
* The autoscaler models a pool behind a least-loaded router as one M/G/k queue: P(wait) is
  Erlang's C formula, D = E[s] (1 + cv^2) / 2 / (k (1 - rho)) (Allen-Cunneen's approximation).
"""

import math
from collections.abc import Sequence

# Keep some headroom: at 95% a queue's latency is too sensitive to a burst to plan for.
MAX_UTILISATION = 0.95
# Steps of the bisection for the highest utilisation that meets a target (error 2**-20).
SEARCH_STEPS = 20


def attained_share(
    latencies: Sequence[tuple[float, float]], wait_probability: float, wait_s: float, t: float
) -> float:
    """Share of the weight of (own latency, weight) pairs whose wait plus own latency is at
    most `t`, a request waiting with `wait_probability` an exponential time of mean `wait_s`."""
    if wait_probability <= 0 or wait_s <= 0:
        return sum(w for value, w in latencies if value <= t)
    return sum(
        w * (1 - wait_probability * math.exp(-(t - value) / wait_s))
        for value, w in latencies
        if value <= t
    )


def erlang_c(servers: int, utilisation: float) -> float:
    """Probability that an arrival waits in an M/M/k queue of `servers` at `utilisation`."""
    if utilisation >= 1:
        return 1.0
    offered = servers * utilisation
    term = total = 1.0
    for i in range(1, servers):
        term *= offered / i
        total += term
    top = term * offered / servers / (1 - utilisation)
    return top / (total + top)


def exponential_lengths(mean: float, classes: int) -> list[float]:
    """`classes` equally likely lengths of an exponential distribution of mean `mean` (the
    midpoints of its quantiles)."""
    return [-mean * math.log(1 - (k + 0.5) / classes) for k in range(classes)]


def pooled_utilisation(
    service_s: Sequence[float], target_s: float, share: float, servers: int
) -> float:
    """The highest utilisation of `servers` replicas behind one least-loaded router at which
    `share` of the requests that an idle replica serves within `target_s` still meet it;
    `service_s` are the own service times of equally likely requests. At most MAX_UTILISATION;
    0 when even an idle pool misses (no feasible request)."""
    feasible = [s for s in service_s if s <= target_s]
    if not feasible or servers < 1:
        return 0.0
    mean = sum(service_s) / len(service_s)
    variability = sum(s * s for s in service_s) / len(service_s) / (mean * mean)  # 1 + cv^2
    latencies = [(s, 1.0 / len(feasible)) for s in feasible]

    def meets(rho: float) -> bool:
        wait_s = mean * variability / 2 / (servers * (1 - rho))
        return attained_share(latencies, erlang_c(servers, rho), wait_s, target_s) >= share

    if meets(MAX_UTILISATION):
        return MAX_UTILISATION
    low, high = 0.0, MAX_UTILISATION
    for _ in range(SEARCH_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low

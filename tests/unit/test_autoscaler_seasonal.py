"""The running autoscaler asks the reader for each object's seasons as its spec says, and a
peak they all showed becomes a floor. A fake stands in for the Prometheus reader only."""

import json
from typing import ClassVar

from pd_operator.adapters.cache import ClusterCache
from pd_operator.adapters.prometheus import ReadReport, SignalTarget
from pd_operator.core.signals import Reading, RoleSignals
from pd_operator.handlers.autoscaler import Autoscaler
from pdcases import minimal, pool_deployment

KEY = ("llm", "minimal")


class SeasonalReader:
    """A Prometheus where prefill serves 300 prompt tokens/s in 0.2 s, and on each of the
    seasons asked for rose to 3,000 tokens/s 60 s after this moment."""

    targets: ClassVar[list[SignalTarget]] = []  # what the last read was asked for

    def __init__(self, url, *, bearer_token=None, ca_path=None):
        self.url = url

    def read(self, targets, now):
        SeasonalReader.targets = list(targets)
        signals = {}
        for t in targets:
            count = t.seasonal[1] if t.seasonal else 0
            season = tuple((float(s), 3000.0 if s >= 60 else 300.0) for s in range(0, 901, 30))
            for role in ("prefill", "decode"):
                signals[(t.namespace, t.name, role)] = RoleSignals(
                    sample_time=now,
                    ttft_seconds=Reading.of(0.2),
                    itl_seconds=Reading.of(0.01),
                    requests_per_second=Reading.of(0.3),
                    prompt_tokens_per_second=Reading.of(300.0),
                    generation_tokens_per_second=Reading.of(30.0),
                    seasons=(season,) * count if role == "prefill" else (),
                )
        return signals, ReadReport(queries=1)


def test_the_spec_s_seasons_are_read_and_a_peak_they_all_showed_is_pre_warmed():
    body = minimal()
    body["metadata"].update(namespace="llm", uid="u1", generation=1)
    body["spec"]["prefill"]["pools"][0]["replicas"] = {"min": 1, "max": 8}
    body["spec"]["scaling"] = {
        "prometheus": {"url": "http://prometheus:9090"},
        "seasonal": {"period": "Week", "seasons": 2, "timeZone": "Asia/Shanghai"},
    }
    # What an earlier decision learned, as status keeps it: 1,000 prompt tokens/s per replica.
    memory = {
        "pools": {"prefill/p": {"capacity_per_replica": 1000.0}},
        "roles": {"prefill": {"capacity_basis": "observed"}},
    }
    body["status"] = {"policyMemory": json.dumps(memory)}
    cache = ClusterCache()
    cache.put_pdd(body)
    cache.put_child(pool_deployment("prefill", "p", 1))
    cache.put_child(pool_deployment("decode", "d", 1))
    autoscaler = Autoscaler(cache, lambda keys: None, readers=SeasonalReader, clock=lambda: 1e6)
    assert autoscaler.cycle() == 1
    (target,) = SeasonalReader.targets
    assert target.seasonal == ("Week", 2, "Asia/Shanghai")
    decided = autoscaler.decisions_for(KEY)
    assert decided is not None and decided[("prefill", "p")] == 4  # 3,000 / (80% of 1,000)
    view = autoscaler.view_for(KEY)
    assert view is not None and view.last_decision is not None
    assert "limited by forecast" in view.last_decision["reason"]

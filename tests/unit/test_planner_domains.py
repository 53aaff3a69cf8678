"""`pdctl plan --domain-nodes`: whether a plan fits one topology domain (spec.placement), how
many it needs, and the cheapest plan within one."""

import json

import pytest

from pd_operator.core.hardware import GLM_45_FP8, H200_SXM, MTT_S5000
from pd_tools.cli.main import main
from pd_tools.planner.sizing import Candidate, Target, Workload, domains_needed, fit_domain, plan

SLO = Target(ttft_ms=60_000, itl_ms=30, share=0.5)
CANDIDATES = [Candidate(MTT_S5000, card_hour_price=1.0), Candidate(H200_SXM, card_hour_price=3.5)]


def cheapest(rate: float):
    result = plan(Workload(rate, 131_072, 1000), SLO, GLM_45_FP8, CANDIDATES)
    assert result is not None
    return result


def nodes_of(result, name: str) -> int:
    return sum(p.nodes for p in result.pools if p.candidate.hardware.name == name)


def test_a_plan_that_fits_one_domain_is_its_own_plan_within_one():
    result = cheapest(0.3)
    most = max(nodes_of(result, c.hardware.name) for c in CANDIDATES)
    fit = fit_domain(result, GLM_45_FP8, CANDIDATES, most)
    assert (fit.domains, fit.within_one) == (1, result)


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_a_plan_too_big_for_one_domain_says_how_many_and_what_one_can_do(nodes):
    result = cheapest(0.3)
    fit = fit_domain(result, GLM_45_FP8, CANDIDATES, nodes)
    assert fit.domains == domains_needed(result, nodes) > 1
    assert fit.domains == max(-(-nodes_of(result, c.hardware.name) // nodes) for c in CANDIDATES)
    within = fit.within_one
    if within is not None:
        # Both roles share the domain's nodes of each card type, and the SLO still holds.
        assert all(nodes_of(within, c.hardware.name) <= nodes for c in CANDIDATES)
        assert within.ttft_ms <= SLO.ttft_ms and within.itl_ms <= SLO.itl_ms
        assert within.cost_per_hour >= result.cost_per_hour


def test_a_load_no_single_domain_serves_says_so():
    fit = fit_domain(cheapest(1.2), GLM_45_FP8, CANDIDATES, 4)
    assert fit.domains > 1 and fit.within_one is None


def test_pdctl_plan_reports_the_domains(capsys):
    common = ["plan", "--rate", "0.3", "--input-tokens", "131072", "--output-tokens", "1000"]
    common += ["--ttft-ms", "60000", "--itl-ms", "30", "--share", "0.5"]
    common += ["--candidate", "mtt-s5000:price=1", "--candidate", "h200:price=3.5"]
    assert main([*common, "--domain-nodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "needs 3 topology domains of 3 node(s) of each card type" in out
    assert "cheapest plan within one domain:" in out
    assert main([*common, "--domain-nodes", "1"]) == 0
    assert "within one domain no mix meets the SLO" in capsys.readouterr().out
    assert main([*common, "--domain-nodes", "8", "-o", "json"]) == 0
    topology = json.loads(capsys.readouterr().out)["topology"]
    assert (topology["domain_nodes"], topology["domains"]) == (8, 1)

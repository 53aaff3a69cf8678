"""A profile name that matches no hardware profile, on the real apiserver: said, not silent."""

import copy

from kubetools import condition, create_pdd, events, get_pdd, patch_pdd, wait_for
from pdcases import ROOT, load_sample

HETERO = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")


def test_an_unknown_profile_is_a_condition_and_an_event_and_the_pools_still_run(
    operator, api_client, namespace
):
    body = copy.deepcopy(HETERO)
    body["spec"]["decode"]["pools"][0]["accelerator"]["profile"] = "h2oo"
    create_pdd(api_client, namespace, body)

    def unknown():
        found = condition(get_pdd(api_client, namespace, "glm-hetero"), "ProfilesKnown")
        return found if found.get("status") == "False" else None

    found = wait_for(unknown, what="ProfilesKnown=False")
    assert found["reason"] == "UnknownProfile"
    assert "spec.decode.pools[0].accelerator.profile 'h2oo' matches no" in found["message"]
    warned = wait_for(lambda: events(api_client, namespace, "UnknownProfile"), what="an event")
    assert "'h2oo'" in warned[0].message
    # The pools are built all the same: capacity is learned online instead.
    status = get_pdd(api_client, namespace, "glm-hetero")["status"]
    assert {p["role"] for p in status["pools"]} == {"prefill", "decode"}

    fixed = copy.deepcopy(body["spec"]["decode"]["pools"][0])
    fixed["accelerator"]["profile"] = "h200"
    patch_pdd(api_client, namespace, "glm-hetero", {"spec": {"decode": {"pools": [fixed]}}})
    wait_for(
        lambda: (
            condition(get_pdd(api_client, namespace, "glm-hetero"), "ProfilesKnown").get("status")
            == "True"
        ),
        what="ProfilesKnown=True after the fix",
    )
    assert len(events(api_client, namespace, "UnknownProfile")) == 1

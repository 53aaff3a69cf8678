"""The PDDeployment models and the generated CRD accept, reject and default the same documents."""

import copy
import re
from decimal import Decimal
from typing import Any

import jsonschema
import pytest
import yaml

from pd_operator.api import InvalidSpecError, parse_pddeployment
from pd_operator.api.crd import render_crd
from pd_operator.api.reference import render_reference
from pd_operator.api.types import INTEGER_LITERAL_MESSAGE, quantity_value
from pdcases import CRD_PATH, INVALID, ROOT, SAMPLES, load_sample, minimal, mutate, schedule
from schema_tools import apply_defaults, crd_schema, normalise, strict

# Rules that only CEL or list-map semantics express; the apiserver tier checks these for real.
NEEDS_APISERVER = {
    "replicas-min-gt-max",
    "duplicate-pool-names",
    "ratio-min-gt-max",
    "node-selector-bad-key",
    "name-not-dns-label",
    "name-too-long",
    "schedule-unknown-pool",
    "schedule-floor-over-max",
    "schedule-duplicate-names",
    "router-replicas-min-over-max",  # CEL rules: only the apiserver evaluates them
    "router-service-account",
    "idle-with-pools-min-1",
    "idle-without-router",
    # A whole float passes the OpenAPI schema; the CEL rules that read the field refuse it.
    "replicas-min-whole-float",
    "ratio-max-whole-float",
    "router-replicas-whole-float",
    "schedule-floor-whole-float",
    "scale-down-window-whole-float",
    # The pod rules on a toleration's fields together, map keys, quantities, schedules' floors,
    # and list-map and set uniqueness: CEL and list types.
    "toleration-keyless-equal",
    "toleration-exists-with-value",
    "toleration-seconds-without-no-execute",
    "label-key-name-over-63",
    "annotation-key-name-over-63",
    "node-selector-key-prefix-over-253",
    "resource-name-quota-prefix",
    "requests-over-limits",
    "router-requests-over-limits",
    "schedule-without-floors",
    "schedule-with-empty-floors",
    "router-service-account-empty",
    "env-duplicate-names",
    "image-pull-secrets-repeated",
    # The apiserver decodes a number over int64 as a float; jsonschema reads it as an integer.
    "toleration-seconds-over-int64",
}


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(strict(crd_schema()))  # draft 6+: 60.0 is an integer
    errors = []
    for error in validator.iter_errors(document):
        path = [str(p) for p in error.absolute_path]
        if error.validator == "required":  # name the missing field, as the apiserver does
            path += [name for name in error.validator_value if name not in error.instance][:1]
        errors.append(".".join(path) + ": " + error.message)
    return errors


def dotted(path: str) -> str:
    """`spec.pools[0].x` in the form jsonschema reports paths: `spec.pools.0.x`."""
    return path.replace("[", ".").replace("]", "")


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_sample_is_valid_for_models_and_schema(sample):
    document = load_sample(sample)
    parse_pddeployment(document)
    assert schema_errors(document) == []


def test_the_readmes_api_screen_is_a_valid_pddeployment():
    readme = (ROOT / "README.md").read_text()
    screen = readme.split("## The API in one screen", 1)[1].split("```yaml\n", 1)[1]
    document = yaml.safe_load(screen.split("```", 1)[0])
    spec = parse_pddeployment(document).spec
    assert schema_errors(document) == []
    assert (spec.disruption_budget.max_unavailable, spec.termination.drain_seconds) == (1, 60)


@pytest.mark.parametrize(("case", "document", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_models_reject_invalid_documents_naming_the_field(case, document, field):
    with pytest.raises(InvalidSpecError) as raised:
        parse_pddeployment(document)
    assert any(field in problem for problem in raised.value.problems), raised.value.problems


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("spec.scaling.seasonal", {"timeZone": "Mars/Olympus"}, "spec.scaling.seasonal.timeZone"),
        (
            "spec.scaling.schedules",
            [schedule(timeZone="Mars/Olympus")],
            "spec.scaling.schedules[0].timeZone",
        ),
    ],
)
def test_an_unknown_time_zone_is_refused_by_the_operator_naming_the_field_and_the_fix(
    path, value, field
):
    # No OpenAPI keyword or CEL function knows the IANA names: the apiserver accepts them, and
    # the operator reports the object as invalid (the reconciler's Stalled condition says this).
    with pytest.raises(InvalidSpecError) as raised:
        parse_pddeployment(mutate(path, value))
    (problem,) = raised.value.problems
    assert problem.startswith(field)
    assert "unknown time zone 'Mars/Olympus': use an IANA name such as UTC or Asia/Shanghai" in (
        problem
    )


@pytest.mark.parametrize(
    ("case", "document", "field"),
    [c for c in INVALID if c[0] not in NEEDS_APISERVER],
    ids=[c[0] for c in INVALID if c[0] not in NEEDS_APISERVER],
)
def test_schema_rejects_invalid_documents_naming_the_field(case, document, field):
    errors = schema_errors(document)
    assert errors, f"{case}: the CRD schema accepted it"
    assert any(error.startswith(dotted(field)) for error in errors), errors


def test_cel_rules_exist_where_the_openapi_keywords_cannot_express_the_rule():
    spec = crd_schema()["properties"]["spec"]["properties"]
    pool = spec["prefill"]["properties"]["pools"]
    assert pool["x-kubernetes-list-type"] == "map"
    assert pool["x-kubernetes-list-map-keys"] == ["name"]
    rules = pool["items"]["properties"]["replicas"]["x-kubernetes-validations"]
    assert rules[0]["rule"] == "self.min <= self.max"
    ratio = spec["scaling"]["properties"]["prefillToDecodeRatio"]["x-kubernetes-validations"]
    assert ratio[0]["rule"] == "self.minPercent <= self.maxPercent"


def test_schema_and_models_carry_the_same_defaults():
    for document in [minimal(), *(load_sample(s) for s in SAMPLES)]:
        by_schema = apply_defaults(crd_schema(), copy.deepcopy(document))["spec"]
        by_model = parse_pddeployment(document).spec.model_dump(by_alias=True, mode="json")
        assert normalise(by_schema) == normalise(by_model)


def test_minimal_document_gets_the_documented_defaults():
    spec = parse_pddeployment(minimal()).spec
    assert spec.model.engine == "VLLM"
    assert (spec.kv_transfer.connector, spec.kv_transfer.protocol) == ("Mooncake", "RDMA")
    assert spec.slo.ttft.percentile == "P50" and spec.slo.window_seconds == 60
    assert spec.scaling.mode == "Active" and spec.scaling.interval_seconds == 30
    assert spec.scaling.scale_down.stabilization_seconds == 300
    assert (spec.prefill.pools[0].replicas.min, spec.prefill.pools[0].replicas.max) == (1, 10)


def test_snake_case_keys_are_rejected_on_the_wire():
    document = minimal()
    document["spec"]["model"]["context_length"] = 4096
    with pytest.raises(InvalidSpecError, match=r"spec\.model\.context_length"):
        parse_pddeployment(document)


def test_committed_crd_and_reference_are_generated_from_the_models():
    assert CRD_PATH.read_text() == render_crd(), "run `make manifests`"
    reference = CRD_PATH.parent.parent / "docs" / "api.md"
    assert reference.read_text() == render_reference(), "run `make manifests`"


def test_every_string_and_list_in_the_spec_is_bounded():
    unbounded = []

    def walk(node: dict[str, Any], path: str) -> None:
        kind = node.get("type")
        if kind == "string" and "maxLength" not in node and "enum" not in node:
            unbounded.append(path)
        if kind == "array" and "maxItems" not in node:
            unbounded.append(path)
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(path)
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(crd_schema()["properties"]["spec"], "spec")
    assert unbounded == []


def test_no_floats_in_the_spec_schema():
    text = CRD_PATH.read_text().split("          status:")[0]
    assert "type: number" not in text


# What a structural schema may contain (apiextensions.k8s.io/v1 JSONSchemaProps we use).
OPENAPI_KEYS = {
    "description", "type", "format", "properties", "items", "required", "enum", "default",
    "minimum", "maximum", "minLength", "maxLength", "pattern", "minItems", "maxItems",
    "minProperties", "maxProperties", "additionalProperties", "nullable",
}  # fmt: skip


def test_schema_uses_only_keywords_the_apiserver_knows():
    unknown = []

    def walk(node: dict[str, Any], path: str) -> None:
        unknown.extend(
            f"{path}.{key}"
            for key in node
            if key not in OPENAPI_KEYS and not key.startswith("x-kubernetes-")
        )
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{path}.{key}")

    walk(crd_schema(), "")
    assert unknown == []


def test_whole_valued_numbers_are_integers_as_the_apiserver_decides():
    document = minimal()
    document["spec"]["slo"]["windowSeconds"] = 60.0
    assert parse_pddeployment(document).spec.slo.window_seconds == 60
    assert schema_errors(document) == []


INTEGER_GUARD = {"rule": "type(self) == int", "message": INTEGER_LITERAL_MESSAGE}


def test_every_integer_a_cel_rule_reads_refuses_a_whole_float_at_the_field():
    # The apiserver cannot evaluate a rule over an integer sent as 1.0 ("invalid data, expected
    # int, got float64"); the field's own rule says where and what to write instead.
    unguarded = []

    def walk(node: dict[str, Any], path: str) -> None:
        properties = node.get("properties", {})
        for rule in node.get("x-kubernetes-validations", []):
            for name in re.findall(r"self\.(\w+)", rule["rule"]):
                child = properties.get(name, {})
                if child.get("type") == "integer" and INTEGER_GUARD not in child.get(
                    "x-kubernetes-validations", []
                ):
                    unguarded.append(f"{path}.{name}")
        for name, child in properties.items():
            walk(child, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{path}.{key}")

    spec = crd_schema()["properties"]["spec"]
    walk(spec, "spec")
    assert unguarded == []
    # The schedule rules read the pools' replicas.max and the floors from the spec's root.
    floors = spec["properties"]["scaling"]["properties"]["schedules"]["items"]["properties"]
    assert INTEGER_GUARD in floors["prefill"]["additionalProperties"]["x-kubernetes-validations"]
    pool = spec["properties"]["decode"]["properties"]["pools"]["items"]["properties"]
    assert INTEGER_GUARD in pool["replicas"]["properties"]["max"]["x-kubernetes-validations"]


def test_a_whole_float_where_a_rule_reads_is_refused_saying_what_to_write():
    with pytest.raises(InvalidSpecError) as raised:
        parse_pddeployment(mutate("spec.prefill.pools.0.replicas", {"min": 1.0, "max": 2}))
    assert raised.value.problems == [
        "spec.prefill.pools[0].replicas.min: must be written as an integer (1, not 1.0): "
        "validation rules read it"
    ]


@pytest.mark.parametrize(
    ("scale_down", "window"),
    [
        (None, 60),
        ({"stabilizationSeconds": 600, "maxStepReplicas": 1}, 60),
        ({"stabilizationSeconds": 30, "maxStepReplicas": 1}, 30),
        ({"stabilizationSeconds": 30, "maxStepReplicas": 1, "steadyStabilizationSeconds": 10}, 10),
        ({"stabilizationSeconds": 30, "maxStepReplicas": 1, "steadyStabilizationSeconds": 30}, 30),
    ],
)
def test_the_steady_window_defaults_to_60_s_or_the_long_window_if_shorter(scale_down, window):
    document = minimal()
    if scale_down is not None:
        document["spec"]["scaling"] = {"scaleDown": scale_down}
    assert parse_pddeployment(document).spec.scaling.scale_down.steady_window_seconds == window
    assert schema_errors(document) == []


def test_a_steady_window_over_the_long_one_is_refused_at_admission_and_read_capped():
    # Older CRDs stored a default of 60 under shorter long windows: such objects keep working
    # (the window the policy always used for them); admission refuses new ones (the CEL rule,
    # tests/integration/test_control_plane.py).
    document = mutate(
        "spec.scaling.scaleDown",
        {"stabilizationSeconds": 30, "maxStepReplicas": 1, "steadyStabilizationSeconds": 60},
    )
    assert parse_pddeployment(document).spec.scaling.scale_down.steady_window_seconds == 30
    scale_down = crd_schema()["properties"]["spec"]["properties"]["scaling"]["properties"][
        "scaleDown"
    ]
    (rule,) = scale_down["x-kubernetes-validations"]
    assert rule["fieldPath"] == ".steadyStabilizationSeconds"
    assert "lower it, or leave it out" in rule["message"]


@pytest.mark.parametrize("value", ["true", "yes", 1, 0])
def test_booleans_are_json_booleans_only(value):
    for path in ("spec.router.enabled", "spec.disruptionBudget.enabled"):
        with pytest.raises(InvalidSpecError, match=re.escape(path)):
            parse_pddeployment(mutate(path, value))


def test_name_rules_report_at_metadata_name():
    rules = crd_schema()["x-kubernetes-validations"]
    assert {rule["fieldPath"] for rule in rules} == {".metadata.name"}
    with pytest.raises(InvalidSpecError) as raised:
        parse_pddeployment(mutate("metadata.name", "g" * 64))
    assert raised.value.problems == [
        "metadata.name: metadata.name must be at most 63 characters: child objects and their "
        "labels carry it"
    ]


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("spec.router", "router"),
        ("spec.model.engine", "engine"),
        ("spec.prefill.pools.0.replicas.max", "max"),
    ],
)
def test_a_null_in_a_typed_field_reads_as_absent_as_the_apiserver_stores_it(path, field):
    # `key:` with nothing after it in YAML; the apiserver prunes it and defaults the field.
    assert parse_pddeployment(mutate(path, None)) == parse_pddeployment(minimal()), field


@pytest.mark.parametrize(
    ("requests", "limits"),
    [
        ({"cpu": "1000m", "memory": "1Gi"}, {"cpu": "1", "memory": "1024Mi"}),
        ({"cpu": "500m"}, {"cpu": "2", "memory": "1Gi"}),
        ({"cpu": "4"}, {"memory": "1Gi"}),
        # Both are one nano-unit once parsed: the apiserver rounds up to it.
        ({"cpu": "0.0000000002"}, {"cpu": "0.000000001"}),
    ],
)
def test_requests_at_most_their_limits_in_any_spelling_are_accepted(requests, limits):
    document = mutate(
        "spec.decode.pools.0.template", {"resources": {"requests": requests, "limits": limits}}
    )
    parse_pddeployment(document)
    assert schema_errors(document) == []


def test_quantities_compare_as_the_apiserver_parses_them():
    assert quantity_value("1.5Gi") == 1536 * 2**20
    assert quantity_value("1000m") == quantity_value("1") == 1
    assert quantity_value("0.0000000001") == Decimal("1e-9")
    with pytest.raises(ValueError, match="not a quantity"):
        quantity_value("1e3")


@pytest.mark.parametrize(
    "toleration",
    [
        {"operator": "Exists"},
        {"key": "", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "k", "value": "v", "effect": "PreferNoSchedule"},
        {"key": "k", "operator": "Equal", "value": ""},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "tolerationSeconds": 30},
        {"key": "k", "effect": "NoExecute", "tolerationSeconds": 2**63 - 1},
    ],
)
def test_tolerations_a_pod_takes_are_accepted(toleration):
    document = mutate("spec.prefill.pools.0.accelerator.tolerations", [toleration])
    parse_pddeployment(document)
    assert schema_errors(document) == []


@pytest.mark.parametrize(
    ("path", "value", "fix"),
    [
        ("spec.prefill.pools.0.accelerator.resourceName", "gpu", "such as nvidia.com/gpu"),
        (
            "spec.prefill.pools.0.accelerator.tolerations",
            [{"effect": "NoSchedule"}],
            "set operator Exists, or a key",
        ),
        ("spec.prefill.pools.0.template", {"labels": {"app": "a b"}}, "must be a label value"),
        ("spec.prefill.pools.0.template", {"labels": {"n" * 64: "v"}}, "a name of at most 63"),
        ("spec.prefill.pools.0.template", {"priorityClassName": "High"}, "such as high-priority"),
    ],
)
def test_what_a_pod_would_refuse_is_refused_saying_what_to_write(path, value, fix):
    with pytest.raises(InvalidSpecError) as raised:
        parse_pddeployment(mutate(path, value))
    (problem,) = raised.value.problems
    assert fix in problem


def test_map_keys_are_checked_by_their_type_s_own_rules_at_admission():
    # A qualified name's prefix is bounded by a rule of the key type; maps carry it per key.
    template = crd_schema()["properties"]["spec"]["properties"]["router"]["properties"]["template"]
    for name in ("labels", "annotations"):
        (rule,) = template["properties"][name]["x-kubernetes-validations"]
        assert rule["rule"].endswith("&& k.indexOf('/') <= 253)")

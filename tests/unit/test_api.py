"""The PDDeployment models and the generated CRD accept, reject and default the same documents."""

import copy
from typing import Any

import jsonschema
import pytest
import yaml

from pd_operator.api import InvalidSpecError, parse_pddeployment
from pd_operator.api.crd import render_crd
from pd_operator.api.reference import render_reference
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

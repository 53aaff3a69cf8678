"""Generates the PDDeployment and PDPool CRDs from the pydantic models (`make manifests`).

The models are the one source of truth. Pydantic's JSON schema is turned into a structural
OpenAPI v3 schema: references inlined, nullable unions collapsed to their type, titles dropped,
`propertyNames` patterns turned into CEL rules (structural schemas have no propertyNames), and
the Kubernetes extensions that the models carry copied through.
"""

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from pd_operator.api.document import (
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    NAME_LENGTH_MESSAGE,
    NAME_RULE_MESSAGE,
    PLURAL,
    VERSION,
)
from pd_operator.api.pdpool import (
    POOL_KIND,
    POOL_PLURAL,
    POOL_SHORT_NAME,
    PDPoolSpec,
    PDPoolStatus,
)
from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.api.status import PDDeploymentStatus
from pd_operator.api.types import (
    DNS_LABEL_PATTERN,
    EXTENDED_RESOURCE_MESSAGE,
    EXTENDED_RESOURCE_PATTERN,
    QUALIFIED_NAME_PATTERN,
    QUALIFIED_NAME_RULES,
    RESOURCE_DOMAIN_MESSAGE,
)

CRD_FILE = f"{GROUP}_{PLURAL}.yaml"
POOL_CRD_FILE = f"{GROUP}_{POOL_PLURAL}.yaml"

# What a map's keys must be, in words, by the pattern they must match.
KEY_MESSAGES = {
    QUALIFIED_NAME_PATTERN: f"keys must be qualified names such as example.com/name: "
    f"{QUALIFIED_NAME_RULES}",
    DNS_LABEL_PATTERN: "keys must be pool names: lowercase DNS labels such as s5000",
    EXTENDED_RESOURCE_PATTERN: f"keys {EXTENDED_RESOURCE_MESSAGE}; {RESOURCE_DOMAIN_MESSAGE}",
}
# Keys of pydantic's JSON schema that a structural schema does not accept.
DROPPED_KEYS = {"title", "additionalProperties", "patternProperties", "propertyNames", "$defs"}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {
        "name": "Prefill",
        "type": "string",
        "description": "Ready/desired prefill replicas",
        "jsonPath": ".status.replicaSummary.prefill",
    },
    {
        "name": "Decode",
        "type": "string",
        "description": "Ready/desired decode replicas",
        "jsonPath": ".status.replicaSummary.decode",
    },
    {
        "name": "TTFT(ms)",
        "type": "integer",
        "description": "Observed TTFT at the SLO percentile",
        "jsonPath": ".status.observed.ttftMilliseconds",
    },
    {
        "name": "ITL(ms)",
        "type": "integer",
        "description": "Observed ITL at the SLO percentile",
        "jsonPath": ".status.observed.itlMilliseconds",
    },
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
    {
        "name": "Idle",
        "type": "string",
        "priority": 1,
        "description": "True while scaled to zero (spec.scaling.idleSeconds)",
        "jsonPath": '.status.conditions[?(@.type=="ScaledToZero")].status',
    },
    {"name": "Mode", "type": "string", "priority": 1, "jsonPath": ".spec.scaling.mode"},
    {
        "name": "Limited",
        "type": "string",
        "priority": 1,
        "description": "What limited the last decision",
        "jsonPath": ".status.lastDecision.limitedBy",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# Lists of the status that are maps keyed by these fields.
STATUS_LIST_KEYS = {
    "conditions": ["type"],
    "pools": ["role", "name"],
    "externalScaling": ["role"],
}

POOL_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Requested",
        "type": "integer",
        "description": "Replicas asked for (spec.replicas)",
        "jsonPath": ".spec.replicas",
    },
    {
        "name": "Desired",
        "type": "integer",
        "description": "Replicas the operator runs",
        "jsonPath": ".status.desiredReplicas",
    },
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {
        "name": "Limited",
        "type": "string",
        "description": "What made Desired differ from Requested",
        "jsonPath": ".status.limitedBy",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline `$ref`s, merging the referring node's own keys (description, extras) on top."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **siblings}, defs)
    return {key: _resolve(value, defs) for key, value in node.items()}


def _structural(node: dict[str, Any]) -> dict[str, Any]:
    """Convert one resolved pydantic schema node into a structural OpenAPI node."""
    node = dict(node)
    if "anyOf" in node:  # `X | None`: optional in Kubernetes means absent, not null.
        variants = [v for v in node.pop("anyOf") if v.get("type") != "null"]
        if len(variants) != 1:
            raise ValueError(f"unsupported union in schema: {variants}")
        node = {**variants[0], **node}
        if node.get("default", 0) is None:
            del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    out: dict[str, Any] = {}
    if "description" in node:
        out["description"] = " ".join(str(node["description"]).split())
    for key, value in node.items():
        if key in DROPPED_KEYS or key == "description":
            continue
        if key == "properties":
            out[key] = {name: _structural(child) for name, child in value.items()}
        elif key == "items":
            out[key] = _structural(value)
        else:
            out[key] = value
    additional = node.get("additionalProperties")
    if "patternProperties" in node:  # a dict with constrained keys
        ((key_pattern, additional),) = node["patternProperties"].items()
        key_schema = node.get("propertyNames", {})
        key_limit = key_schema.get("maxLength", 317)
        # The key type's own rules, over `self`, become conditions on each key `k`.
        key_rules = [
            re.sub(r"\bself\b", "k", rule["rule"])
            for rule in key_schema.get("x-kubernetes-validations", [])
        ]
        conditions = [f"k.size() <= {key_limit}", f"k.matches(r'{key_pattern}')", *key_rules]
        rules = out.setdefault("x-kubernetes-validations", [])
        rules.append(
            {
                "rule": f"self.all(k, {' && '.join(conditions)})",
                "message": KEY_MESSAGES.get(
                    key_pattern, f"keys must match {key_pattern}, at most {key_limit} characters"
                ),
            }
        )
    if isinstance(additional, dict):
        out["additionalProperties"] = _structural(additional)
    elif additional is True:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out["type"] = "object"
    return out


def model_schema(model: type[Any]) -> dict[str, Any]:
    """Structural OpenAPI v3 schema of a pydantic model, by wire (alias) names."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(_resolve(raw, raw.get("$defs", {})))


def _status_schema() -> dict[str, Any]:
    schema = model_schema(PDDeploymentStatus)
    for field, keys in STATUS_LIST_KEYS.items():
        prop = schema["properties"][field]
        prop["x-kubernetes-list-type"] = "map"
        prop["x-kubernetes-list-map-keys"] = keys
        prop["items"].setdefault("required", [])
        prop["items"]["required"] = sorted(set(prop["items"]["required"]) | set(keys))
    return schema


def build_crd() -> dict[str, Any]:
    """The complete CustomResourceDefinition object."""
    root = {
        "type": "object",
        "description": "PDDeployment serves one model from a prefill role and a decode role, "
        "each made of accelerator pools that are scaled on their own SLO "
        "(prefill on TTFT, decode on ITL).",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # Declared so that the name rules below can report at metadata.name (a CRD may
            # constrain only name and generateName of its metadata).
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": model_schema(PDDeploymentSpec),
            # Flux/kstatus read an object without observedGeneration as settled; -1 until the
            # operator has written status makes a new object read as in progress.
            "status": {**_status_schema(), "default": {"observedGeneration": -1}},
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
                "message": NAME_LENGTH_MESSAGE,
                "fieldPath": ".metadata.name",
            },
            {
                "rule": f"self.metadata.name.matches(r'{DNS_LABEL_PATTERN}')",
                "message": NAME_RULE_MESSAGE,
                "fieldPath": ".metadata.name",
            },
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["pdd"],
                "categories": ["pdoperator"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def build_pdpool_crd() -> dict[str, Any]:
    """The PDPool CustomResourceDefinition: one role's replicas behind a /scale subresource."""
    root = {
        "type": "object",
        "description": "PDPool is one role of a PDDeployment in scaling mode External: "
        "HPA, KEDA or a GitOps tool sets spec.replicas through /scale, and the operator runs "
        "that many replicas within the PDDeployment's bounds, capacity and ratio.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": model_schema(PDPoolSpec),
            "status": model_schema(PDPoolStatus),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{POOL_PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": POOL_KIND,
                "listKind": f"{POOL_KIND}List",
                "plural": POOL_PLURAL,
                "singular": POOL_KIND.lower(),
                "shortNames": [POOL_SHORT_NAME],
                "categories": ["pdoperator"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": POOL_PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


HEADER = "# Generated by `make manifests` from operator/pd_operator/api; do not edit.\n"


def _render(crd: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(crd, sort_keys=False, width=100)


def render_crd() -> str:
    """The PDDeployment CRD as YAML text, exactly as committed under crds/."""
    return _render(build_crd())


def render_pdpool_crd() -> str:
    """The PDPool CRD as YAML text, exactly as committed under crds/."""
    return _render(build_pdpool_crd())


def crd_files() -> dict[str, str]:
    """Every CRD file of crds/, by file name."""
    return {CRD_FILE: render_crd(), POOL_CRD_FILE: render_pdpool_crd()}


def main(argv: list[str] | None = None) -> int:
    """Write the CRDs into the given folders, or check that they are current."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for folder in args.folders:
        for name, text in crd_files().items():
            path = folder / name
            if args.check:
                if not path.exists() or path.read_text() != text:
                    stale.append(str(path))
            else:
                folder.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run `make manifests`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

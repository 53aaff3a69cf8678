"""Helpers that read the generated CRD schema the way the apiserver does (minus CEL)."""

import copy
import functools
from typing import Any

import yaml

from pdcases import CRD_PATH


@functools.cache
def _load() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_PATH.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def crd_schema() -> dict[str, Any]:
    return copy.deepcopy(_load())


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Unknown fields are errors, as with kubectl's default `--validate=strict`."""
    schema = copy.deepcopy(schema)

    def walk(node: dict[str, Any]) -> None:
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        for child in node.get("properties", {}).values():
            walk(child)
        if isinstance(node.get("items"), dict):
            walk(node["items"])
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"])

    walk(schema)
    return schema


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: fill absent properties that have a default, then descend."""
    if isinstance(value, dict) and "properties" in schema:
        for name, child in schema["properties"].items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = apply_defaults(child, value[name])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def normalise(value: Any) -> Any:
    """Drop absent-equivalent values (None, [], {}) so that omitted and empty compare equal."""
    if isinstance(value, dict):
        out = {k: normalise(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value

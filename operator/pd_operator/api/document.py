"""The whole PDDeployment object, and readable validation errors."""

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.api.status import PDDeploymentStatus
from pd_operator.api.types import DNS_LABEL_PATTERN

GROUP = "pdoperator.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PDDeployment"
PLURAL = "pddeployments"
# The name becomes a label value and the prefix of child names, so it is a DNS label.
MAX_NAME_LENGTH = 63
NAME_LENGTH_MESSAGE = (
    f"metadata.name must be at most {MAX_NAME_LENGTH} characters: child objects and their "
    "labels carry it"
)
NAME_RULE_MESSAGE = "metadata.name must be a DNS label (lower-case letters, digits, '-')"


class ObjectMeta(BaseModel):
    """The parts of metadata the operator reads; the rest passes through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: Annotated[StrictStr, Field(min_length=1)]
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _dns_label(cls, name: str) -> str:
        if len(name) > MAX_NAME_LENGTH:
            raise ValueError(NAME_LENGTH_MESSAGE)
        if not re.fullmatch(DNS_LABEL_PATTERN, name):
            raise ValueError(NAME_RULE_MESSAGE)
        return name


class PDDeployment(BaseModel):
    """A PDDeployment as stored by the apiserver."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: Literal["pdoperator.io/v1alpha1"] = Field(
        "pdoperator.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["PDDeployment"] = "PDDeployment"
    metadata: ObjectMeta
    spec: PDDeploymentSpec
    status: PDDeploymentStatus | None = None


def error_path(loc: tuple[int | str, ...]) -> str:
    """Turn a pydantic error location into a Kubernetes-style field path."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def describe_errors(error: ValidationError, prefix: str = "") -> list[str]:
    """One line per problem: `field.path: what is wrong`."""
    lines = []
    for item in error.errors():
        loc = ((prefix,) if prefix else ()) + tuple(item["loc"])
        # Strict-type and literal errors carry the rejected input; say what was given.
        message = item["msg"].removeprefix("Value error, ")  # pydantic's wrapping of ours
        if item["type"] in {"int_type", "string_type", "literal_error", "extra_forbidden"}:
            message += f" (got {item['input']!r})"
        lines.append(f"{error_path(loc)}: {message}")
    return lines


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML parse error on one line: where, and what."""
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return f"not YAML: {where}{getattr(error, 'problem', None) or error}"


def read_yaml(path: str | Path) -> Any:
    """A YAML file's document; ValueError (`yaml_problem`) when it does not parse."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        raise ValueError(yaml_problem(error)) from None


class InvalidSpecError(ValueError):
    """A PDDeployment document that the API rejects; `problems` name each field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse_pddeployment(document: dict[str, Any]) -> PDDeployment:
    """Validate a whole PDDeployment document, raising InvalidSpecError with field paths."""
    try:
        return PDDeployment.model_validate(document, by_alias=True, by_name=False)
    except ValidationError as error:
        raise InvalidSpecError(describe_errors(error)) from None

"""Constrained wire types shared by the spec models.

Strict types, so that a fraction or a quoted number where an integer belongs is an error,
exactly as the CRD's OpenAPI schema decides: the apiserver accepts a whole-valued number such as
60.0 for an integer field (JSON has one number type), so the models do too.
"""

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictStr

# DNS-1123 label: pool names become part of child object names.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A Kubernetes qualified name with an optional DNS-subdomain prefix, e.g. mthreads.com/gpu.
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E)?$"


def _whole_number(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("Input should be a valid integer")  # YAML's true/false are not 1/0
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("Input should be a valid integer, got a number with a fractional part")
        return int(value)
    if not isinstance(value, int):
        raise ValueError("Input should be a valid integer")
    return value


# An integer on the wire: int, or a float with no fractional part; never a string or a bool.
# It goes last in an Annotated, after the Field bounds, so that the JSON schema keeps them.
WHOLE_NUMBER = BeforeValidator(_whole_number)

# The apiserver's validation rules (CEL) cannot read an integer field sent as a whole float (a
# raw JSON client's 1.0 passes the schema, then every rule that reads it fails with "invalid
# data, expected int, got float64"): a field a rule reads takes integers only, and its own rule
# says so at the field. kubectl turns a YAML 1.0 into 1 before sending it.
INTEGER_LITERAL_MESSAGE = "must be written as an integer (1, not 1.0): validation rules read it"


def _integer_literal(value: Any) -> Any:
    if isinstance(value, float):
        raise ValueError(INTEGER_LITERAL_MESSAGE)
    return _whole_number(value)


# For an integer field that a CEL rule reads; goes where WHOLE_NUMBER would.
INTEGER_LITERAL = BeforeValidator(_integer_literal)
INTEGER_LITERAL_RULE: dict[str, Any] = {
    "x-kubernetes-validations": [{"rule": "type(self) == int", "message": INTEGER_LITERAL_MESSAGE}]
}

PoolName = Annotated[StrictStr, Field(min_length=1, max_length=32, pattern=DNS_LABEL_PATTERN)]
ShortText = Annotated[StrictStr, Field(max_length=253)]
LabelKey = Annotated[StrictStr, Field(min_length=1, max_length=317, pattern=QUALIFIED_NAME_PATTERN)]
LabelValue = Annotated[StrictStr, Field(max_length=63)]
Quantity = Annotated[StrictStr, Field(min_length=1, max_length=32, pattern=QUANTITY_PATTERN)]
Replicas = Annotated[int, Field(ge=0, le=1000), WHOLE_NUMBER]
# Replicas that a CEL rule reads (bounds, schedule floors).
RuleReplicas = Annotated[
    int, Field(ge=0, le=1000, json_schema_extra=INTEGER_LITERAL_RULE), INTEGER_LITERAL
]
Milliseconds = Annotated[int, Field(ge=1, le=3_600_000), WHOLE_NUMBER]
Seconds = Annotated[int, Field(ge=0, le=86_400), WHOLE_NUMBER]
RuleSeconds = Annotated[
    int, Field(ge=0, le=86_400, json_schema_extra=INTEGER_LITERAL_RULE), INTEGER_LITERAL
]

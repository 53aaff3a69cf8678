"""Constrained wire types shared by the spec models.

Strict types, so that a fraction or a quoted number where an integer belongs is an error,
exactly as the CRD's OpenAPI schema decides: the apiserver accepts a whole-valued number such as
60.0 for an integer field (JSON has one number type), so the models do too.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, localcontext
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StrictStr,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

# DNS-1123 label: pool names become part of child object names.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
# The name part of a qualified name: at most 63 characters (the bound is in the regex).
_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
# A Kubernetes qualified name (a label or annotation key) with an optional DNS-subdomain prefix,
# e.g. mthreads.com/gpu; the prefix's bound of 253 characters is a rule of its own.
QUALIFIED_NAME_PATTERN = rf"^({_SUBDOMAIN}/)?{_NAME_PART}$"
MAX_PREFIX_LENGTH = 253
# An extended resource: always domain-qualified (a name without one is cpu, memory and the like).
EXTENDED_RESOURCE_PATTERN = rf"^{_SUBDOMAIN}/{_NAME_PART}$"
# The name of another object a pod names (ServiceAccount, PriorityClass); empty means unset.
OBJECT_NAME_PATTERN = rf"^({_SUBDOMAIN})?$"
# A taint's key: a qualified name, or empty (a toleration of every taint).
TAINT_KEY_PATTERN = rf"^(({_SUBDOMAIN}/)?{_NAME_PART})?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E)?$"

QUALIFIED_NAME_RULES = (
    f"an optional lowercase DNS-subdomain prefix of at most {MAX_PREFIX_LENGTH} characters and "
    "'/', then a name of at most 63 letters, digits, '-', '_' or '.' that begins and ends with a "
    "letter or digit"
)
QUALIFIED_NAME_MESSAGE = (
    f"must be a qualified name such as example.com/name: {QUALIFIED_NAME_RULES}"
)
TAINT_KEY_MESSAGE = (
    "must be empty (with operator Exists: every taint) or a qualified name such as "
    f"example.com/name: {QUALIFIED_NAME_RULES}"
)
EXTENDED_RESOURCE_MESSAGE = (
    "must be an extended resource name with a domain, such as nvidia.com/gpu: a lowercase "
    "DNS-subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' or '.' "
    "that begins and ends with a letter or digit"
)
# The apiserver checks an extended resource's quota name, requests.<name>, as a qualified name.
MAX_RESOURCE_PREFIX_LENGTH = MAX_PREFIX_LENGTH - len("requests.")
RESOURCE_DOMAIN_MESSAGE = (
    f"the domain of an extended resource must be at most {MAX_RESOURCE_PREFIX_LENGTH} "
    "characters and must not begin with 'requests.'"
)
LABEL_VALUE_MESSAGE = (
    "must be a label value: empty, or at most 63 letters, digits, '-', '_' or '.' that begin "
    "and end with a letter or digit"
)
OBJECT_NAME_MESSAGE = (
    "must be a DNS-1123 subdomain such as high-priority: lowercase letters, digits, '-' and "
    "'.', beginning and ending with a letter or digit"
)


@dataclass(frozen=True)
class Matches:
    """A regex the whole string must match: `pattern` in the CRD's schema, `message` from the
    models (pydantic's own says only which regex)."""

    pattern: str
    message: str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        regex = re.compile(self.pattern)

        def check(value: str) -> str:
            if not regex.fullmatch(value):
                raise ValueError(self.message)
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["pattern"] = self.pattern
        return json_schema


@dataclass(frozen=True)
class StringRule:
    """A check no cheap regex expresses: `rule`, a CEL rule over the string (`self`), in the
    CRD; `check`, the same test in Python, in the models."""

    rule: str
    check: Callable[[str], bool]
    message: str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def validate(value: str) -> str:
            if not self.check(value):
                raise ValueError(self.message)
            return value

        return core_schema.no_info_after_validator_function(validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        rule = {"rule": self.rule, "message": self.message}
        json_schema.setdefault("x-kubernetes-validations", []).append(rule)
        return json_schema


def prefix_at_most(limit: int, message: str) -> StringRule:
    """At most `limit` characters before the '/' of a qualified name (its DNS-subdomain prefix)."""
    return StringRule(
        f"self.indexOf('/') <= {limit}", lambda value: value.find("/") <= limit, message
    )


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

MAX_INT64 = 2**63 - 1


def _int64(value: int) -> int:
    if value > MAX_INT64:
        raise ValueError(f"must be at most {MAX_INT64} (the apiserver's int64)")
    return value


# An int64 field of a core/v1 object. Checked here only: the CRD's `maximum` is a float64, and
# 2^63-1 as one is 2^63, which the apiserver refuses as a bound of an integer field; it refuses
# every number above int64 as "not an integer" by itself.
INT64 = AfterValidator(_int64)

PoolName = Annotated[StrictStr, Field(min_length=1, max_length=32, pattern=DNS_LABEL_PATTERN)]
ShortText = Annotated[StrictStr, Field(max_length=253)]
LabelKey = Annotated[
    StrictStr,
    Field(min_length=1, max_length=317),
    Matches(QUALIFIED_NAME_PATTERN, QUALIFIED_NAME_MESSAGE),
    prefix_at_most(MAX_PREFIX_LENGTH, QUALIFIED_NAME_MESSAGE),
]
LabelValue = Annotated[
    StrictStr, Field(max_length=63), Matches(LABEL_VALUE_PATTERN, LABEL_VALUE_MESSAGE)
]
ObjectName = Annotated[
    StrictStr, Field(max_length=253), Matches(OBJECT_NAME_PATTERN, OBJECT_NAME_MESSAGE)
]
TaintKey = Annotated[
    StrictStr,
    Field(max_length=317),
    Matches(TAINT_KEY_PATTERN, TAINT_KEY_MESSAGE),
    prefix_at_most(MAX_PREFIX_LENGTH, TAINT_KEY_MESSAGE),
]
ResourceName = Annotated[
    StrictStr,
    Field(min_length=1, max_length=253),
    Matches(EXTENDED_RESOURCE_PATTERN, EXTENDED_RESOURCE_MESSAGE),
    StringRule(
        f"!self.startsWith('requests.') && self.indexOf('/') <= {MAX_RESOURCE_PREFIX_LENGTH}",
        lambda value: (
            not value.startswith("requests.") and value.find("/") <= MAX_RESOURCE_PREFIX_LENGTH
        ),
        RESOURCE_DOMAIN_MESSAGE,
    ),
]
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


_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{suffix: Decimal(10) ** (3 * power) for power, suffix in enumerate("kMGTPE", 1)},
    **{suffix + "i": Decimal(2) ** (10 * power) for power, suffix in enumerate("KMGTPE", 1)},
}
_QUANTITY = re.compile(QUANTITY_PATTERN)
_NANO = Decimal("1e-9")


def quantity_value(text: str) -> Decimal:
    """The value the apiserver compares for a quantity that QUANTITY_PATTERN admits: exact, and
    rounded up to a whole nano-unit as its parser does."""
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    suffix = match.group(2) or ""
    with localcontext(prec=80):  # exact to the nano-unit for every value the pattern admits
        value = Decimal(text.removesuffix(suffix)) * _SUFFIXES[suffix]
        return value.quantize(_NANO, rounding=ROUND_CEILING)

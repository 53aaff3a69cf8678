"""Kubernetes resource quantities as exact decimals ("500m", "64Gi", "8")."""

import re
from decimal import Decimal, InvalidOperation

_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
# Kubernetes' grammar: a signed decimal number (digits on at least one side of one point), then
# a decimal exponent or a suffix.
_PATTERN = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
)


def parse_quantity(text: str | int) -> Decimal:
    """The exact value of a quantity; ValueError when it is not one."""
    if isinstance(text, int):
        return Decimal(text)
    match = _PATTERN.match(text.strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number + (exponent or ""))
    except InvalidOperation:  # never for what the pattern admits; kept as ValueError regardless
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from None
    return value * _SUFFIXES[suffix or ""]


def same_quantity(a: object, b: object) -> bool:
    """True when both are quantities of equal value (e.g. "1000m" and "1")."""
    if not isinstance(a, str | int) or not isinstance(b, str | int):
        return False
    try:
        return parse_quantity(a) == parse_quantity(b)
    except ValueError:
        return False

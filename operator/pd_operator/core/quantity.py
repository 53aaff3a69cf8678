"""Kubernetes resource quantities as exact decimals ("500m", "64Gi", "8")."""

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

_SUFFIXES = {
    # n and u are not in the documented grammar, but the apiserver writes them back (a memory
    # limit of "0.0001" is stored as "100u") and its parser reads them.
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
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
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+)?(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
)


def parse_quantity(text: str | int) -> Decimal:
    """The exact value of a quantity; ValueError when it is not one."""
    if isinstance(text, int):
        return Decimal(text)
    # No trimming: the apiserver's parser refuses " 1" and "1 " too.
    match = _PATTERN.fullmatch(text)
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number + (exponent or ""))
    except InvalidOperation:  # never for what the pattern admits; kept as ValueError regardless
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from None
    return value * _SUFFIXES[suffix or ""]


_MILLI = Decimal("0.001")


def same_quantity(a: object, b: object) -> bool:
    """True when both are quantities of the same value (e.g. "1000m" and "1"), or one is what
    the apiserver stores for the other: CPU is kept to whole milli-units, rounded up ("0.1m"
    written is "1m" stored, "1.5m" is "2m")."""
    if not isinstance(a, str | int) or not isinstance(b, str | int):
        return False
    try:
        x, y = parse_quantity(a), parse_quantity(b)
    except ValueError:
        return False
    return x == y or _milli_ceiling(x) == y or _milli_ceiling(y) == x


def _milli_ceiling(value: Decimal) -> Decimal:
    return value.quantize(_MILLI, rounding=ROUND_CEILING)

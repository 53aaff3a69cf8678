"""Checked command-line values: bad input names its flag and what it takes, never a traceback."""

import argparse
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TypeVar

Number = TypeVar("Number", int, float)


class UsageError(Exception):
    """Input `pdctl` cannot use; the message names the flag and the fix."""


def _checked(
    convert: Callable[[str], Number], check: Callable[[Number], bool], wants: str
) -> Callable[[str], Number]:
    def parse(text: str) -> Number:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"want {wants}, got {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"want {wants}, got {text}")
        return value

    return parse


# argparse `type=` functions: argparse prints "argument --flag: want ..., got ..." and exits 2.
positive = _checked(float, lambda v: v > 0, "a number greater than 0")
non_negative = _checked(float, lambda v: v >= 0, "a number of at least 0")
fraction = _checked(float, lambda v: 0 <= v <= 1, "a fraction from 0 to 1")
share = _checked(float, lambda v: 0 < v <= 1, "a share greater than 0 and at most 1")
tokens = _checked(float, lambda v: v >= 1, "a length of at least one token")
count = _checked(int, lambda v: v >= 1, "a whole number of at least 1")
port = _checked(int, lambda v: 0 <= v <= 65535, "a port from 1 to 65535, or 0 to disable it")


def _unix_time(text: str) -> float:
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


wall_clock = _checked(
    _unix_time, lambda v: True, "an ISO 8601 time such as 2026-12-01T08:30:00+08:00"
)


@contextmanager
def about(flag: str) -> Iterator[None]:
    """Report a ValueError or OSError raised while using `flag`'s value as that flag's error."""
    try:
        yield
    except OSError as error:  # "No such file or directory", without the path said twice
        raise UsageError(f"{flag}: {error.strerror or error}") from None
    except ValueError as error:
        raise UsageError(f"{flag}: {error}") from None


def prices(items: list[str] | None, flag: str, known: Collection[str]) -> dict[str, float]:
    """`PROFILE=PRICE` items (repeatable flag) as a mapping; each profile must be known."""
    out: dict[str, float] = {}
    for item in items or []:
        key, sign, text = item.partition("=")
        if not sign or key not in known:
            raise UsageError(f"{flag} {item!r}: want PROFILE=PRICE, PROFILE one of {_list(known)}")
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise UsageError(f"{flag} {item!r}: the price must be a number of at least 0")
        out[key] = value
    return out


def known(value: str, flag: str, names: Collection[str], what: str) -> str:
    """`value` if it is one of `names`, else an error that lists them."""
    if value not in names:
        raise UsageError(f"{flag}: unknown {what} {value!r}; known: {_list(names)}")
    return value


def _list(names: Collection[str]) -> str:
    return ", ".join(sorted(names))

"""Checked command-line values: bad input names its option and what it takes, never a traceback."""

import argparse
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

Number = TypeVar("Number", int, float)


class UsageError(click.UsageError):
    """Input `pdctl` cannot use; the message names the option and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(message, click.get_current_context(silent=True))


class Checked(click.ParamType[Number]):
    """A number (or time) with a range: `pdctl` prints "--flag: want ..., got ..." and exits 2."""

    def __init__(
        self,
        name: str,
        convert: Callable[[str], Number],
        check: Callable[[Number], bool],
        wants: str,
    ) -> None:
        self.name = name
        self._convert: Callable[[str], Number] = convert
        self._check: Callable[[Number], bool] = check
        self.wants = wants

    def parse(self, text: str) -> Number:
        """`text` as a value in range; ValueError saying what it wants otherwise."""
        try:
            value = self._convert(text)
        except ValueError:
            raise ValueError(f"want {self.wants}, got {text!r}") from None
        if not self._check(value):
            raise ValueError(f"want {self.wants}, got {text}")
        return value

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Number:
        try:
            return self.parse(value if isinstance(value, str) else str(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)

    def for_argparse(self, text: str) -> Number:
        """The same check as an argparse `type=` (the bench scripts' parsers)."""
        try:
            return self.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None


def _unix_time(text: str) -> float:
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


POSITIVE = Checked("number", float, lambda v: v > 0, "a number greater than 0")
NON_NEGATIVE = Checked("number", float, lambda v: v >= 0, "a number of at least 0")
FRACTION = Checked("fraction", float, lambda v: 0 <= v <= 1, "a fraction from 0 to 1")
SHARE = Checked("share", float, lambda v: 0 < v <= 1, "a share greater than 0 and at most 1")
TOKENS = Checked("tokens", float, lambda v: v >= 1, "a length of at least one token")
COUNT = Checked("count", int, lambda v: v >= 1, "a whole number of at least 1")
PORT = Checked("port", int, lambda v: 0 <= v <= 65535, "a port from 1 to 65535, or 0 to disable it")
WALL_CLOCK = Checked(
    "time", _unix_time, lambda v: True, "an ISO 8601 time such as 2026-12-01T08:30:00+08:00"
)


class AnyCase(click.Choice[str]):
    """One of `choices` in any case, given as spelled; help and errors spell them so too."""

    def __init__(self, choices: Collection[str]) -> None:
        super().__init__(choices, case_sensitive=False)

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "[" + "|".join(self.choices) + "]"

    def get_invalid_choice_message(self, value: Any, ctx: click.Context | None) -> str:
        return f"{value!r} is not one of {', '.join(self.choices)} (in any case)"


@contextmanager
def about(flag: str) -> Iterator[None]:
    """Report a ValueError or OSError raised while using `flag`'s value as that flag's error."""
    try:
        yield
    except OSError as error:  # "No such file or directory", without the path said twice
        raise UsageError(f"{flag}: {error.strerror or error}") from None
    except ValueError as error:
        raise UsageError(f"{flag}: {error}") from None


def prices(items: Collection[str], flag: str, known: Collection[str]) -> dict[str, float]:
    """`PROFILE=PRICE` items (repeatable flag) as a mapping; each profile must be known."""
    out: dict[str, float] = {}
    for item in items:
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


def one_line(error: click.ClickException) -> str:
    """The error as `pdctl COMMAND: --option: what it wants`."""
    ctx = error.ctx if isinstance(error, click.UsageError) else None
    where = ctx.command_path if ctx else "pdctl"
    if isinstance(error, click.exceptions.NoArgsIsHelpError):
        return error.format_message()  # the help: what the command takes
    if (
        isinstance(error, click.BadParameter)
        and not isinstance(error, click.MissingParameter)
        and error.param is not None
    ):
        if isinstance(error.param, click.Option):
            name = max(error.param.opts, key=len)
        else:
            name = error.param.human_readable_name
        return f"{where}: {name}: {error.message}"
    return f"{where}: {error.format_message()}"


def exit_status(call: Callable[[], Any]) -> int:
    """Run a click command's `main(..., standalone_mode=False)`: its exit status, and input it
    cannot use as one line on stderr naming the option (exit 2), never a traceback."""
    try:
        result = call()
        return result if isinstance(result, int) else 0
    except click.ClickException as error:
        click.echo(one_line(error), err=True)
        return error.exit_code
    except click.Abort:  # Ctrl-C outside a command's own handling
        click.echo("pdctl: interrupted", err=True)
        return 130

"""`pdctl`: the pd-operator command line. One module per command group; this one assembles them
and turns input a command cannot use into one line on stderr naming the option, exit 2."""

import sys
from collections.abc import Sequence
from typing import Any

import click

from pd_operator import __version__
from pd_operator.cli import deprecated
from pd_operator.cli.demo import demo
from pd_operator.cli.plan import plan
from pd_operator.cli.run import run
from pd_operator.cli.sim import sim


def _one_line(error: click.ClickException) -> str:
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


class Pdctl(deprecated.Group):
    """The root group: a command's return value is the exit status, and an error is one line."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            result = super().main(
                args,
                prog_name,
                complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
            status = result if isinstance(result, int) else 0
        except click.ClickException as error:
            click.echo(_one_line(error), err=True)
            status = error.exit_code
        except click.Abort:  # Ctrl-C outside a command's own handling
            click.echo("pdctl: interrupted", err=True)
            status = 130
        if standalone_mode:
            sys.exit(status)
        return status


@click.group(
    "pdctl",
    cls=Pdctl,
    renamed={"simulate": ("sim", "replay")},
    context_settings={"show_default": True, "help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="pdctl", message="%(prog)s %(version)s")
def pdctl() -> None:
    """pdctl: the pd-operator command line."""


for command in (run, sim, plan, demo):
    pdctl.add_command(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `pdctl`: the exit status. Input it cannot use exits 2 with one line on
    stderr naming the option and what it takes."""
    status: int = pdctl.main(args=argv, prog_name="pdctl", standalone_mode=False)
    return status


if __name__ == "__main__":
    sys.exit(main())

"""`pdctl`: the pd-operator command line. One module per command group; this one assembles them
and turns input a command cannot use into one line on stderr naming the option, exit 2."""

import sys
from collections.abc import Sequence
from typing import Any

import click

from pd_operator import __version__
from pd_operator.cli.arguments import exit_status
from pd_operator.cli.run import run
from pd_tools.cli import deprecated
from pd_tools.cli.demo import demo
from pd_tools.cli.plan import plan
from pd_tools.cli.sim import sim


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
        status = exit_status(
            lambda: super(Pdctl, self).main(
                args,
                prog_name,
                complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
        )
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

"""Old spellings of commands and options: hidden, still working, each with one warning line."""

from collections.abc import Mapping
from typing import Any

import click


def warn(ctx: click.Context, old: str, new: str) -> None:
    """One line on stderr: the old spelling works, and which one replaces it."""
    click.echo(f"{ctx.command_path}: {old} is deprecated; use {new}", err=True)


class Command(click.Command):
    """A command that also takes its options' old names (`renamed`: old -> new), unlisted."""

    def __init__(self, *args: Any, renamed: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.renamed = dict(renamed or {})

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        current = []
        for position, arg in enumerate(args):
            if arg == "--":  # what follows is not an option
                current += args[position:]
                break
            name, equals, value = arg.partition("=")
            if name in self.renamed:
                warn(ctx, name, self.renamed[name])
            current.append(self.renamed.get(name, name) + equals + value)
        return super().parse_args(ctx, current)


class Group(click.Group):
    """A group that also runs its commands' old names (`renamed`: old -> new path), unlisted."""

    def __init__(
        self, *args: Any, renamed: Mapping[str, tuple[str, ...]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.renamed = dict(renamed or {})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        path = self.renamed.get(cmd_name)
        if path is None:
            return super().get_command(ctx, cmd_name)
        warn(ctx, cmd_name, " ".join(path))
        command: click.Command | None = self
        for name in path:
            command = command.commands.get(name) if isinstance(command, click.Group) else None
        return command

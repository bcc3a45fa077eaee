"""A click group that imports a command's module only when that command runs (or help lists it).

``rolloutpool operator`` and ``rolloutpool router`` import their own modules and nothing of the
simulator, the plots, the dev cluster or the benchmarks. A command whose third-party packages are
not installed (an operator image has no ``[sim]`` extra) fails with the extra to install, both
when its module cannot be imported and when the command imports a missing package as it runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

__all__ = ["LazyCommand", "LazyGroup", "missing_extra_message"]


@dataclass(frozen=True)
class LazyCommand:
    """Where a command lives (``"module:attribute"``) and the extra its packages come with."""

    target: str
    extra: str | None = None
    """``None``: the base install has every package the command imports."""


def missing_extra_message(name: str, extra: str | None, err: ModuleNotFoundError) -> str:
    """What to tell the user when ``rolloutpool NAME`` needs a package that is not installed."""
    package = err.name or str(err)
    if extra is None:
        return f"`rolloutpool {name}` needs the Python package {package!r}, which is not installed"
    return (
        f"`rolloutpool {name}` needs the {extra!r} extra (the Python package {package!r} is not installed): "
        f"pip install 'rolloutpool[{extra}]'"
    )


def _third_party(err: ModuleNotFoundError) -> bool:
    return bool(err.name) and str(err.name).split(".")[0] != "rolloutpool"


def _unavailable(name: str, extra: str | None, err: ModuleNotFoundError) -> click.Command:
    message = missing_extra_message(name, extra, err)

    def fail() -> None:
        raise click.ClickException(message)

    return click.Command(
        name,
        callback=fail,
        help=f"(not installed: pip install 'rolloutpool[{extra}]')" if extra else "(not installed)",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
    )


class LazyGroup(click.Group):
    """A group whose commands are ``name -> LazyCommand`` and load on first use."""

    def __init__(self, *args: Any, lazy_commands: Mapping[str, LazyCommand], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        lazy = self.lazy_commands.get(cmd_name)
        if lazy is None:
            return super().get_command(ctx, cmd_name)
        module_name, _, attribute = lazy.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if not _third_party(err):
                raise
            return _unavailable(cmd_name, lazy.extra, err)
        command = getattr(module, attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{lazy.target} is not a click command")
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as err:
            name = ctx.invoked_subcommand
            lazy = self.lazy_commands.get(name or "")
            if name is None or lazy is None or not _third_party(err):
                raise
            raise click.ClickException(missing_extra_message(name, lazy.extra, err)) from err

"""Subcommands imported only when they run: :func:`lazy_group`.

Every server start and every client command is a new interpreter (``python -m orbitmq broker``,
``orbitmq topic list``), and importing every command's module to build the command tree cost
more than the command itself: the client commands, the benchmarks and ``cluster up`` import
the client, gRPC models and the in-process test servers, which a NameServer or a one-shot
``orbitmq user list`` never uses. A lazy group lists its lazy subcommands by name and imports
one (``module:attribute``, a ``typer.Typer`` or a command function) the first time click asks
for it: to run it, for its help line in ``--help``, or for shell completion. What it builds is
what ``add_typer(app, name=...)`` / ``command(name)(function)`` on the group would have built,
so help, options and behaviour are unchanged.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

import typer
from typer.core import TyperGroup
from typer.main import get_group

if TYPE_CHECKING:  # typer 0.29 vendors click: TyperGroup's methods take its classes
    from typer import _click as click


def lazy_group(lazy: Mapping[str, str], order: tuple[str, ...]) -> type[TyperGroup]:
    """A :class:`TyperGroup` class (``typer.Typer(cls=...)``) with the ``lazy`` subcommands
    (name -> ``"module:attribute"``) besides the ones registered on the app; ``--help`` lists
    them all in ``order`` (names not in it last, as registered)."""
    table = dict(lazy)
    rank = {name: at for at, name in enumerate(order)}

    class LazyGroup(TyperGroup):
        def list_commands(self, ctx: click.Context) -> list[str]:
            names = [*super().list_commands(ctx), *(n for n in table if n not in self.commands)]
            return sorted(names, key=lambda name: rank.get(name, len(rank)))

        def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
            found = super().get_command(ctx, cmd_name)
            if found is None and cmd_name in table:
                found = self.commands[cmd_name] = _load(cmd_name, table[cmd_name])
            return found

    return LazyGroup


def _load(name: str, target: str) -> click.Command:
    """The command ``add_typer``/``command`` would have made of ``target`` under ``name``."""
    module, _, attribute = target.partition(":")
    obj = getattr(importlib.import_module(module), attribute)
    holder = typer.Typer()
    if isinstance(obj, typer.Typer):
        holder.add_typer(obj, name=name)
    else:
        holder.command(name)(obj)
    return get_group(holder).commands[name]

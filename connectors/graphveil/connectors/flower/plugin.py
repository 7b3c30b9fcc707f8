"""The Flower connector as a GraphVeil plugin: adds ``graphveil fed`` to the command line.

Registered through the ``graphveil`` entry-point group like any plugin (entry point ``flower``),
so the core's command line learns of the connector only through the ``graphveil_add_commands``
hook. Every host loads this module, so it imports the commands (and their settings models) only
when a command line is built.
"""

from __future__ import annotations

from typing import Any

from graphveil.contract.hookspecs import hookimpl


@hookimpl
def graphveil_add_commands(subparsers: Any) -> None:
    from graphveil.connectors.flower.commands import add_fed_parser

    add_fed_parser(subparsers)

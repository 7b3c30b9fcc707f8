"""Plugins extend the ``graphveil`` command line through ``graphveil_add_commands``; the core imports no connector."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from graphveil.apps.cli import build_parser
from graphveil.contract.errors import PluginError
from graphveil.contract.hookspecs import hookimpl
from graphveil.contract.host import PluginHost


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


class _Hello:
    @hookimpl
    def graphveil_add_commands(self, subparsers):
        p = subparsers.add_parser("hello", help="say hello")
        p.add_argument("--name", default="world")
        p.set_defaults(func=lambda args: print(f"hello {args.name}") or 3)


class _TakesRun:
    @hookimpl
    def graphveil_add_commands(self, subparsers):
        subparsers.add_parser("run")


def test_fed_comes_from_the_flower_connector_through_the_hook() -> None:
    host = PluginHost(autoload=False)
    core = {"run", "demo", "plugins", "privacy", "budget", "sweep", "report", "plugin", "audit"}
    assert _commands(build_parser(host)) == core
    host.register("graphveil.connectors.flower.plugin", "flower")
    assert _commands(build_parser(host)) == core | {"fed"}


def test_a_plugin_command_is_parsed_and_dispatched(capsys: pytest.CaptureFixture[str]) -> None:
    host = PluginHost(autoload=False)
    host.register(_Hello(), "hello")
    args = build_parser(host).parse_args(["hello", "--name", "site"])
    assert args.func(args) == 3
    assert capsys.readouterr().out == "hello site\n"


def test_a_command_name_taken_twice_names_the_plugins() -> None:
    host = PluginHost(autoload=False)
    host.register(_TakesRun(), "takes_run")
    with pytest.raises(PluginError, match=r"'takes_run'.*conflicting subparser: run"):
        build_parser(host)


def test_core_cli_modules_import_no_connector_or_plugin() -> None:
    code = ("import sys, graphveil.apps.cli, graphveil.apps.cli_budget, graphveil.apps.demo; "
            "bad = [m for m in sys.modules if m.startswith(('graphveil.plugins', 'graphveil.connectors'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_version_prints_the_one_version_even_with_a_broken_plugin(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import graphveil
    import graphveil.apps.cli as cli

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"graphveil {graphveil.__version__}\n"

    def broken() -> None:
        raise PluginError("plugin 'x' is broken")

    monkeypatch.setattr(cli, "build_parser", broken)  # a plugin that fails to load
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out == f"graphveil {graphveil.__version__}\n"
    assert cli.main(["plugins"]) == 2 and "broken" in capsys.readouterr().err
    monkeypatch.undo()
    with pytest.raises(SystemExit) as done:  # argparse's --version too, also after other options
        cli.main(["-v", "--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"graphveil {graphveil.__version__}\n"

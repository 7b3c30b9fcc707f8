"""Plugin host: discovery through entry points, pluggy's hook rules, clashes, read-only lifecycle views."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from _toy import small_relational_graph

from graphveil.contract.errors import ConfigError, PluginError
from graphveil.contract.hookspecs import hookimpl
from graphveil.contract.host import PluginHost, PluginWarning
from graphveil.run.config import config_from_dict

BUILTIN = {
    ("sampler", "entity_poisson_wor"), ("sampler", "entity_poisson_wr"),
    ("sampler", "edge_poisson_decoupled"), ("clipper", "freq_clip"), ("clipper", "standard_clip"),
    ("clipper", "per_tuple_clip"), ("clipper", "no_clip"), ("accountant", "coupled_rdp_freq"), ("accountant", "coupled_rdp_standard"),
    ("accountant", "edge_rdp"), ("accountant", "no_accounting"), ("encoder", "hf_lora"),
}

PLUGIN_SOURCE = textwrap.dedent(
    '''
    """A third-party plugin: clipping at half the threshold, declared as standard clipping."""
    from graphveil.contract.hookspecs import hookimpl
    from graphveil.plugins.entity_dp.clipping import StandardNodeClipper


    class HalfClip(StandardNodeClipper):
        """Standard per-tuple clipping at C/2 (a test plugin)."""

        def factors(self, batch, norms):
            return super().factors(batch, norms * 2.0)


    @hookimpl
    def graphveil_clippers():
        return {"half_clip": HalfClip}
    '''
)


def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str,
                   entry_point: str) -> None:
    """Install a real distribution (module + dist-info with an entry point) on sys.path."""
    (tmp_path / f"{module}.py").write_text(source)
    dist = tmp_path / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[graphveil]\n{entry_point} = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.fixture()
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    install_plugin(tmp_path, monkeypatch, "gv_halfclip", PLUGIN_SOURCE, "halfclip")
    yield tmp_path
    sys.modules.pop("gv_halfclip", None)


def test_builtins_register_through_entry_points() -> None:
    host = PluginHost()
    found = {(c.family, c.name) for c in host.components()}
    assert BUILTIN <= found
    for c in host.components():
        assert c.description and c.description != "(no description)", c.name


def test_third_party_plugin_is_discovered_and_selected_from_yaml(third_party: Path) -> None:
    host = PluginHost()
    info = host.get("clipper", "half_clip")
    assert info.plugin == "halfclip"
    config = config_from_dict({
        "sampler": {"name": "entity_poisson_wor", "batch_size": 8, "k_neg": 2, "degree_cap": 3},
        "clipper": {"name": "half_clip", "clip_norm": 2.0},
        "accountant": {"name": "coupled_rdp_standard"},
        "encoder": {"name": "hf_lora", "model": "tiny-bert"},
    })
    from graphveil.run.session import TrainingSession

    session = TrainingSession(config, host=host)
    session.assemble()
    assert type(session.clipper).__name__ == "HalfClip"
    assert session.clipper.clip_norm == 2.0


def test_autoload_off_switch_skips_third_party(third_party: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD", "1")
    host = PluginHost()
    assert ("clipper", "half_clip") not in {(c.family, c.name) for c in host.components()}
    assert ("clipper", "freq_clip") in {(c.family, c.name) for c in host.components()}
    assert host.pm.has_plugin("flower")  # the connector ships with GraphVeil: graphveil.connectors.*


def test_block_plugin_and_essential_cannot_be_blocked() -> None:
    host = PluginHost(block=["edge_dp"])
    assert "edge_rdp" not in {c.name for c in host.components("accountant")}
    with pytest.raises(PluginError, match="essential"):
        PluginHost(block=["standard"])


class _Clash:
    @hookimpl
    def graphveil_clippers(self):
        from graphveil.plugins.standard.no_clip import NoClip

        return {"freq_clip": NoClip}


def test_duplicate_name_names_both_plugins_and_changes_nothing() -> None:
    host = PluginHost()
    before = host.components()
    with pytest.raises(PluginError, match=r"'entity_dp'.*'clashing'|'clashing'.*'entity_dp'"):
        host.register(_Clash(), "clashing")
    assert host.components() == before
    assert not host.pm.has_plugin("clashing")


class _BadHook:
    @hookimpl
    def graphveil_sampler(self):  # typo: no such hook
        return {}


class _OptionalBadHook:
    @hookimpl(optionalhook=True)
    def graphveil_clipers(self):  # typo: optionalhook does not excuse an unknown graphveil_ hook
        return {}


@pytest.mark.parametrize(("plugin", "hook", "suggestion"), [
    (_BadHook(), "graphveil_sampler", "graphveil_samplers"),
    (_OptionalBadHook(), "graphveil_clipers", "graphveil_clippers"),
])
def test_unknown_hook_is_rejected_without_side_effects(plugin, hook: str, suggestion: str) -> None:
    host = PluginHost(autoload=False)
    with pytest.raises(PluginError, match=rf"plugin 'typo'.*'{hook}'.*no specification.*'{suggestion}'"):
        host.register(plugin, "typo")
    assert not host.pm.has_plugin("typo")
    assert not host.pm.hook.__dict__.get(hook)


UNMARKED_SOURCE = textwrap.dedent(
    '''
    """A plugin whose author forgot @hookimpl: the function is not a hook."""
    from graphveil.plugins.standard.no_clip import NoClip


    def graphveil_clippers():
        return {"forgotten_clip": NoClip}
    '''
)


def test_unmarked_hook_function_registers_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_plugin(tmp_path, monkeypatch, "gv_unmarked", UNMARKED_SOURCE, "unmarked")
    try:
        with pytest.warns(PluginWarning, match=r"'unmarked'.*graphveil_clippers is not marked @hookimpl"):
            host = PluginHost()
    finally:
        sys.modules.pop("gv_unmarked", None)
    assert host.pm.has_plugin("unmarked")
    assert "forgotten_clip" not in {c.name for c in host.components("clipper")}
    assert not [i for i in host.pm.hook.graphveil_clippers.get_hookimpls() if i.plugin_name == "unmarked"]


class _SpecName:
    @hookimpl(specname="graphveil_clippers")
    def more_clippers(self):
        from graphveil.plugins.standard.no_clip import NoClip

        return {"renamed_clip": NoClip}


def test_components_are_collected_through_pluggy() -> None:
    """pluggy decides what implements a hook (here ``specname``), not the attribute's name."""
    host = PluginHost(autoload=False)
    host.register(_SpecName(), "specname")
    assert host.get("clipper", "renamed_clip").plugin == "specname"


def _standard_only() -> PluginHost:
    host = PluginHost(autoload=False)
    host.register("graphveil.plugins.standard", "standard")
    return host


class _ReturnsNone:
    @hookimpl
    def graphveil_clippers(self):
        return None


class _ReturnsList:
    @hookimpl
    def graphveil_clippers(self):
        return ["no_clip"]


class _Raises:
    @hookimpl
    def graphveil_accountants(self):
        raise RuntimeError("boom")


class _Wrapper:
    @hookimpl(wrapper=True)
    def graphveil_clippers(self):
        return (yield)


class _ExtraArgument:
    @hookimpl
    def graphveil_clippers(self, config):
        return {}


class _NotASubclass:
    @hookimpl
    def graphveil_samplers(self):
        return {"half_sampler": dict}


class _GoodThenBad:
    """The good hook's component must not be recorded when another hook of the plugin fails."""

    @hookimpl
    def graphveil_samplers(self):
        from graphveil.plugins.edge_dp.sampler import PoissonDecoupledSampler

        return {"fresh_sampler": PoissonDecoupledSampler}

    @hookimpl
    def graphveil_clippers(self):
        return {"Bad-Name": dict}


@pytest.mark.parametrize(("plugin", "message"), [
    (_ReturnsNone(), r"graphveil_clippers\(\) must return a mapping .*got None"),
    (_ReturnsList(), r"graphveil_clippers\(\) must return a mapping .*got list"),
    (_Raises(), r"graphveil_accountants\(\) raised RuntimeError: boom"),
    (_Wrapper(), r"graphveil_clippers is a component hook and cannot be a wrapper"),
    (_ExtraArgument(), r"'graphveil_clippers'.*graphveil_clippers\(config\).*not be found in the hookspec"),
    (_NotASubclass(), r"sampler 'half_sampler' must subclass Sampler"),
    (_GoodThenBad(), r"clipper name 'Bad-Name'"),
])
def test_broken_plugin_is_refused_naming_it_and_changes_nothing(plugin, message: str) -> None:
    host = _standard_only()
    before = host.components()
    with pytest.raises(PluginError, match=rf"plugin 'broken'.*{message}") as err:
        host.register(plugin, "broken")
    assert "\n" not in str(err.value)  # the CLI prints errors on one line
    assert host.components() == before
    assert not host.pm.has_plugin("broken")
    assert host.pm.get_plugins() == {host.pm.get_plugin("standard")}


def test_same_plugin_object_cannot_register_twice() -> None:
    host = PluginHost(autoload=False)
    plugin = _SpecName()
    host.register(plugin, "first")
    with pytest.raises(PluginError, match="'second' is already registered as plugin 'first'"):
        host.register(plugin, "second")


class _BadName:
    @hookimpl
    def graphveil_clippers(self):
        from graphveil.plugins.standard.no_clip import NoClip

        return {"Bad-Name": NoClip}


def test_invalid_component_name() -> None:
    with pytest.raises(PluginError, match="Bad-Name"):
        PluginHost(autoload=False).register(_BadName(), "badname")


def test_unknown_component_lists_available() -> None:
    host = PluginHost()
    with pytest.raises(ConfigError, match="unknown clipper 'nope'.*freq_clip"):
        host.create("clipper", "nope")


def test_bad_component_param_names_field_and_value() -> None:
    host = PluginHost()
    with pytest.raises(ConfigError, match=r"clipper\.clip_norm.*-1"):
        host.create("clipper", "freq_clip", {"clip_norm": -1}, where="clipper")


# ----------------------------------------------------------------------------- lifecycle hooks


class _Meddler:
    """A monitoring plugin that tries to rewrite what it is shown."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.refused: list[str] = []

    @hookimpl
    def graphveil_step_end(self, step, metrics):
        self.seen.append(json.loads(json.dumps(metrics, default=dict)))
        try:
            metrics["loss"] = 123.0
        except TypeError:
            self.refused.append("step.set")
        try:
            del metrics["step"]
        except TypeError:
            self.refused.append("step.del")

    @hookimpl
    def graphveil_run_end(self, run_dir, report):
        try:
            report["epsilon"] = 0.0
        except TypeError:
            self.refused.append("run.set")
        try:
            report["dataset"]["claim"] = "none"
        except TypeError:
            self.refused.append("run.nested")


def test_lifecycle_hooks_get_read_only_views_and_records_are_unchanged(tmp_path: Path) -> None:
    config = config_from_dict({
        "name": "toy",
        "sampler": {"name": "entity_poisson_wor", "batch_size": 6, "k_neg": 2, "degree_cap": 3},
        "clipper": {"name": "freq_clip", "clip_norm": 1.0},
        "accountant": {"name": "coupled_rdp_freq"},
        "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 8, "lora_layers": 1},
        "training": {"steps": 2, "lr": 0.01, "optimizer": "sgd"},
        "privacy": {"noise_multiplier": 1.0},
        "evaluation": {"batch_size": 16},
        "output": {"dir": str(tmp_path / "run"), "progress": False},
        "data": {"split": {"train_fraction": 0.6}},
    })
    from graphveil.run.runner import run_training

    host = PluginHost()
    meddler = _Meddler()
    host.register(meddler, "meddler")
    result = run_training(config, host=host, graph=small_relational_graph())

    assert meddler.refused == ["step.set", "step.del"] * 2 + ["run.set", "run.nested"]
    run = result["run_dir"]
    written = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in written if "step" in x and not x.get("final")]
    assert steps == meddler.seen
    assert [x["step"] for x in steps] == [1, 2] and all(x["loss"] != 123.0 for x in steps)
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["epsilon"] > 0 and privacy["dataset"]["claim"] != "none"
    assert result["row"]["epsilon"] == privacy["epsilon"]

"""Plugin host: discovery through entry points, registration, clashes, a third-party plugin."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from graphveil.config import config_from_dict
from graphveil.errors import ConfigError, PluginError
from graphveil.hookspecs import hookimpl
from graphveil.host import PluginHost

BUILTIN = {
    ("sampler", "entity_poisson_wor"), ("sampler", "entity_poisson_wr"),
    ("sampler", "edge_poisson_decoupled"), ("clipper", "freq_clip"), ("clipper", "standard_clip"),
    ("clipper", "per_tuple_clip"), ("clipper", "no_clip"), ("accountant", "coupled_rdp_freq"), ("accountant", "coupled_rdp_standard"),
    ("accountant", "edge_rdp"), ("accountant", "no_accounting"), ("encoder", "hf_lora"),
}

PLUGIN_SOURCE = textwrap.dedent(
    '''
    """A third-party plugin: clipping at half the threshold, declared as standard clipping."""
    from graphveil.hookspecs import hookimpl
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


@pytest.fixture()
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Install a real distribution (module + dist-info with an entry point) on sys.path."""
    (tmp_path / "gv_halfclip.py").write_text(PLUGIN_SOURCE)
    dist = tmp_path / "gv_halfclip-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gv-halfclip\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[graphveil]\nhalfclip = gv_halfclip\n")
    monkeypatch.syspath_prepend(str(tmp_path))
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
    from graphveil.session import TrainingSession

    session = TrainingSession(config, host=host)
    session.assemble()
    assert type(session.clipper).__name__ == "HalfClip"
    assert session.clipper.clip_norm == 2.0


def test_autoload_off_switch_skips_third_party(third_party: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD", "1")
    host = PluginHost()
    assert ("clipper", "half_clip") not in {(c.family, c.name) for c in host.components()}
    assert ("clipper", "freq_clip") in {(c.family, c.name) for c in host.components()}


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


def test_unknown_hook_is_rejected_without_side_effects() -> None:
    host = PluginHost(autoload=False)
    with pytest.raises(PluginError, match="graphveil_sampler"):
        host.register(_BadHook(), "typo")
    assert not host.pm.has_plugin("typo")


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

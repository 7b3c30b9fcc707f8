"""Run config: YAML in, overrides, errors naming file, field and value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphveil.contract.errors import ConfigError
from graphveil.run.config import load_config, parse_override
from graphveil.run.session import TrainingSession

GOOD = """
name: t
sampler: {name: entity_poisson_wor, batch_size: 16, k_neg: 2, degree_cap: 5}
clipper: {name: freq_clip, clip_norm: 1.0}
accountant: {name: coupled_rdp_freq}
encoder: {name: hf_lora, model: tiny-bert}
privacy: {target_epsilon: 4}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def assembled(path: Path, overrides: list[str]) -> TrainingSession:
    """The run of ``path`` assembled (nothing read): where the data source's options are checked."""
    session = TrainingSession(load_config(path, overrides))
    session.assemble()
    return session


def test_load_and_override(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD), ["sampler.batch_size=64", "training.steps=7",
                                               "privacy.target_epsilon=2.5"])
    assert cfg.sampler.params == {"batch_size": 64, "k_neg": 2, "degree_cap": 5}
    assert cfg.training.steps == 7
    assert cfg.privacy.target_epsilon == 2.5


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("privacy.target_epsilon=0", r"run\.yaml: privacy\.target_epsilon: must be a finite number > 0 \(got 0\)"),
        ("privacy.delta=1.5", r"privacy\.delta: must be in \(0, 1\) \(got 1\.5\)"),
        ("training.steps=abc", r"training\.steps: .*integer.*\(got 'abc'\)"),
        ("training.bogus=1", r"training\.bogus: Extra inputs"),
        ("privacy.noise_multiplier=1.0", r"exactly one of privacy\.target_epsilon and privacy\.noise_multiplier"),
    ],
)
def test_errors_name_file_field_value(tmp_path: Path, override: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_config(write(tmp_path, GOOD), [override])


def test_missing_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="clipper: required field is missing"):
        load_config(write(tmp_path, GOOD.replace("clipper: {name: freq_clip, clip_norm: 1.0}\n", "")))


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "a: [unclosed"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_override_syntax() -> None:
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("novalue")


def test_seeds_default_to_fresh_and_research_noise_seed_is_opt_in(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.seed is None and cfg.privacy.research_noise_seed is None
    assert cfg.data.split.seed == 0  # the split key, not a training seed
    cfg = load_config(write(tmp_path, GOOD), ["seed=4", "privacy.research_noise_seed=9"])
    assert cfg.seed == 4 and cfg.privacy.research_noise_seed == 9


def test_removed_secure_rng_names_the_replacement(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("privacy: {target_epsilon: 4}", "privacy: {target_epsilon: 4, secure_rng: true}"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: privacy: privacy.secure_rng was removed")
    assert "always drawn from the OS CSPRNG" in msg and "privacy.research_noise_seed" in msg


def test_data_column_keys_default_to_the_loader_defaults_and_are_checked(tmp_path: Path) -> None:
    data = {"source": "edge_list", "path": "/d/e.csv", "entities": "/d/n.csv"}
    cfg = load_config(write(tmp_path, GOOD), [f"data={data}"])
    assert cfg.data.params == {"path": "/d/e.csv", "entities": "/d/n.csv"}  # kept as written: no defaults
    options = assembled(write(tmp_path, GOOD), [f"data={data}"]).data_options.params
    assert (options.source_col, options.target_col, options.id_col, options.text_col, options.label_col) == (
        None, None, "id", "text", None)
    assert options.path == Path("/d/e.csv")
    options = assembled(write(tmp_path, GOOD), [
        f"data={data}", "data.source_col=id_1", "data.target_col=id_2", "data.id_col=node", "data.text_col=abstract",
        "data.label_col=kind"]).data_options.params
    assert (options.source_col, options.target_col, options.id_col, options.text_col, options.label_col) == (
        "id_1", "id_2", "node", "abstract", "kind")
    from graphveil.plugins.standard.sources.edge_list import EdgeListOptions

    assert all(EdgeListOptions.model_fields[k].description
               for k in ("source_col", "target_col", "id_col", "text_col", "label_col"))


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (["data.source_col=id_1"], r"run\.yaml: data: give both data\.source_col and data\.target_col, or neither"),
        (["data.target_col=id_2"], r"give both data\.source_col and data\.target_col"),
        (["data.source_col=a", "data.target_col=a"], r"data\.source_col and data\.target_col name the same column 'a'"),
        (["data.id_col=x", "data.text_col=x"], r"data\.id_col and data\.text_col name the same column 'x'"),
        (["data.id_col="], r"data\.id_col: Input should be a valid string"),
        (["data.text_col=''"], r"data\.text_col: String should have at least 1 character"),
    ],
)
def test_data_column_key_errors_name_the_key(tmp_path: Path, overrides: list[str], pattern: str) -> None:
    edge_list = ["data.source=edge_list", "data.path=/d/e.csv", "data.entities=/d/n.csv"]
    load_config(write(tmp_path, GOOD), edge_list + overrides)  # the config checks only the shape
    with pytest.raises(ConfigError, match=pattern):
        assembled(write(tmp_path, GOOD), edge_list + overrides)


def test_data_column_keys_apply_to_table_sources_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.id_col applies only to sources 'edge_list', 'parquet', 'sql' \(source is 'citeseer'\)"):
        assembled(write(tmp_path, GOOD), ["data.id_col=node"])
    # even edge_list's default value is refused: an option of another source is a mistake
    with pytest.raises(ConfigError, match=r"data\.id_col applies only to sources 'edge_list', 'parquet', 'sql'"):
        assembled(write(tmp_path, GOOD), ["data.id_col=id"])


def test_graphveil_run_refuses_a_bad_data_option_naming_file_and_key_and_writes_nothing(tmp_path: Path, monkeypatch,
                                                                                      capsys) -> None:
    from graphveil.apps.cli import main

    monkeypatch.chdir(tmp_path)
    cfg = write(tmp_path, GOOD)
    before = sorted(tmp_path.rglob("*"))
    assert main(["run", str(cfg), "--set", "data.id_col=node", "--output", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{cfg}: data: data.id_col applies only to sources 'edge_list', 'parquet', 'sql' "
                        "(source is 'citeseer')") and len(err.splitlines()) == 1
    assert sorted(tmp_path.rglob("*")) == before  # no out, no out.partial, no runs/


def test_set_data_source_to_another_source_drops_the_files_source_options(tmp_path: Path) -> None:
    text = GOOD + "data: {source: planetoid, name: cora, split: {kind: random_node, seed: 3}, max_entities: 50}\n"
    cfg = load_config(write(tmp_path, text), ["data.source=pyg", "data.path=g.pt"])
    assert cfg.data.source == "pyg" and cfg.data.params == {"path": "g.pt"}
    assert cfg.data.split.kind == "random_node" and cfg.data.split.seed == 3 and cfg.data.max_entities == 50
    # the same source keeps the file's options, and an option given with --set stays whatever its place
    assert load_config(write(tmp_path, text), ["data.source=planetoid"]).data.params["name"] == "cora"
    cfg = load_config(write(tmp_path, text), ["data.path=g.pt", "data.source=pyg"])
    assert cfg.data.params == {"path": "g.pt"}
    with pytest.raises(ConfigError, match=r"run\.yaml: data: data\.name applies only to sources 'planetoid', 'twitch'"):
        assembled(write(tmp_path, text), ["data.source=pyg", "data.path=g.pt", "data.name=cora"])


@pytest.mark.parametrize("name", ["../../../x", "a/b", "a\\b", "..", ".hidden", "x\x00y", "line\nbreak", "",
                                  "a" * 201])
def test_a_run_name_is_one_plain_folder_name(tmp_path: Path, name: str) -> None:
    cfg = write(tmp_path, GOOD.replace("\nname: t\n", f"\nname: {json.dumps(name)}\n"))
    with pytest.raises(ConfigError, match=r"run\.yaml: name: not a plain folder name: .* \(got ") as info:
        load_config(cfg)
    assert repr(name) in str(info.value)
    assert load_config(cfg, ["name=cora-eps4.run_2"]).name == "cora-eps4.run_2"


def test_set_name_with_a_path_writes_nothing_outside_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    from graphveil.apps.cli import main

    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    cfg = write(work, GOOD)
    before = sorted(p for p in tmp_path.rglob("*"))
    assert main(["run", str(cfg), "--set", "name=../../../x", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "name: not a plain folder name: holds '/' or '\\' (got '../../../x')" in err
    assert sorted(p for p in tmp_path.rglob("*")) == before  # no runs/, no x-<time>.partial anywhere

"""The ``twitch`` data source: MUSAE Twitch graphs (shared ENGB folder, generated folders, bad
files, and a private DP-MLP run through the CLI on a generated folder)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from _paths import REPO

from graphveil.apps.cli import main
from graphveil.contract.data_source import check_source_options
from graphveil.contract.errors import ConfigError, DataError
from graphveil.contract.host import default_host
from graphveil.data.loaders import load_data
from graphveil.data.node_graph import NodeGraph
from graphveil.plugins.standard.sources.twitch import load_twitch
from graphveil.run.config import DataConfig, load_config
from graphveil.run.session import TrainingSession

ROOT = REPO
ENGB = ROOT.parent / "shared" / "data" / "social" / "musae_twitch_ENGB"
TARGET_HEADER = "id,days,mature,views,partner,new_id"


# ------------------------------------------------------------------------------ the real ENGB files


@pytest.fixture(scope="module")
def engb() -> NodeGraph:
    if not (ENGB / "ENGB_edges.csv").is_file():
        pytest.skip(f"shared MUSAE Twitch ENGB folder {ENGB} absent (see shared/data/README.md)")
    return load_data(DataConfig(source="twitch", path=ENGB))  # type: ignore[call-arg]


def test_engb_counts_match_the_data_readme(engb: NodeGraph) -> None:
    assert isinstance(engb, NodeGraph) and engb.name == "twitch-ENGB"
    assert engb.num_nodes == 7126
    assert engb.node_ids == [str(i) for i in range(7126)]
    assert engb.num_undirected_edges == 35324 and engb.num_edges == 70648
    assert engb.num_features == 3170 and engb.x.dtype == torch.float32
    assert engb.x.shape == (7126, 3170)
    assert engb.class_names == ["not_mature", "mature"]
    assert torch.bincount(engb.y).tolist() == [3238, 3888]  # False 3238, True 3888
    # no self-loop or repeated edge upstream, no isolated node: dp-gnn's preprocessing keeps all
    assert engb.notes["dropped_self_loops"] == 0 and engb.notes["dropped_duplicate_edges"] == 0
    assert engb.notes["dropped_isolated_nodes"] == 0 and engb.notes["dropped_small_classes"] == 0


def test_engb_rows_agree_with_the_raw_files(engb: NodeGraph) -> None:
    """Spot checks read straight from the files, not through the loader."""
    with (ENGB / "ENGB_target.csv").open(newline="") as f:
        targets = {int(r["new_id"]): r["mature"] == "True" for r in csv.DictReader(f)}
    assert engb.y.tolist() == [int(targets[i]) for i in range(7126)]
    feats = json.loads((ENGB / "ENGB.json").read_text())
    assert set(torch.unique(engb.x).tolist()) == {0.0, 1.0}
    assert int(engb.x.sum()) == sum(len(set(v)) for v in feats.values()) == 147683
    for nid in ("0", "3032", "7125"):
        assert engb.x[int(nid)].nonzero().flatten().tolist() == sorted(set(feats[nid]))
    with (ENGB / "ENGB_edges.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    present = set(map(tuple, engb.edge_index.t().tolist()))
    for row in rows[:50] + rows[-50:]:
        u, v = int(row["from"]), int(row["to"])
        assert (u, v) in present and (v, u) in present


def test_engb_through_the_dp_mlp_example_config() -> None:
    if not (ENGB / "ENGB_edges.csv").is_file():
        pytest.skip(f"shared MUSAE Twitch ENGB folder {ENGB} absent")
    cfg = load_config(ROOT / "examples" / "dp_mlp_cora.yaml",
                      ["data.source=twitch", f"data.path={ENGB}", "data.name=engb"])
    session = TrainingSession(cfg)
    session.assemble()
    assert session.data_options.params.model_dump() == {"path": ENGB, "name": "ENGB", "num_features": None,
                                                        "preprocess": "dp_gnn"}
    assert cfg.data.split.kind == "random_node"


# ------------------------------------------------------------------------------ generated folders


def write_twitch(folder: Path, *, lang: str = "DE", n: int = 150, f: int = 16, seed: int = 0,
                 layout: str = "flat") -> tuple[dict[int, bool], dict[int, list[int]], set[tuple[int, int]]]:
    """A MUSAE-format graph with node ids ``0..n-1`` listed in shuffled order; the label leaks
    into the features (feature ``f - 1`` for mature, ``0`` otherwise) so a model can learn it."""
    rng = random.Random(seed)
    mature = {i: rng.random() < 0.5 for i in range(n)}
    feats = {i: sorted(rng.sample(range(1, f - 1), 3) + [f - 1 if mature[i] else 0]) for i in range(n)}
    edges: set[tuple[int, int]] = set()
    for i in range(n):
        for _ in range(3):
            j = rng.randrange(n)
            if j != i and (j, i) not in edges:
                edges.add((i, j))
    names = {"flat": (f"{lang}_edges.csv", f"{lang}.json", f"{lang}_target.csv"),
             "musae": (f"edges/{lang}_edges.csv", f"features/{lang}.json", f"target/{lang}_target.csv"),
             "snap": (f"musae_{lang}_edges.csv", f"musae_{lang}_features.json", f"musae_{lang}_target.csv")}[layout]
    paths = [folder / name for name in names]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
    paths[0].write_text("from,to\n" + "".join(f"{u},{v}\n" for u, v in sorted(edges)))
    paths[1].write_text(json.dumps({str(i): v for i, v in feats.items()}))
    rows = [f"{9000 + i},{rng.randrange(3000)},{mature[i]},{rng.randrange(10**5)},False,{i}\n" for i in range(n)]
    rng.shuffle(rows)
    paths[2].write_text(TARGET_HEADER + "\n" + "".join(rows))
    return mature, feats, edges


def write_small(folder: Path, edges: str = "from,to\n10,20\n20,30\n", features: str | None = None,
                target: str | None = None, lang: str = "ENGB") -> Path:
    """Three nodes 10, 20, 30 (ids not contiguous); any file may be replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{lang}_edges.csv").write_text(edges)
    (folder / f"{lang}.json").write_text(features if features is not None else
                                         '{"30": [4], "10": [0, 2, 2], "20": []}')
    (folder / f"{lang}_target.csv").write_text(target if target is not None else (
        f"{TARGET_HEADER}\n1,5,True,7,False,20\n2,6,False,8,False,30\n3,7,True,9,True,10\n"))
    return folder


def test_generated_graph_is_built_exactly(tmp_path: Path) -> None:
    mature, feats, edges = write_twitch(tmp_path)
    g = load_twitch(tmp_path, preprocess="none")
    assert g.name == "twitch-DE" and g.num_nodes == 150 and g.num_features == 16
    assert g.node_ids == [str(i) for i in range(150)]  # sorted by id, not by the shuffled target rows
    assert g.y.tolist() == [int(mature[i]) for i in range(150)]
    expected = torch.zeros(150, 16)
    for i, ids in feats.items():
        expected[i, ids] = 1
    assert torch.equal(g.x, expected)
    both = edges | {(v, u) for u, v in edges}
    assert set(map(tuple, g.edge_index.t().tolist())) == both and g.num_edges == len(both)


def test_self_loops_repeated_edges_and_features_are_dropped_and_counted(tmp_path: Path) -> None:
    folder = write_small(tmp_path, edges="from,to\n10,20\n20,10\n10,20\n30,30\n20,30\n")
    g = load_twitch(folder, preprocess="none")
    assert g.node_ids == ["10", "20", "30"]
    assert g.y.tolist() == [1, 1, 0]
    assert g.x.tolist() == [[1, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
    assert sorted(map(tuple, g.edge_index.t().tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1)]
    assert g.notes == {"dropped_self_loops": 1, "dropped_duplicate_edges": 2, "repeated_feature_ids": 1}


def test_num_features_widens_the_multi_hot_and_refuses_a_larger_id(tmp_path: Path) -> None:
    folder = write_small(tmp_path)
    assert load_twitch(folder, preprocess="none", num_features=3170).x.shape == (3, 3170)
    with pytest.raises(DataError, match=r"ENGB\.json: feature id 4 does not fit num_features=4"):
        load_twitch(folder, preprocess="none", num_features=4)


@pytest.mark.parametrize("layout", ["musae", "snap"])
def test_musae_and_snap_layouts_and_the_language_from_file_names(tmp_path: Path, layout: str) -> None:
    write_twitch(tmp_path, lang="PTBR", layout=layout, n=60)
    g = load_twitch(tmp_path, preprocess="none")
    assert g.name == "twitch-PTBR" and g.num_nodes == 60


def test_several_languages_need_data_name(tmp_path: Path) -> None:
    write_twitch(tmp_path, lang="DE", n=60)
    write_twitch(tmp_path, lang="FR", n=70, seed=1)
    with pytest.raises(DataError, match=r"holds the Twitch graphs of DE, FR; set data.name"):
        load_twitch(tmp_path)
    assert load_twitch(tmp_path, "fr", preprocess="none").num_nodes == 70
    with pytest.raises(DataError, match=r"missing MUSAE Twitch edge file RU_edges\.csv"):
        load_twitch(tmp_path, "RU")


def test_config_names_the_bad_option(tmp_path: Path) -> None:
    folder = write_small(tmp_path)
    # the Cora examples say name: cora, planetoid's option: --set data.source=twitch drops it ...
    session = TrainingSession(load_config(ROOT / "examples" / "dp_mlp_cora.yaml",
                                          ["data.source=twitch", f"data.path={folder}"]))
    session.assemble()
    assert session.data_options.params.name is None
    # ... and cora, which is no Twitch language, is refused before reading when given for twitch
    with pytest.raises(ConfigError, match=r"dp_mlp_cora\.yaml: data: data\.name: must be a MUSAE Twitch language "
                                          r"code .*got 'cora'"):
        TrainingSession(load_config(ROOT / "examples" / "dp_mlp_cora.yaml",
                                    ["data.source=twitch", f"data.path={folder}", "data.name=cora"])).assemble()
    host = default_host()
    assert check_source_options(host, "twitch", {"path": folder, "name": "engb"}).name == "ENGB"
    with pytest.raises(ConfigError, match=r"data\.label: not an option of source 'twitch'"):
        check_source_options(host, "twitch", {"path": folder, "label": "views"})
    with pytest.raises(ConfigError, match=r"data\.path is required for source 'twitch'"):
        check_source_options(host, "twitch", {})
    with pytest.raises(ConfigError, match=r"data\.num_features: .*greater than 0"):
        check_source_options(host, "twitch", {"path": folder, "num_features": 0})


# ------------------------------------------------------------------------------ bad files


@pytest.mark.parametrize("missing", ["ENGB.json", "ENGB_target.csv"])
def test_a_missing_file_is_named(tmp_path: Path, missing: str) -> None:
    folder = write_small(tmp_path)
    (folder / missing).unlink()
    with pytest.raises(DataError, match=rf"{missing}: missing MUSAE Twitch file"):
        load_twitch(folder)


def test_a_missing_edge_file_or_folder_is_named(tmp_path: Path) -> None:
    folder = write_small(tmp_path)
    (folder / "ENGB_edges.csv").unlink()
    with pytest.raises(DataError, match=r"missing MUSAE Twitch edge file <L>_edges\.csv, L one of DE, ENGB"):
        load_twitch(folder)
    with pytest.raises(DataError, match=r"ENGB_edges\.csv.*never downloads"):
        load_twitch(folder, "ENGB")
    with pytest.raises(DataError, match=r"nowhere: no such folder"):
        load_twitch(tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"ENGB\.json: not a folder"):
        load_twitch(folder / "ENGB.json")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"edges": "source,target\n10,20\n"}, r"ENGB_edges\.csv, line 1: bad header 'source,target': no column from, to"),
        ({"edges": "10,20\n20,30\n"}, r"ENGB_edges\.csv, line 1: bad header '10,20'"),
        ({"edges": ""}, r"ENGB_edges\.csv: empty file"),
        ({"target": "id,days,views,new_id\n1,5,7,20\n"}, r"ENGB_target\.csv, line 1: bad header .*no column mature"),
        ({"edges": "from,to\n10,20\n20,99\n"}, r"ENGB_edges\.csv, line 3: unknown node id 99 \(no row in .*ENGB_target\.csv\)"),
        ({"edges": "from,to\n10,x\n"}, r"ENGB_edges\.csv, line 2: to 'x' is not a node id"),
        ({"edges": "from,to\n10,20,30\n"}, r"ENGB_edges\.csv, line 2: expected 2 fields, got 3"),
        ({"features": '{"10": [0], "20": [1], "30": [2], "40": [3]}'},
         r"ENGB\.json: node 40 has features but no target row in .*ENGB_target\.csv"),
        ({"features": '{"10": [0], "20": [1]}'}, r"ENGB\.json: node 30 \(from .*\) has no feature entry"),
        ({"features": '{"10": [0], "20": [1], "30": [-2]}'}, r"ENGB\.json: node 30: features must be a list"),
        ({"features": '{"10": [0], "20": [1], "30": ["a"]}'}, r"ENGB\.json: node 30: features must be a list"),
        ({"features": '{"10": [0], "20": [1], "x": [2]}'}, r"ENGB\.json: key 'x' is not a node id"),
        ({"features": '[1, 2]'}, r"ENGB\.json: expected a JSON object"),
        ({"features": '{"10": [0], '}, r"ENGB\.json: not valid JSON"),
        ({"target": f"{TARGET_HEADER}\n1,5,True,7,False,20\n2,6,maybe,8,False,30\n"},
         r"ENGB_target\.csv, line 3: mature is 'maybe', expected True or False"),
        ({"target": f"{TARGET_HEADER}\n1,5,True,7,False,20\n2,6,False,8,False,20\n"},
         r"ENGB_target\.csv, line 3: node 20 has a second target row \(first on line 2\)"),
        ({"target": f"{TARGET_HEADER}\n"}, r"ENGB_target\.csv: no target rows"),
    ],
)
def test_bad_files_are_refused_naming_file_line_and_problem(tmp_path: Path, change: dict, message: str) -> None:
    folder = write_small(tmp_path, **change)
    with pytest.raises(DataError, match=message):
        load_twitch(folder, preprocess="none")


def test_non_utf8_is_refused(tmp_path: Path) -> None:
    folder = write_small(tmp_path)
    (folder / "ENGB_edges.csv").write_bytes(b"from,to\n10,\xff20\n")
    with pytest.raises(DataError, match=r"ENGB_edges\.csv: not UTF-8"):
        load_twitch(folder)


# ------------------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_private_dp_mlp_run_on_a_generated_twitch_folder(tmp_path: Path, capsys) -> None:
    """``graphveil run examples/dp_mlp_cora.yaml`` pointed at a Twitch folder: 3 private steps."""
    data = tmp_path / "twitch"
    write_twitch(data, lang="ES")
    out = tmp_path / "run"
    sets = ["data.source=twitch", f"data.path={data}", "data.name=null", "training.epochs=null",
            "training.steps=3", "sampler.batch_size=8", "sweep=null"]
    argv = ["run", str(ROOT / "examples" / "dp_mlp_cora.yaml"), "--output", str(out), "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0, capsys.readouterr().err
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["private"] is True and privacy["steps"] == 3
    assert privacy["accountant"] == "node_rdp" and privacy["clipper"] == "per_node_clip"
    assert privacy["noise_multiplier"] > 0 and 0 < privacy["epsilon"] <= 16 + 1e-9
    assert privacy["dataset"]["dataset_nodes"] == 150  # the Twitch graph, not Cora (2708)
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["data"]["source"] == "twitch" and resolved["data"]["path"] == str(data)
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert 0 <= evaluation["test_accuracy"] <= 1
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if "step" in m] == [1, 2, 3]

"""Loaders: edge lists, TAPE CiteSeer (shared folder and bundled copy), PyG, load_graph."""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
from collections import Counter
from fractions import Fraction
from importlib import resources
from pathlib import Path

import pytest
import torch
import yaml
from torch_geometric.data import Data

from graphveil.apps.cli import main
from graphveil.contract.errors import DataError
from graphveil.data import load_bundled_citeseer, load_citeseer_tape, load_graph
from graphveil.data.graph import RelationalGraph
from graphveil.plugins.standard.sources.edge_list import load_edge_list
from graphveil.plugins.standard.sources.pyg import load_pyg
from graphveil.run.config import DataConfig, load_config

SHARED = Path("/work/shared/data")
TAPE = SHARED / "text_attributed" / "citeseer_tape"
PLANETOID = SHARED / "planetoid"
needs_tape = pytest.mark.skipif(not TAPE.is_dir(), reason=f"shared CiteSeer folder {TAPE} absent")
needs_planetoid = pytest.mark.skipif(
    not (PLANETOID / "CiteSeer" / "raw").is_dir(), reason=f"shared Planetoid folder {PLANETOID} absent"
)

# From shared/data/README.md (upstream TAPE commit 331e616), typed here independently of the loader.
UPSTREAM = {
    "citeseer_texts.txt": (3319359, "9070723640766aaa09875ce72397a4325feecac968ed9fb44152820b651f1f17"),
    "citeseer.cites": (137062, "cd9730630eaaa745058c2cd2cce6b9afb79ca71278a479aebec55f4cf5eb7f30"),
}
LABEL_COUNTS = {"DB": 685, "IR": 641, "ML": 569, "Agents": 562, "HCI": 490, "AI": 239}


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def edge_set(g: RelationalGraph) -> set[frozenset[str]]:
    return {frozenset((g.entity_ids[u], g.entity_ids[v])) for u, v in g.edges.tolist()}


def assert_canonical(g: RelationalGraph) -> None:
    e = g.edges
    assert e.dtype == torch.int64 and e.dim() == 2 and e.shape[1] == 2
    assert bool((e[:, 0] < e[:, 1]).all())
    assert torch.unique(e, dim=0).shape[0] == e.shape[0]
    assert int(e.max()) < g.num_nodes if e.numel() else True


def naive_tape(texts: str, cites: str) -> tuple[list[str], set[frozenset[str]], dict[str, int]]:
    """An independent plain-Python reading of the TAPE files."""
    lines = texts.split("\n")
    ids = lines[0::3]
    known = set(ids)
    edges = set()
    for line in cites.splitlines():
        a, b = line.split("\t")
        if a in known and b in known and a != b:
            edges.add(frozenset((a, b)))
    return ids, edges, Counter(lines[2::3])


# ---------------------------------------------------------------------------------- edge lists


def test_edge_list_csv_with_header_and_labels(tmp_path: Path) -> None:
    ents = write(tmp_path / "ents.csv", 'id,text,label\nn1,"Hello, world",A\nn2,second,B\nn3,"multi\nline",\n')
    edges = write(tmp_path / "rel.csv", "from,to\nn2,n1\nn3,n2\n")
    g = load_edge_list(edges, ents, label_col="label")
    assert g.name == "rel" and g.entity_ids == ["n1", "n2", "n3"]
    assert g.texts == ["Hello, world", "second", "multi\nline"]
    assert g.edges.tolist() == [[0, 1], [1, 2]]
    assert g.label_names == ["A", "B"] and g.labels.tolist() == [0, 1, -1]
    assert g.features is None
    assert_canonical(g)


def test_edge_list_headerless_tsv_and_whitespace(tmp_path: Path) -> None:
    ents = write(tmp_path / "ents.jsonl", "\n".join(json.dumps({"id": i, "text": f"t{i}"}) for i in range(4)) + "\n")
    tsv = write(tmp_path / "rel.tsv", "0\t1\n2\t3\n1\t2\n")
    g = load_edge_list(tsv, ents)
    assert g.entity_ids == ["0", "1", "2", "3"] and g.labels is None
    assert g.edges.tolist() == [[0, 1], [1, 2], [2, 3]]
    snap = write(tmp_path / "rel.txt", "# comment line\n0 1\n\n3  2\n")
    assert load_edge_list(snap, ents).edges.tolist() == [[0, 1], [2, 3]]


def test_edge_list_named_columns(tmp_path: Path) -> None:
    ents = write(tmp_path / "ents.tsv", "text\tkey\nfirst\tx\nsecond\ty\nthird\tz\n")
    edges = write(tmp_path / "rel.csv", "weight,a,b\n0.5,z,x\n1.0,y,z\n")
    g = load_edge_list(edges, ents, source_col="a", target_col="b", id_col="key")
    assert g.entity_ids == ["x", "y", "z"] and g.texts == ["first", "second", "third"]
    assert edge_set(g) == {frozenset("zx"), frozenset("yz")}
    with pytest.raises(DataError, match="give both source_col and target_col"):
        load_edge_list(edges, ents, source_col="a", id_col="key")


def test_edge_list_first_row_with_one_known_id_is_data(tmp_path: Path) -> None:
    ents = write(tmp_path / "e.csv", "id,text\na,one\nb,two\n")
    edges = write(tmp_path / "rel.csv", "a,qq\na,b\n")
    with pytest.raises(DataError, match=r"rel\.csv, line 1: unknown entity id 'qq'"):
        load_edge_list(edges, ents)


# ------------------------------------------------------------------------------------ CiteSeer


def check_citeseer(g: RelationalGraph) -> None:
    assert g.num_nodes == 3186 and g.num_edges == 4225
    assert len(g.label_names) == 6
    assert Counter(g.label_names[c] for c in g.labels.tolist()) == LABEL_COUNTS
    assert g.notes == {
        "dropped_unknown_edges": 335,  # 4732 lines - 4397 with text at both ends
        "unknown_ids": 141,
        "dropped_self_loops": 120,  # 124 self-loop lines, 4 of them on ids without text
        "dropped_duplicate_edges": 52,
    }
    assert sum(g.notes[k] for k in ("dropped_unknown_edges", "dropped_self_loops", "dropped_duplicate_edges")) + 4225 == 4732
    assert all(t.strip() for t in g.texts) and min(map(len, g.texts)) == 32
    assert_canonical(g)


@needs_tape
def test_citeseer_tape_counts_against_naive_reading() -> None:
    g = load_citeseer_tape(TAPE)
    check_citeseer(g)
    ids, edges, labels = naive_tape(
        (TAPE / "citeseer_texts.txt").read_text(encoding="utf-8"), (TAPE / "citeseer.cites").read_text(encoding="utf-8")
    )
    assert g.entity_ids == ids and edge_set(g) == edges
    assert Counter(g.label_names[c] for c in g.labels.tolist()) == labels


def test_bundled_files_decompress_to_upstream_bytes() -> None:
    folder = resources.files("graphveil.data").joinpath("bundled")
    for name, (size, sha) in UPSTREAM.items():
        data = lzma.decompress(folder.joinpath(f"{name}.xz").read_bytes())
        assert len(data) == size and hashlib.sha256(data).hexdigest() == sha
    for extra in ("SOURCE.md", "LICENSE"):
        assert folder.joinpath(extra).is_file()
    assert "331e61664be928847af439b27de661eb8f182205" in folder.joinpath("SOURCE.md").read_text(encoding="utf-8")


def test_bundled_citeseer_counts() -> None:
    check_citeseer(load_bundled_citeseer())


@needs_tape
def test_bundled_and_shared_copies_give_identical_graphs() -> None:
    a, b = load_bundled_citeseer(), load_citeseer_tape(TAPE)
    assert a.entity_ids == b.entity_ids and a.texts == b.texts
    assert torch.equal(a.edges, b.edges) and torch.equal(a.labels, b.labels)
    assert a.label_names == b.label_names and a.notes == b.notes and a.name == b.name
    for name, (_, sha) in UPSTREAM.items():
        assert hashlib.sha256((TAPE / name).read_bytes()).hexdigest() == sha


def test_tampered_bundle_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphveil.data import citeseer as loaders

    monkeypatch.setitem(loaders.CITESEER_SHA256, "citeseer.cites", "0" * 64)
    with pytest.raises(DataError, match=r"citeseer\.cites\.xz: sha256 cd9730.* differs from upstream 0000"):
        load_bundled_citeseer()


@needs_tape
def test_citeseer_tape_tolerates_final_newline_and_crlf(tmp_path: Path) -> None:
    texts = (TAPE / "citeseer_texts.txt").read_text(encoding="utf-8")
    write(tmp_path / "citeseer_texts.txt", texts + "\n")
    (tmp_path / "citeseer.cites").write_bytes((TAPE / "citeseer.cites").read_bytes().replace(b"\n", b"\r\n"))
    g = load_citeseer_tape(tmp_path)
    assert torch.equal(g.edges, load_bundled_citeseer().edges)
    with pytest.raises(DataError, match="no such folder"):
        load_citeseer_tape(tmp_path / "missing")


# ----------------------------------------------------------------------------------------- PyG


def random_data(n: int = 30, m: int = 80, seed: int = 0) -> Data:
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, m), generator=gen)
    ei = torch.cat([ei, ei.flip(0), ei[:, :5]], dim=1)  # both directions plus exact repeats
    return Data(
        x=torch.randn(n, 4, generator=gen), edge_index=ei, y=torch.randint(0, 3, (n,), generator=gen),
        raw_texts=[f"entity {i}" for i in range(n)],
    )


def test_pyg_round_trip_through_file(tmp_path: Path) -> None:
    from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

    data = random_data()
    torch.save(data, tmp_path / "g.pt")
    g = load_pyg(tmp_path / "g.pt")
    ref, _ = remove_self_loops(coalesce(to_undirected(data.edge_index)))  # independent: PyG's own utils
    ref = ref[:, ref[0] < ref[1]].t()
    assert torch.equal(g.edges, ref) and g.name == "g"
    m = data.edge_index.shape[1]
    assert g.notes["dropped_self_loops"] + g.notes["dropped_duplicate_edges"] + g.num_edges == m
    assert torch.equal(g.features, data.x) and torch.equal(g.labels, data.y)
    assert g.texts == data.raw_texts and g.entity_ids == [str(i) for i in range(30)]
    assert g.label_names == ["0", "1", "2"]
    assert_canonical(g)


def test_pyg_texts_argument_and_label_names() -> None:
    data = random_data()
    data.y = data.y.view(-1, 1).float()
    data.y[0] = -1
    data.label_names = ["a", "b", "c"]
    g = load_pyg(data, texts=[f"other {i}" for i in range(30)], name="mine")
    assert g.texts[3] == "other 3" and g.labels[0] == -1 and g.label_names == ["a", "b", "c"] and g.name == "mine"


def test_pyg_errors() -> None:
    data = random_data()
    data.x[7, 2] = float("nan")
    with pytest.raises(DataError, match="features row 7"):
        load_pyg(data)
    data = random_data()
    data.raw_texts[4] = " "
    with pytest.raises(DataError, match="entity '4' has empty text"):
        load_pyg(data)
    data = random_data()
    data.y = data.y.float() + 0.5
    with pytest.raises(DataError, match="integer class indices"):
        load_pyg(data)
    data = random_data()
    data.edge_index[1, 3] = 99
    data.num_nodes = 30
    with pytest.raises(DataError, match=r"edge_index column 3 .* outside 0\.\.29"):
        load_pyg(data)
    with pytest.raises(DataError, match="expected a torch_geometric.data.Data"):
        load_pyg({"edge_index": data.edge_index})


def test_pyg_file_refuses_arbitrary_pickles(tmp_path: Path) -> None:
    torch.save(Fraction(1, 3), tmp_path / "evil.pt")
    with pytest.raises(DataError, match=r"evil\.pt: refused to unpickle fractions\.Fraction"):
        load_pyg(tmp_path / "evil.pt")
    write(tmp_path / "junk.pt", "not a torch file")
    with pytest.raises(DataError, match=r"junk\.pt: not a torch.save file"):
        load_pyg(tmp_path / "junk.pt")
    with pytest.raises(DataError, match="no such file"):
        load_pyg(tmp_path / "absent.pt")


@needs_planetoid
def test_pyg_planetoid_citeseer_counts(tmp_path: Path) -> None:
    from torch_geometric.datasets import Planetoid

    shutil.copytree(PLANETOID / "CiteSeer", tmp_path / "CiteSeer")
    data = Planetoid(root=str(tmp_path), name="CiteSeer")[0]
    g = load_pyg(data)
    # shared/data/README.md: 3327 nodes, 9104 directed = 4552 undirected edges, 3703 features, 6 classes
    assert (g.num_nodes, g.num_edges, g.features.shape[1], len(g.label_names)) == (3327, 4552, 3703, 6)
    assert g.notes["dropped_duplicate_edges"] == 4552 and g.notes["dropped_self_loops"] == 0


# ---------------------------------------------------------------------------------- load_graph


def test_load_graph_default_is_bundled_and_max_entities() -> None:
    full = load_graph(DataConfig())
    assert (full.num_nodes, full.num_edges) == (3186, 4225)
    cut = load_graph(DataConfig(max_entities=500))
    assert cut.entity_ids == full.entity_ids[:500] and cut.texts == full.texts[:500]
    inside = {e for e in edge_set(full) if all(full.entity_ids.index(x) < 500 for x in e)}
    assert edge_set(cut) == inside and cut.num_edges > 0
    assert cut.notes["max_entities_dropped_edges"] == full.num_edges - cut.num_edges
    assert cut.notes["unknown_ids"] == 141
    assert load_graph(DataConfig(max_entities=10_000)).num_nodes == 3186


def test_load_graph_dispatch(tmp_path: Path) -> None:
    ents = write(tmp_path / "e.csv", "id,text\na,one\nb,two\nc,three\n")
    edges = write(tmp_path / "r.csv", "src,dst\na,b\nc,b\n")
    g = load_graph(DataConfig(source="edge_list", path=edges, entities=ents))
    assert edge_set(g) == {frozenset("ab"), frozenset("bc")}
    torch.save(random_data(), tmp_path / "g.pt")
    assert load_graph(DataConfig(source="pyg", path=tmp_path / "g.pt", max_entities=10)).num_nodes == 10
    if TAPE.is_dir():
        assert load_graph(DataConfig(source="citeseer_tape", path=TAPE)).num_edges == 4225


# ------------------------------------------------------------- column names from the run config (issue 7)

RUN = {
    "name": "cols",
    "sampler": {"name": "entity_poisson_wor", "batch_size": 4, "k_neg": 1, "degree_cap": 4},
    "clipper": {"name": "freq_clip", "clip_norm": 1.0},
    "accountant": {"name": "coupled_rdp_freq"},
    "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 16, "lora_layers": 1},
    "training": {"steps": 1},
    "privacy": {"target_epsilon": 8.0},
}
COLUMN_SETS = ["data.source_col=id_1", "data.target_col=id_2", "data.id_col=node", "data.text_col=abstract"]


def own_columns(tmp_path: Path) -> Path:
    """A run config over an edge file headed ``id_1,id_2`` and an entity table headed ``node,abstract``."""
    write(tmp_path / "nodes.csv", 'node,abstract\nn1,"first, paper"\nn2,second\nn3,third\n')
    write(tmp_path / "links.csv", "id_1,id_2\nn1,n2\nn3,n2\n")
    data = {"source": "edge_list", "path": str(tmp_path / "links.csv"), "entities": str(tmp_path / "nodes.csv")}
    return write(tmp_path / "run.yaml", yaml.safe_dump({**RUN, "data": data}))


def test_column_keys_from_run_config_overrides(tmp_path: Path) -> None:
    cfg = load_config(own_columns(tmp_path), COLUMN_SETS)  # what `graphveil run ... --set` applies
    assert (cfg.data.source_col, cfg.data.target_col, cfg.data.id_col, cfg.data.text_col) == ("id_1", "id_2", "node", "abstract")
    g = load_graph(cfg.data)
    assert g.entity_ids == ["n1", "n2", "n3"] and g.texts == ["first, paper", "second", "third"]
    assert edge_set(g) == {frozenset(("n1", "n2")), frozenset(("n2", "n3"))} and g.labels is None
    # label_col too, and JSONL keys
    write(tmp_path / "nodes.jsonl", "".join(json.dumps({"node": f"n{i}", "abstract": f"t{i}", "topic": "AB"[i % 2]}) + "\n"
                                          for i in (1, 2, 3)))
    cfg = load_config(tmp_path / "run.yaml", [*COLUMN_SETS, f"data.entities={tmp_path / 'nodes.jsonl'}", "data.label_col=topic"])
    g = load_graph(cfg.data)
    assert g.texts == ["t1", "t2", "t3"] and [g.label_names[c] for c in g.labels.tolist()] == ["B", "A", "B"]


@pytest.mark.slow
def test_graphveil_run_with_column_keys_set_on_the_command_line(tmp_path: Path, capsys) -> None:
    n = 40
    write(tmp_path / "nodes.csv", "node,abstract\n" + "".join(f"n{i},paper {i} on topic {i % 5}\n" for i in range(n)))
    write(tmp_path / "links.csv", "id_1,id_2\n" + "".join(f"n{i},n{(i + 1) % n}\nn{i},n{(7 * i + 3) % n}\n" for i in range(n)))
    data = {"source": "edge_list", "path": str(tmp_path / "links.csv"), "entities": str(tmp_path / "nodes.csv")}
    config = write(tmp_path / "run.yaml", yaml.safe_dump({**RUN, "data": data, "evaluation": {"batch_size": 8}}))
    out = tmp_path / "out"
    argv = ["run", str(config), "--output", str(out), "--no-progress"]
    for item in COLUMN_SETS:
        argv += ["--set", item]
    assert main(argv) == 0, capsys.readouterr().err
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())["data"]
    assert {k: resolved[k] for k in ("source_col", "target_col", "id_col", "text_col", "label_col")} == {
        "source_col": "id_1", "target_col": "id_2", "id_col": "node", "text_col": "abstract", "label_col": None}
    assert json.loads((out / "privacy.json").read_text())["steps"] == 1


def test_without_column_keys_the_advice_names_the_config_keys(tmp_path: Path) -> None:
    cfg = load_config(own_columns(tmp_path), COLUMN_SETS[2:])
    with pytest.raises(DataError, match=r"links\.csv, line 1: cannot tell whether \['id_1', 'id_2'\] is a header.*"
                                        r"set data\.source_col and data\.target_col to two of its columns$"):
        load_graph(cfg.data)
    cfg = load_config(tmp_path / "run.yaml", COLUMN_SETS[:2])
    with pytest.raises(DataError, match=r"nodes\.csv, line 1: header has no column 'id' \(columns: node, abstract\); "
                                        r"set data\.id_col to the right one$"):
        load_graph(cfg.data)


@pytest.mark.parametrize(
    ("sets", "file", "column", "key", "columns"),
    [
        (["data.target_col=dst"], "links.csv", "dst", "data.target_col", "id_1, id_2"),
        (["data.source_col=from"], "links.csv", "from", "data.source_col", "id_1, id_2"),
        (["data.id_col=Node"], "nodes.csv", "Node", "data.id_col", "node, abstract"),
        (["data.text_col=text"], "nodes.csv", "text", "data.text_col", "node, abstract"),
        (["data.label_col=topic"], "nodes.csv", "topic", "data.label_col", "node, abstract"),
    ],
)
def test_missing_column_exits_2_naming_file_column_columns_and_key(
    tmp_path: Path, capsys, sets, file, column, key, columns
) -> None:
    out = tmp_path / "out"
    argv = ["run", str(own_columns(tmp_path)), "--output", str(out), "--no-progress"]
    for item in [*COLUMN_SETS, *sets]:
        argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{tmp_path / file}, line 1: header has no column {column!r} (columns: {columns}); set {key} " in err
    assert not out.exists()


def test_missing_jsonl_key_names_the_config_key(tmp_path: Path) -> None:
    own_columns(tmp_path)
    write(tmp_path / "nodes.jsonl", json.dumps({"node": "n1", "abstract": "a"}) + "\n" + json.dumps({"node": "n2", "body": "b"}) + "\n")
    cfg = load_config(tmp_path / "run.yaml", [*COLUMN_SETS, f"data.entities={tmp_path / 'nodes.jsonl'}"])
    with pytest.raises(DataError, match=r"nodes\.jsonl, line 2: missing key 'abstract' \(keys: node, body\); "
                                        r"set data\.text_col to the right one$"):
        load_graph(cfg.data)


def test_python_api_messages_name_keyword_arguments(tmp_path: Path) -> None:
    own_columns(tmp_path)
    with pytest.raises(DataError, match=r"pass source_col and target_col to two of its columns; "
                                        r"if it is an edge, pass header=False$"):
        load_edge_list(tmp_path / "links.csv", tmp_path / "nodes.csv", id_col="node", text_col="abstract")
    with pytest.raises(DataError, match=r"header has no column 'id' \(columns: node, abstract\); set id_col to"):
        load_edge_list(tmp_path / "links.csv", tmp_path / "nodes.csv", source_col="id_1", target_col="id_2")

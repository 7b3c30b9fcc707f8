"""The parquet data source: edge_list's graph from Parquet tables, streamed, same validation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from _tables import ENTITIES, RELATIONS, data_options, same_graph, write_csv

from graphveil.contract.errors import ConfigError, DataError
from graphveil.data import RelationalGraph, load_data
from graphveil.plugins.standard.sources import parquet as parquet_module
from graphveil.run.config import DataConfig

STRING = pa.string()


def write_parquet(folder: Path, entities=ENTITIES, relations=RELATIONS, *, row_group_size: int = 3,
                  ids: pa.DataType = STRING, names=("src", "dst")) -> tuple[Path, Path]:
    ent, rel = folder / "entities.parquet", folder / "relations.parquet"
    cast = (lambda v: v) if ids == STRING else int
    pq.write_table(pa.table({"id": pa.array([cast(e[0]) for e in entities], ids),
                             "text": [e[1] for e in entities], "label": [e[2] for e in entities],
                             "unused": list(range(len(entities)))}), ent)
    pq.write_table(pa.table({names[0]: pa.array([cast(r[0]) for r in relations], ids),
                             "weight": [1.0] * len(relations),
                             names[1]: pa.array([cast(r[1]) for r in relations], ids)}),
                   rel, row_group_size=row_group_size)
    return rel, ent


def load(source: str, rel: Path, ent: Path, **options) -> RelationalGraph:
    return load_data(DataConfig(source=source, path=rel, entities=ent, **options))


@pytest.mark.parametrize("batch_rows", [2, 65_536])  # chunks smaller than a row group, or whole row groups
def test_parquet_gives_edge_lists_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_rows: int) -> None:
    monkeypatch.setattr(parquet_module, "BATCH_ROWS", batch_rows)
    csv_graph = load("edge_list", *write_csv(tmp_path), label_col="label")
    pq_graph = load("parquet", *write_parquet(tmp_path), label_col="label")
    same_graph(csv_graph, pq_graph)
    assert pq_graph.num_edges == 6 and pq_graph.notes == {"dropped_self_loops": 1, "dropped_duplicate_edges": 2}
    assert pq.ParquetFile(tmp_path / "relations.parquet").metadata.num_row_groups == 3


def test_integer_ids_and_explicit_columns(tmp_path: Path) -> None:
    entities = [(str(10 + i), f"text {i}", "x") for i in range(6)]
    relations = [(str(10 + i), str(10 + (i + 1) % 6)) for i in range(6)]
    csv_graph = load("edge_list", *write_csv(tmp_path, entities, relations), source_col="src", target_col="dst")
    rel, ent = write_parquet(tmp_path, entities, relations, ids=pa.int64(), names=("from_id", "to_id"))
    with pytest.raises(DataError, match=r"relations\.parquet: no recognised source/target column pair among "
                                        r"from_id, weight, to_id .*; set data\.source_col and data\.target_col"):
        load("parquet", rel, ent)
    pq_graph = load("parquet", rel, ent, source_col="from_id", target_col="to_id")
    assert pq_graph.entity_ids == [str(10 + i) for i in range(6)] and pq_graph.num_edges == 6
    assert torch.equal(pq_graph.edges, csv_graph.edges) and pq_graph.texts == csv_graph.texts


def test_recognised_pairs_are_case_insensitive(tmp_path: Path) -> None:
    graph = load("parquet", *write_parquet(tmp_path, names=("Source", "TARGET")))
    assert graph.num_edges == 6 and graph.labels is None


def _entities(path: Path, **columns) -> None:
    pq.write_table(pa.table(columns), path)


def test_errors_name_the_file_the_row_and_the_problem(tmp_path: Path) -> None:
    rel, ent = write_parquet(tmp_path)
    with pytest.raises(DataError, match=r"entities\.parquet: no column 'body' \(columns: id, text, label, unused\); "
                                        r"set data\.text_col to the right one"):
        load("parquet", rel, ent, text_col="body")
    with pytest.raises(DataError, match=r"relations\.parquet: no column 'dst2' .*set data\.target_col"):
        load("parquet", rel, ent, source_col="src", target_col="dst2")
    with pytest.raises(DataError, match=r"relations\.parquet: column 'weight' \(data\.target_col\) holds double, "
                                        r"not strings or integers"):
        load("parquet", rel, ent, source_col="src", target_col="weight")
    with pytest.raises(DataError, match=r"entities\.parquet: column 'unused' \(data\.text_col\) holds int64, not strings"):
        load("parquet", rel, ent, text_col="unused")
    # the shared validation (graphveil.data.validate), with table rows instead of lines
    bad = tmp_path / "bad.parquet"
    _entities(bad, id=["a", "b", "a"], text=["x", "y", "z"])
    with pytest.raises(DataError, match=r"bad\.parquet, row 3: duplicate entity id 'a' \(first at row 1\)"):
        load("parquet", rel, bad)
    _entities(bad, id=["a", "b", "c"], text=["x", None, "z"])
    with pytest.raises(DataError, match=r"bad\.parquet, row 2: entity 'b' has no text"):
        load("parquet", rel, bad)
    _entities(bad, id=["a", "b", "c"], text=["x", "  ", "z"])
    with pytest.raises(DataError, match=r"bad\.parquet, row 2: entity 'b' has empty text"):
        load("parquet", rel, bad)
    _entities(bad, id=["a", None, "c"], text=["x", "y", "z"])
    with pytest.raises(DataError, match=r"bad\.parquet, row 2: column 'id' is null"):
        load("parquet", rel, bad)
    small = tmp_path / "small.parquet"
    _entities(small, id=["a", "b", "c", "d"], text=["w", "x", "y", "z"])
    with pytest.raises(DataError, match=r"relations\.parquet, row 7: unknown entity id 'e'"):
        load("parquet", rel, small)
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"src": ["a", "b", None], "dst": ["b", "c", "a"]}), nulls)
    with pytest.raises(DataError, match=r"nulls\.parquet, row 3: column 'src' is null"):
        load("parquet", nulls, ent)


def test_file_errors(tmp_path: Path) -> None:
    rel, ent = write_parquet(tmp_path)
    with pytest.raises(DataError, match=r"nope\.parquet: no such file"):
        load("parquet", tmp_path / "nope.parquet", ent)
    junk = tmp_path / "junk.parquet"
    junk.write_text("src,dst\na,b\n")
    with pytest.raises(DataError, match=r"junk\.parquet: not a Parquet file"):
        load("parquet", junk, ent)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"src": pa.array([], pa.string()), "dst": pa.array([], pa.string())}), empty)
    with pytest.raises(DataError, match=r"empty\.parquet: no edges"):
        load("parquet", empty, ent)
    with pytest.raises(DataError, match=r"entities\.parquet: no entities"):
        pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}), ent)
        load("parquet", rel, ent)


def test_options_are_checked_before_reading() -> None:
    with pytest.raises(ConfigError, match=r"data\.entities is required for source 'parquet'"):
        data_options(source="parquet", path="r.parquet")
    with pytest.raises(ConfigError, match=r"give both data\.source_col and data\.target_col"):
        data_options(source="parquet", path="r.parquet", entities="e.parquet", source_col="a")
    with pytest.raises(ConfigError, match=r"data\.sep: not an option of source 'parquet'"):
        load_data(DataConfig(source="parquet", path="r.parquet", entities="e.parquet", sep=","))
    options = data_options(source="parquet", path="r.parquet", entities="e.parquet")
    assert options.model_dump() == {"path": Path("r.parquet"), "entities": Path("e.parquet"), "source_col": None,
                                    "target_col": None, "id_col": "id", "text_col": "text", "label_col": None,
                                    "features_col": None, "feature_cols": None, "features_table": None,
                                    "num_features": None}


def test_pyarrow_is_imported_only_when_a_parquet_file_is_read() -> None:
    code = ("import sys; import graphveil.data; from graphveil.plugins.standard.sources import parquet as d; "
            "d.ParquetSource(d.ParquetOptions(path='r.parquet', entities='e.parquet')); "
            "print('pyarrow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

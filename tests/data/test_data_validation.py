"""Every validation rule of graphveil.data.validate fires with a message naming the problem."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphveil.contract.errors import DataError, GraphVeilError
from graphveil.data import load_citeseer_tape
from graphveil.data.validate import (
    DUPLICATES,
    SELF_LOOPS,
    UNKNOWN_EDGES,
    UNKNOWN_IDS,
    canonical_edges,
    check_features,
    check_index_range,
)
from graphveil.plugins.standard.sources.edge_list import load_edge_list

ENTITIES = "id,text,label\na,alpha text,x\nb,beta text,y\nc,gamma text,x\nd,delta text,\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def entities(tmp_path: Path) -> Path:
    return write(tmp_path / "entities.csv", ENTITIES)


# ----------------------------------------------------------------------------- unknown entity ids


def test_unknown_id_names_file_line_and_id(tmp_path: Path, entities: Path) -> None:
    edges = write(tmp_path / "edges.csv", "source,target\na,b\nb,zz9\n")
    with pytest.raises(DataError, match=r"edges\.csv, line 3: unknown entity id 'zz9'"):
        load_edge_list(edges, entities)


def test_unknown_id_drop_is_counted_logged_and_noted(tmp_path: Path, entities: Path, caplog) -> None:
    edges = write(tmp_path / "edges.csv", "source,target\na,b\nb,zz9\nzz9,yy\nc,d\n")
    with caplog.at_level(logging.INFO, logger="graphveil.data"):
        g = load_edge_list(edges, entities, on_unknown="drop")
    assert g.edges.tolist() == [[0, 1], [2, 3]]
    assert g.notes[UNKNOWN_EDGES] == 2 and g.notes[UNKNOWN_IDS] == 2
    assert "dropped 2 edge(s) naming 2 entity id(s)" in caplog.text


def test_bad_on_unknown_value(tmp_path: Path, entities: Path) -> None:
    edges = write(tmp_path / "edges.csv", "source,target\na,b\n")
    with pytest.raises(ValueError, match="on_unknown"):
        load_edge_list(edges, entities, on_unknown="ignore")  # type: ignore[arg-type]


# ------------------------------------------------------------------- self-loops and duplicates


def test_self_loops_and_duplicates_dropped_counted_logged(tmp_path: Path, entities: Path, caplog) -> None:
    edges = write(tmp_path / "edges.csv", "source,target\nb,a\na,a\na,b\nc,b\nb,c\nd,d\nb,c\n")
    with caplog.at_level(logging.INFO, logger="graphveil.data"):
        g = load_edge_list(edges, entities)
    assert g.edges.dtype == torch.int64
    assert g.edges.tolist() == [[0, 1], [1, 2]]
    assert g.notes[SELF_LOOPS] == 2 and g.notes[DUPLICATES] == 3
    assert "dropped 2 self-loop(s) and 3 duplicate edge(s)" in caplog.text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=60))
def test_canonical_edges_matches_naive_reference(pairs: list[tuple[int, int]]) -> None:
    edges, loops, dups = canonical_edges(torch.tensor(pairs, dtype=torch.long).reshape(-1, 2))
    non_loops = [(a, b) for a, b in pairs if a != b]
    expected = sorted({(min(a, b), max(a, b)) for a, b in non_loops})
    assert edges.dtype == torch.int64 and edges.shape == (len(expected), 2)
    assert [tuple(e) for e in edges.tolist()] == expected
    assert loops == len(pairs) - len(non_loops)
    assert dups == len(non_loops) - len(expected)


# -------------------------------------------------------------------------------------- texts


@pytest.mark.parametrize("bad", ['""', '"   "', '"\t"'])
def test_empty_text_names_the_id_csv(tmp_path: Path, bad: str) -> None:
    ents = write(tmp_path / "e.csv", f"id,text\na,fine\nb,{bad}\n")
    edges = write(tmp_path / "edges.csv", "source,target\na,b\n")
    with pytest.raises(DataError, match=r"e\.csv, line 3: entity 'b' has empty text"):
        load_edge_list(edges, ents)


def test_missing_or_null_text_names_the_id_jsonl(tmp_path: Path) -> None:
    edges = write(tmp_path / "edges.csv", "source,target\n1,2\n")
    ents = write(tmp_path / "e.jsonl", json.dumps({"id": 1, "text": "one"}) + "\n" + json.dumps({"id": 2, "text": None}) + "\n")
    with pytest.raises(DataError, match=r"e\.jsonl, line 2: entity '2' has no text"):
        load_edge_list(edges, ents)
    ents = write(tmp_path / "e.jsonl", json.dumps({"id": 1, "text": "one"}) + "\n" + json.dumps({"id": 2}) + "\n")
    with pytest.raises(DataError, match=r"e\.jsonl, line 2: missing key 'text'"):
        load_edge_list(edges, ents)


def test_empty_text_in_tape_folder(tmp_path: Path) -> None:
    write(tmp_path / "citeseer_texts.txt", "p1\nsome text\nML\np2\n  \nDB")
    write(tmp_path / "citeseer.cites", "p1\tp2\n")
    with pytest.raises(DataError, match=r"citeseer_texts\.txt, line 5: entity 'p2' has empty text"):
        load_citeseer_tape(tmp_path)


# ----------------------------------------------------------------------------------- features


def test_nan_and_inf_features_name_the_row() -> None:
    x = torch.zeros(5, 3)
    x[3, 1] = float("nan")
    x[4, 0] = float("inf")
    with pytest.raises(DataError, match=r"features row 3 has a non-finite value \(nan in column 1\); 2 row\(s\)"):
        check_features(x, 5, "feat.pt")
    x[3, 1] = 0.0
    with pytest.raises(DataError, match=r"feat\.pt: features row 4 .*inf in column 0"):
        check_features(x, 5, "feat.pt")
    with pytest.raises(DataError, match=r"must be \(6, f\)"):
        check_features(torch.zeros(5, 3), 6, "feat.pt")
    assert check_features(torch.ones(2, 2, dtype=torch.long), 2, "f").dtype == torch.float32


# --------------------------------------------------------------------------------- entity ids


def test_duplicate_entity_id_names_id_and_both_lines(tmp_path: Path) -> None:
    ents = write(tmp_path / "e.tsv", "id\ttext\na\tone\nb\ttwo\na\tthree\n")
    edges = write(tmp_path / "edges.csv", "source,target\na,b\n")
    with pytest.raises(DataError, match=r"e\.tsv, line 4: duplicate entity id 'a' \(first at line 2\)"):
        load_edge_list(edges, ents)


def test_duplicate_id_in_tape_folder(tmp_path: Path) -> None:
    write(tmp_path / "citeseer_texts.txt", "p1\nt1\nML\np2\nt2\nDB\np1\nt3\nAI")
    write(tmp_path / "citeseer.cites", "p1\tp2\n")
    with pytest.raises(DataError, match=r"line 7: duplicate entity id 'p1' \(first at line 1\)"):
        load_citeseer_tape(tmp_path)


def test_empty_entity_id(tmp_path: Path) -> None:
    ents = write(tmp_path / "e.csv", "id,text\na,one\n ,two\n")
    edges = write(tmp_path / "edges.csv", "source,target\na,b\n")
    with pytest.raises(DataError, match=r"e\.csv, line 3: empty entity id"):
        load_edge_list(edges, ents)


# ----------------------------------------------------------------------------- malformed rows


def test_wrong_field_count_in_edges(tmp_path: Path, entities: Path) -> None:
    edges = write(tmp_path / "edges.csv", "source,target\na,b\n\nb,c,d\n")
    with pytest.raises(DataError, match=r"edges\.csv, line 4: expected 2 fields, got 3"):
        load_edge_list(edges, entities)


def test_wrong_field_count_in_entities(tmp_path: Path) -> None:
    ents = write(tmp_path / "e.csv", 'id,text\na,"one, quoted\nover two lines"\nb\n')
    edges = write(tmp_path / "edges.csv", "source,target\na,b\n")
    with pytest.raises(DataError, match=r"e\.csv, line 4: expected 2 fields, got 1"):
        load_edge_list(edges, ents)


def test_missing_header_columns(tmp_path: Path, entities: Path) -> None:
    ents = write(tmp_path / "e.csv", "id,body\na,one\n")
    edges = write(tmp_path / "edges.csv", "source,target\na,b\n")
    with pytest.raises(DataError, match=r"e\.csv, line 1: header has no column 'text' \(columns: id, body\)"):
        load_edge_list(edges, ents)
    with pytest.raises(DataError, match=r"entities\.csv, line 1: header has no column 'kind'"):
        load_edge_list(edges, entities, label_col="kind")
    with pytest.raises(DataError, match=r"edges\.csv, line 1: header has no column 'dst'"):
        load_edge_list(edges, entities, source_col="source", target_col="dst")


def test_unrecognisable_first_edge_row_is_refused_not_guessed(tmp_path: Path, entities: Path) -> None:
    edges = write(tmp_path / "edges.csv", "p,q\na,b\n")
    with pytest.raises(DataError, match=r"edges\.csv, line 1: cannot tell whether \['p', 'q'\] is a header"):
        load_edge_list(edges, entities)
    assert load_edge_list(edges, entities, header=True).edges.tolist() == [[0, 1]]


def test_tape_incomplete_and_misaligned_records(tmp_path: Path) -> None:
    write(tmp_path / "citeseer.cites", "p1\tp2\n")
    write(tmp_path / "citeseer_texts.txt", "p1\nt1\nML\np2\nt2")
    with pytest.raises(DataError, match=r"citeseer_texts\.txt, line 4: incomplete record"):
        load_citeseer_tape(tmp_path)
    # a stray blank line shifts every later record: the label line then holds a text
    write(tmp_path / "citeseer_texts.txt", "p1\n\nt1 words\nML\np2\nt2")
    with pytest.raises(DataError, match=r"line 3: label line 't1 words' is not a single token"):
        load_citeseer_tape(tmp_path)


def test_tape_cites_wrong_field_count(tmp_path: Path) -> None:
    write(tmp_path / "citeseer_texts.txt", "p1\nt1\nML\np2\nt2\nDB")
    write(tmp_path / "citeseer.cites", "p1\tp2\np2 p1\n")
    with pytest.raises(DataError, match=r"citeseer\.cites, line 2: expected 2 fields, got 1"):
        load_citeseer_tape(tmp_path)


def test_jsonl_bad_json_names_line(tmp_path: Path) -> None:
    ents = write(tmp_path / "e.jsonl", '{"id": "a", "text": "t"}\n{"id": "b", "text": \n')
    edges = write(tmp_path / "edges.csv", "source,target\na,b\n")
    with pytest.raises(DataError, match=r"e\.jsonl, line 2: not valid JSON"):
        load_edge_list(edges, ents)


def test_missing_file_and_non_utf8(tmp_path: Path, entities: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.csv: no such file"):
        load_edge_list(tmp_path / "nope.csv", entities)
    (tmp_path / "edges.csv").write_bytes(b"source,target\na,\xff\n")
    with pytest.raises(DataError, match=r"edges\.csv: not UTF-8 text \(byte 16"):
        load_edge_list(tmp_path / "edges.csv", entities)


def test_index_range_names_the_column() -> None:
    ei = torch.tensor([[0, 1, 2], [1, 5, -1]])
    with pytest.raises(DataError, match=r"g\.pt: edge_index column 1 = \(1, 5\) names a node outside 0\.\.3; 2 column"):
        check_index_range(ei, 4, "g.pt")
    with pytest.raises(DataError, match=r"must be \(2, k\)"):
        check_index_range(torch.zeros(3, 2, dtype=torch.long), 4, "g.pt")
    with pytest.raises(DataError, match="must hold integers"):
        check_index_range(torch.zeros(2, 2), 4, "g.pt")


def test_errors_are_graphveil_errors() -> None:
    assert issubclass(DataError, GraphVeilError)

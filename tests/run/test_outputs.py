"""``RunDirectory``: files appear under the final name only on commit; a discarded run leaves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphveil.run.outputs import RunDirectory


def test_commit_renames_the_partial_folder(tmp_path: Path) -> None:
    out = RunDirectory(tmp_path / "runs" / "a")
    out.write_json("x.json", {"a": 1})
    assert not (tmp_path / "runs" / "a").exists() and (tmp_path / "runs" / "a.partial" / "x.json").exists()
    assert out.commit() == tmp_path / "runs" / "a"
    assert sorted(p.name for p in (tmp_path / "runs" / "a").iterdir()) == ["metrics.jsonl", "x.json"]
    with pytest.raises(FileExistsError, match="already exists"):
        RunDirectory(tmp_path / "runs" / "a")


def test_discard_removes_the_folders_it_created(tmp_path: Path) -> None:
    # a failed first run in a fresh checkout must not leave an empty runs/ behind
    out = RunDirectory(tmp_path / "runs" / "deep" / "a")
    out.log_metrics({"step": 1})
    out.discard()
    assert list(tmp_path.iterdir()) == []


def test_discard_keeps_parents_that_hold_other_runs(tmp_path: Path) -> None:
    first = RunDirectory(tmp_path / "runs" / "a")
    second = RunDirectory(tmp_path / "runs" / "b")  # runs/ existed by then: not second's to remove
    first.commit()
    second.discard()
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["a"]
    third = RunDirectory(tmp_path / "new" / "c")
    (tmp_path / "new" / "other.txt").write_text("written meanwhile")
    third.discard()
    assert (tmp_path / "new" / "other.txt").exists() and not (tmp_path / "new" / "c.partial").exists()

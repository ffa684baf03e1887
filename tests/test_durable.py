"""Atomic small-file writes, whole-line JSONL appends and a reader that drops a torn last line."""

from __future__ import annotations

import json
import os

import pytest

from areal_cli.durable import TornFile, append_jsonl, atomic_write, read_jsonl, rewrite_jsonl


def test_atomic_write_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old\n")
    inode = path.stat().st_ino
    atomic_write(path, "new\n")
    assert path.read_text() == "new\n"
    # a new file renamed over, not the old one rewritten in place
    assert path.stat().st_ino != inode
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_atomic_write_replaces_a_link_instead_of_writing_through_it(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    link = tmp_path / "run" / "metrics.jsonl"
    link.parent.mkdir()
    link.symlink_to(outside)
    atomic_write(link, "row\n")
    assert outside.read_text() == "keep me\n"
    assert not link.is_symlink() and link.read_text() == "row\n"


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("{}")
    with pytest.raises(TypeError):
        atomic_write(path, 12345)  # not str/bytes: fails inside, after the temp file was made
    assert path.read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_append_refuses_to_follow_a_link(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    (tmp_path / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(OSError):
        append_jsonl(tmp_path / "metrics.jsonl", [{"step": 0}])
    assert outside.read_text() == "keep me\n"


def test_torn_last_line_is_dropped_and_reported(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, [{"step": 0}, {"step": 1}], fsync=True)
    with open(path, "a") as f:
        f.write('{"step": 2, "rew')  # a kill in the middle of the third row
    rows, torn = read_jsonl(path)
    assert rows == [{"step": 0}, {"step": 1}] and torn


def test_a_complete_row_without_its_newline_counts_as_torn(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}')
    assert read_jsonl(path) == ([{"step": 0}], True)


def test_damage_before_the_last_line_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(TornFile, match="line 2"):
        read_jsonl(path)


def test_rows_are_whole_lines_and_rewrite_is_atomic(tmp_path):
    path = tmp_path / "t.jsonl"
    append_jsonl(path, [{"i": i, "text": "x" * 5000} for i in range(20)])
    lines = path.read_text().splitlines()
    assert [json.loads(x)["i"] for x in lines] == list(range(20))
    inode = os.stat(path).st_ino
    rewrite_jsonl(path, [{"i": 0}])
    assert read_jsonl(path) == ([{"i": 0}], False) and os.stat(path).st_ino != inode

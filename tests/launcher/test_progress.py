"""The live-progress reader survives what resume and kills do to metrics.jsonl."""

from __future__ import annotations

from areal_cli.controller.state import truncate_records
from areal_cli.durable import append_jsonl
from areal_cli.launcher.progress import MetricsTail


def rows(*steps):
    return [{"step": s, "reward_mean": s / 10, "wall_time_s": float(s)} for s in steps]


def test_resume_truncating_the_file_beneath_the_reader(tmp_path):
    """The reader had read steps 0..5 of the last run; resume from checkpoint 3 drops 3..5 and the
    new run appends 3, 4: the old reader's offset pointed into the middle of a line (a JSON error
    that ended the launcher)."""
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, rows(0, 1, 2, 3, 4, 5))
    tail = MetricsTail(path)
    assert [r["step"] for r in tail.read()] == [0, 1, 2, 3, 4, 5]
    truncate_records(tmp_path, 3)
    append_jsonl(path,
                 [{"step": 3, "reward_mean": 0.9, "wall_time_s": 1.0, "note": "a longer row " * 3}])
    assert [r["step"] for r in tail.read()] == [3]  # only what is new is shown again
    append_jsonl(path, rows(4))
    assert [r["step"] for r in tail.read()] == [4]
    assert [r["step"] for r in tail.rows] == [0, 1, 2, 3, 4]


def test_a_file_cut_shorter_in_place_and_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, rows(0, 1, 2))
    tail = MetricsTail(path)
    tail.read()
    with open(path, "r+") as f:  # someone truncates it in place (same inode)
        f.truncate(0)
    append_jsonl(path, rows(0))
    with open(path, "a") as f:
        f.write('{"step": 1, "rew')  # a torn line: waits, and never breaks the reader
    assert [r["step"] for r in tail.read()] == []
    with open(path, "a") as f:
        f.write("ard\n")  # now a finished line that is not JSON: skipped
    append_jsonl(path, rows(1))
    assert [r["step"] for r in tail.read()] == [1] and tail.bad_lines == 1
    assert MetricsTail(tmp_path / "missing.jsonl").read() == []


def test_a_file_rewritten_in_place_to_the_same_length(tmp_path):
    """Same inode, same size, other rows (an inode number reused, or an in-place rewrite)."""
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, rows(0, 1))
    tail = MetricsTail(path)
    tail.read()
    text = path.read_text().replace('"reward_mean": 0.1', '"reward_mean": 0.7')
    with open(path, "r+") as f:
        f.write(text)
    append_jsonl(path, rows(2))
    assert [(r["step"], r["reward_mean"]) for r in tail.read()] == [(1, 0.7), (2, 0.2)]

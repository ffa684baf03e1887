"""Resume's side of the run directory: torn lines, records replaced atomically, a checkpoint
published onto an existing one, links never followed."""

from __future__ import annotations

import json
import logging
import shutil

from areal_cli.checkpoint_dirs import MARKER, marker_text
from areal_cli.controller.state import _prune, latest_checkpoint, publish, truncate_records
from areal_cli.durable import append_jsonl, read_jsonl


def test_resume_drops_a_torn_last_line_and_says_so(tmp_path, caplog):
    m = tmp_path / "metrics.jsonl"
    append_jsonl(m, [{"step": s} for s in range(4)])
    with open(m, "a") as f:
        f.write('{"step": 4, "loss": 0.')  # killed mid-write (or the disk was full)
    t = tmp_path / "trajectories.jsonl"
    append_jsonl(t, [{"trained_version": v, "reward": 1.0} for v in (0, 1, 2, 3)])
    caplog.set_level(logging.WARNING)
    truncate_records(tmp_path, 3)
    assert read_jsonl(m) == ([{"step": 0}, {"step": 1}, {"step": 2}], False)
    assert [r["trained_version"] for r in read_jsonl(t)[0]] == [0, 1, 2]
    assert "torn last line" in caplog.text


def test_truncation_replaces_the_file_not_what_a_link_points_to(tmp_path):
    outside = tmp_path / "precious.jsonl"
    outside.write_text(json.dumps({"step": 9}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(outside)
    truncate_records(run, 0)
    assert outside.read_text() == '{"step": 9}\n'


def _complete(d, version):
    """A checkpoint as the controller completes it: its state and the run's marker."""
    d.mkdir(parents=True)
    (d / "controller.json").write_text(json.dumps({"version": version}))
    (d / MARKER).write_text(marker_text(version))
    (d / "marker").write_text(d.name)


def test_publishing_onto_an_existing_complete_checkpoint_keeps_it(tmp_path):
    """Resume from step_2, then SIGTERM before the first new step: the trainer writes step_2 again;
    os.replace onto the non-empty step_2 raised and the stop crashed."""
    ck = tmp_path / "checkpoints"
    _complete(ck / "step_2", 2)
    _complete(ck / "step_2.partial", 2)
    publish(ck / "step_2.partial", ck / "step_2")
    assert sorted(p.name for p in ck.iterdir()) == ["step_2"]
    assert latest_checkpoint(tmp_path).name == "step_2"
    (ck / "step_3").mkdir()  # an incomplete leftover (no controller.json) is replaced
    _complete(ck / "step_3.partial", 3)
    publish(ck / "step_3.partial", ck / "step_3")
    assert (ck / "step_3" / "marker").read_text() == "step_3.partial"


def test_checkpoint_links_are_never_resumed_from_or_pruned_through(tmp_path):
    outside = tmp_path / "elsewhere"
    _complete(outside / "step_9", 9)
    ck = tmp_path / "run" / "checkpoints"
    _complete(ck / "step_1", 1)
    (ck / "step_9").symlink_to(outside / "step_9")
    assert latest_checkpoint(tmp_path / "run").name == "step_1"
    _complete(ck / "step_2", 2)
    _prune(ck, keep=1)
    assert (outside / "step_9" / "marker").exists()  # the link's target is untouched
    assert not (ck / "step_1").exists() and (ck / "step_2").exists()


def test_a_users_directories_among_the_checkpoints_are_never_picked_or_pruned(tmp_path):
    """Before: resume picked a user's checkpoints/step_9_mycopy and pruning deleted
    step_2_backup."""
    ck = tmp_path / "checkpoints"
    for v in (1, 2, 3):
        _complete(ck / f"step_{v}", v)
    shutil.copytree(ck / "step_3", ck / "step_9_mycopy")  # a user's copy, marker and all
    shutil.copytree(ck / "step_2", ck / "step_2_backup")
    shutil.copytree(ck / "step_3", ck / "step_12")  # a copy renamed: its marker says 3
    (ck / "step_5").mkdir()  # a user's directory named like a checkpoint, without the marker
    (ck / "step_5" / "controller.json").write_text(json.dumps({"version": 5}))
    assert latest_checkpoint(tmp_path).name == "step_3"
    _prune(ck, keep=1)
    assert sorted(p.name for p in ck.iterdir()) == ["step_12", "step_2_backup", "step_3", "step_5",
                                                    "step_9_mycopy"]


def _resumable(d, version):
    """Every file of a checkpoint a resume reads, in the formats the controller and the trainer
    write."""
    import msgpack

    d.mkdir(parents=True)
    (d / "controller.json").write_text(json.dumps({"version": version, "step": version,
                                                   "next_group": 0, "cursor": {}, "groups": {}}))
    (d / "trainer.json").write_text(json.dumps({"version": version}))
    (d / "buffer.msgpack").write_bytes(msgpack.packb([]))
    (d / "trainer").mkdir()
    (d / "trainer" / ".metadata").write_bytes(b"\x00")
    (d / "rng_rank0.pt").write_bytes(b"\x00")
    (d / MARKER).write_text(marker_text(version))


def test_a_resume_stops_on_a_damaged_record_file_before_anything_is_truncated(tmp_path):
    from areal_cli.checkpoint_dirs import resume_problems

    _resumable(tmp_path / "checkpoints" / "step_2", 2)
    metrics, traj = tmp_path / "metrics.jsonl", tmp_path / "trajectories.jsonl"
    metrics.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(4)))
    traj.write_text(json.dumps({"trained_version": 1}) + "\n" + '{"trained_ver')  # torn last line
    assert resume_problems(tmp_path) == []  # an interrupted write: resume drops it
    traj.write_text(json.dumps({"trained_version": 1}) + "\n\x00\x00garbage\n"
                    + json.dumps({"trained_version": 2}) + "\n")
    metrics.write_text(json.dumps({"step": 0}) + "\n" + json.dumps({"loss": 1.0}) + "\n")
    before = (metrics.read_bytes(), traj.read_bytes())
    problems = resume_problems(tmp_path)
    assert any(f"{traj}: line 2 is not JSON" in p and "cut it before that line" in p
               for p in problems), problems
    assert any(f"{metrics}: row 2 has no integer 'step'" in p for p in problems), problems
    assert (metrics.read_bytes(), traj.read_bytes()) == before  # read, never rewritten


def test_a_resume_stops_on_a_corrupt_marker_or_checkpoint_before_anything_is_truncated(tmp_path):
    from areal_cli.checkpoint_dirs import resume_problems

    ck = tmp_path / "checkpoints"
    _resumable(ck / "step_1", 1)
    _resumable(ck / "step_2", 2)
    assert resume_problems(tmp_path) == []
    # a torn marker on the newest: step_1 would win silently, and records past it be truncated
    (ck / "step_2" / MARKER).write_text('{"vers')
    [problem] = resume_problems(tmp_path)
    assert f"{ck / 'step_2' / MARKER}: unreadable" in problem
    assert '{"version": 2}' in problem and "move" in problem
    (ck / "step_2" / MARKER).write_text(marker_text(2))
    # the newest checkpoint's own files
    (ck / "step_2" / "controller.json").write_text("{}")
    (ck / "step_2" / "buffer.msgpack").write_bytes(b"\xc1")
    (ck / "step_2" / "rng_rank0.pt").unlink()
    problems = "\n".join(resume_problems(tmp_path))
    assert "controller.json: lacks ['version', 'step'" in problems
    assert "buffer.msgpack: unreadable" in problems and "rng_rank0.pt: missing" in problems
    assert f"move {ck / 'step_2'} out of checkpoints/" in problems
    # a user's copy (no marker) is still not the run's, and not a problem
    shutil.rmtree(ck / "step_2")
    (ck / "step_7_copy").mkdir()
    assert resume_problems(tmp_path) == []

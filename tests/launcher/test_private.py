"""The run directory is a trust boundary: another user's (or a group/world-writable) run directory
is refused before anything starts, files read back from it are the running user's alone, and the
commands the launcher starts never pass through a file in it.

Before: ``areal train run_dir=DIR`` used a directory another user owned (mode 0777); that user
replaced ``procs.json`` before the lean watcher read it back and had their command started as the
controller, as root."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time

import pytest
from conftest import AREAL, ROOT, TINY_RUN

from areal_cli.launcher.claim import claim_run_dir, new_run_dir
from areal_cli.private import check_private_dir, read_private
from areal_cli.transport.auth import load_keys, make_keys
from areal_cli.transport.channels import Endpoints, make_endpoints

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0,
                               reason="giving a directory to another user needs root")


def _train(run_dir, *overrides, timeout=120):
    return subprocess.run(AREAL
                          + ["train", "--quiet", f"run_dir={run_dir}", "trainer.steps=1",
                             *overrides],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


@root_only
def test_another_users_run_dir_exits_2_naming_owner_mode_and_fix(tmp_path):
    run = tmp_path / "theirs"
    run.mkdir(mode=0o755)
    os.chown(run, NOBODY, NOBODY)
    proc = _train(run)
    assert proc.returncode == 2, proc.stderr
    assert "belongs to nobody (uid 65534)" in proc.stderr and "drwxr-xr-x" in proc.stderr
    assert "choose a run_dir of your own" in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(run) == []  # nothing written into it


def test_a_run_dir_others_can_write_exits_2(tmp_path):
    run = tmp_path / "open"
    run.mkdir()
    run.chmod(0o777)
    proc = _train(run)
    assert proc.returncode == 2, proc.stderr
    assert ("can be written by other users (mode drwxrwxrwx" in proc.stderr
            and f"chmod go-w {run}" in proc.stderr)
    assert os.listdir(run) == []


def test_run_dirs_are_created_0700_and_a_swappable_parent_is_refused(tmp_path):
    os.umask(old := os.umask(0))  # the test's umask, unchanged
    assert stat.S_IMODE(new_run_dir(tmp_path / "runs").stat().st_mode) == 0o700
    assert (claim_run_dir(tmp_path / "a" / "b")
            and stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700)
    assert not claim_run_dir(tmp_path / "a" / "b")  # exists, ours, 0700: used
    shared = tmp_path / "shared"
    (shared / "run").mkdir(parents=True)
    shared.chmod(0o777)  # anyone could rename run/ away and put their own in its place
    assert any("could swap the run directory" in p for p in check_private_dir(shared / "run"))
    shared.chmod(0o1777)  # sticky, as /tmp: only the owner of run/ may rename it
    assert check_private_dir(shared / "run") == []
    assert old == os.umask(old)


def test_files_read_back_are_never_links(tmp_path):
    make_endpoints("127.0.0.1").publish(tmp_path)
    (tmp_path / "elsewhere.json").write_text((tmp_path / "endpoints.json").read_text())
    (tmp_path / "endpoints.json").unlink()
    (tmp_path / "endpoints.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ValueError, match="symbolic link"):
        Endpoints.load(tmp_path)
    make_keys(tmp_path)
    secret = tmp_path / "keys" / "client.key_secret"
    secret.rename(tmp_path / "keys" / "moved")
    secret.symlink_to(tmp_path / "keys" / "moved")
    with pytest.raises(ValueError, match="symbolic link"):
        load_keys(tmp_path)


@root_only
def test_files_read_back_belong_to_the_running_user(tmp_path):
    make_endpoints("127.0.0.1").publish(tmp_path)
    os.chown(tmp_path / "endpoints.json", NOBODY, NOBODY)
    with pytest.raises(ValueError, match="belongs to nobody"):
        Endpoints.load(tmp_path)
    make_keys(tmp_path)
    os.chown(tmp_path / "keys" / "server.key_secret", NOBODY, NOBODY)
    with pytest.raises(ValueError, match="belongs to nobody"):
        load_keys(tmp_path)
    (tmp_path / "f").write_text("x")
    (tmp_path / "f").chmod(0o666)
    with pytest.raises(ValueError, match="can be written by other users"):
        read_private(tmp_path / "f")


def _swap_procs(run, marker, stop):
    """Replace procs.json (as the attack did) the moment it appears, with a 'controller' that
    writes ``marker``; a planted copy is there from the start too."""
    evil = {"procs": [{"name": "controller",
                       "argv": [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"],
                       "env": {}}], "devices": {"rollout": [], "trainer": []}}
    (run / "procs.json").write_text(json.dumps(evil))
    while not stop.is_set():
        if (run / "procs.json").exists() and json.loads((run / "procs.json").read_text()
                                                        or "{}") != evil:
            tmp = run / ".evil"
            tmp.write_text(json.dumps(evil))
            os.replace(tmp, run / "procs.json")
        time.sleep(0.001)


@pytest.mark.slow  # ~25 s on 2 cores: `make test-slow`, which CI runs too
def test_the_commands_started_never_come_from_a_file(tiny_model, tmp_path):
    run, marker = tmp_path / "run", tmp_path / "started-by-swap"
    run.mkdir(mode=0o700)
    stop = threading.Event()
    swapper = threading.Thread(target=_swap_procs, args=(run, marker, stop), daemon=True)
    swapper.start()
    try:
        proc = _train(run, f"model={tiny_model}", *TINY_RUN, "eval.at_end=false", timeout=300)
    finally:
        stop.set()
        swapper.join()
    assert not marker.exists(), "a command read back from procs.json was started"
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "metrics.jsonl").read_text().count("\n") == 1


def test_an_existing_run_dir_others_can_read_is_made_0700_unless_it_holds_a_run(tmp_path):
    """Before: an existing 0755 run_dir stayed 0755, its config and logs readable by anyone."""
    from areal_cli.launcher.claim import RunDirError

    empty = tmp_path / "empty"
    empty.mkdir()
    empty.chmod(0o755)
    assert not claim_run_dir(empty, dry_run=True)  # --dry-run changes nothing
    assert stat.S_IMODE(empty.stat().st_mode) == 0o755
    assert not claim_run_dir(empty) and stat.S_IMODE(empty.stat().st_mode) == 0o700
    held = tmp_path / "held"
    held.mkdir()
    (held / "config.yaml").write_text("{}")
    held.chmod(0o755)
    with pytest.raises(RunDirError, match=f"holds a run and other users can read it .*chmod 700 "
                                          f"{held}"):
        claim_run_dir(held)
    assert stat.S_IMODE(held.stat().st_mode) == 0o755


@pytest.mark.slow  # 10-19 s: make test-slow (make test stays within 15 minutes)
def test_dry_run_checks_the_run_dir_as_a_start_does(tmp_path):
    """Before: --dry-run skipped the run directory's checks and printed a plan a start refuses."""
    open_dir, held = tmp_path / "open", tmp_path / "held"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    held.mkdir()
    (held / "config.yaml").write_text("{}")
    held.chmod(0o755)
    for run, why in ((open_dir, "can be written by other users"),
                     (held, "holds a run and other users can read it")):
        proc = _train(run, "--dry-run")
        assert proc.returncode == 2, proc.stderr
        assert why in proc.stderr and "Traceback" not in proc.stderr
    assert stat.S_IMODE(open_dir.stat().st_mode) == 0o777 and os.listdir(open_dir) == []
    fresh = tmp_path / "fresh"
    assert _train(fresh, "--dry-run").returncode == 0 and not fresh.exists()

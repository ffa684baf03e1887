"""The two ways in besides an async function, against the real endpoint and tiny engine: a
synchronous agent in the worker's thread pool (a blocking one stalls only itself; a thread stuck
past its timeout fails episodes, never hangs the worker), and an agent that is a program, one
process per episode (limits, failures named with their reason, hostile output, the reward from a
file or a verifier, the sandbox). Their calls are recorded token-exactly: test_agent_endpoint.py."""

from __future__ import annotations

import logging
import socket
import tempfile
import time
from pathlib import Path

import pytest
from agent_harness import PROGRAM, agent_setup, drive, item

from areal_cli.config.schema import WorkflowConfig
from areal_cli.workflows.agent.checks import command_problems
from areal_cli.workflows.agent.program import TAIL, resolve_paths

AGENT = f"python3 {PROGRAM}"


@pytest.fixture
def setup(tiny_model):
    yield from agent_setup(tiny_model)


@pytest.mark.parametrize("agent, blocks", [("sleeps_sync", False), ("sleeps_blocking", False),
                                           ("sleeps_async_unmarked", True)])
def test_a_blocking_agent_in_the_thread_pool_does_not_delay_the_other_episodes(setup, agent,
                                                                                blocks):
    """One episode sleeps 5 s in a blocking call; the 8 other episodes of its worker (4 groups)
    finish meanwhile, in about the time they take with no sleeper beside them (measured first, on
    the same worker: a shared CPU makes the absolute time vary). The control: the same sleep in an
    async agent not marked blocking holds the endpoint's loop, and every other episode waits it
    out."""
    eng, make = setup
    flow = make(agent)
    flow.start(item(9))  # the engine's first forward and the threads' first client are not timed
    drive(flow, eng, 1)
    alone = _finish_times(flow, eng, {g: {} for g in range(5, 9)})
    beside = _finish_times(flow, eng, {0: {"sleep": 5}, **{g: {} for g in range(1, 5)}})
    baseline, others = max(alone.values()), max(beside[g] for g in range(1, 5))
    print(f"{agent}: 4 groups alone {baseline:.2f}s, beside the sleeper {others:.2f}s; the sleeper "
          f"{beside[0]:.2f}s")
    assert beside[0] >= 5
    assert others >= 5 if blocks else others < min(baseline + 1.0, 2.5)


def _finish_times(flow, eng, groups: dict[int, dict]) -> dict[int, float]:
    """Start each group (id: its problem's meta; 1 episode where it sleeps, else 2) at once and run
    the worker's loop until all have finished: the seconds each took, none failed."""
    t0 = time.monotonic()
    for g, meta in groups.items():
        flow.start(item(g, size=1 if meta else 2, **meta))
    done = {}
    while len(done) < len(groups) and time.monotonic() - t0 < 60:
        for s in eng.poll(0.02):
            flow.on_generated(s)
        for r in flow.poll():
            assert not r.failed
            done[r.group_id] = time.monotonic() - t0
    assert len(done) == len(groups)
    return done


def test_agent_threads_stuck_past_their_timeout_fail_later_episodes_instead_of_hanging(setup,
                                                                                        caplog):
    """One thread, held forever by an agent that overran: the next episode waits for a thread
    until its own timeout and fails, named; the worker goes on (and closes)."""
    eng, make = setup
    flow = make("hangs_sync", agent_concurrency=1, agent_timeout_s=1.5)
    with caplog.at_level(logging.ERROR):
        flow.start(item(0, size=1))
        flow.start(item(1, size=1))
        results, _ = drive(flow, eng, 2, timeout_s=60)
    assert [r.failed for r in results] == [1, 1]
    assert "its thread cannot be killed and runs on until the agent returns (1 such now)" \
        in caplog.text
    assert "it waited for a thread of the agent's pool: 1 of workflow.agent_concurrency=1" \
        in caplog.text


def test_programs_that_hang_or_fail_drop_their_groups_with_the_reason(setup, caplog, tmp_path,
                                                                     monkeypatch):
    """A program past workflow.agent_timeout_s (its process group killed, a child of its own with
    it), one that exits 1, one that floods 20 MB of stderr and exits 3, and one that allocates past
    workflow.agent_memory_mb each drop their group, the reason and the last lines of stderr in the
    log (bounded); the other groups train; every scratch directory is gone."""
    eng, make = setup
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    pid_file = tmp_path / "child.pid"
    flow = make(agent_cmd=AGENT, agent_timeout_s=5.0, agent_memory_mb=512)
    with caplog.at_level(logging.ERROR):
        flow.start(item(0, size=1, mode="sleep", pid_file=str(pid_file)))
        flow.start(item(1, size=1, mode="fail"))
        flow.start(item(2, size=1, mode="flood"))
        flow.start(item(3))
        flow.start(item(4))
        flow.start(item(5, size=1, mode="hog", mb=1024))
        results, _ = drive(flow, eng, 6, timeout_s=120)
    failed = {r.group_id: r.failed for r in results}
    assert failed == {0: 1, 1: 1, 2: 1, 3: 0, 4: 0, 5: 1}
    assert all(len(r.samples) == 2 for r in results if r.group_id in (3, 4))
    messages = [r.getMessage() for r in caplog.records]
    timed_out, = [m for m in messages if "(episode 0 of group 0)" in m]
    assert "ran past workflow.agent_timeout_s=5s of its own time" in timed_out
    assert "its process group was killed" in timed_out
    exited, = [m for m in messages if "(episode 0 of group 1)" in m]
    assert exited.endswith("exited with code 1; its stderr ends:\n    working on it\n"
                           "    Traceback: the program's own bug")
    assert f"workflow.agent_cmd={flow.runner.cmd!r}" in exited
    flooded, = [m for m in messages if "(episode 0 of group 2)" in m]
    assert "exited with code 3; its stderr ends:\n    xxx" in flooded
    assert len(flooded) < TAIL  # the tail's last line, cut to 300 characters
    hog, = [m for m in messages if "(episode 0 of group 5)" in m]
    assert "exited with code 1" in hog and hog.endswith("MemoryError")
    assert _gone(int(pid_file.read_text()))
    assert list(scratch.iterdir()) == []


def _gone(pid: int) -> bool:
    """The process has ended (a zombie left to a container's init that does not reap counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def test_a_programs_reward_file_is_read_bounded_and_checked(setup, caplog):
    """AREAL_REWARD_FILE: a number or JSON with "reward" (numbers beside it logged); anything else,
    a non-finite number, or a link (to a file the program must not make the worker read), fails
    the episode, named."""
    eng, make = setup
    flow = make(agent_cmd=AGENT, agent_reward="file")
    written = ['{"reward": 0.25, "steps": 3}', "0.5\n", "yes", "NaN", "1" * 70_000]
    with caplog.at_level(logging.ERROR):
        for g, text in enumerate(written):
            flow.start(item(g, size=1, mode="reward", reward_text=text))
        flow.start(item(5, size=1, mode="reward", link="/etc/hostname"))
        results, _ = drive(flow, eng, 6, timeout_s=120)
    by = {r.group_id: r for r in results}
    assert [s.reward for s in by[0].samples] == [0.25] and by[0].counters["agent_extra_steps"] == 3
    assert [s.reward for s in by[1].samples] == [0.5]
    assert [by[g].failed for g in (2, 3, 4, 5)] == [1, 1, 1, 1]
    assert "its reward file holds b'yes', neither a number nor JSON" in caplog.text
    assert "its reward file holds b'NaN': write a finite number" in caplog.text
    assert "its reward file is larger than 65536 bytes" in caplog.text
    assert "its reward file cannot be opened: Too many levels of symbolic links" in caplog.text


VERIFIER = ("python3 -c 'import json, sys; p = json.load(sys.stdin); print(\"checking\"); "
            "sys.exit(2) if p[\"meta\"].get(\"verdict\") == \"fail\" else "
            "print(0.75 if p[\"answer\"] == \"7\" and isinstance(p[\"last_reply\"], str) else 0)'")


def test_a_verifier_scores_the_program_with_the_answer_it_never_saw(setup, caplog):
    eng, make = setup
    flow = make(agent_cmd=AGENT, agent_reward="verifier", agent_verifier_cmd=VERIFIER)
    with caplog.at_level(logging.ERROR):
        flow.start(item(0))
        flow.start(item(1, size=1, verdict="fail"))
        results, _ = drive(flow, eng, 2, timeout_s=120)
    by = {r.group_id: r for r in results}
    assert [s.reward for s in by[0].samples] == [0.75, 0.75] and by[1].failed == 1
    assert "the verifier (workflow.agent_verifier_cmd) exited with code 2" in caplog.text


def test_a_sandboxed_program_reaches_the_endpoint_and_nothing_else(setup, tmp_path):
    """Under bubblewrap the program's calls go through (127.0.0.1 at the endpoint's port, forwarded
    to its Unix socket), while a server listening on the host's loopback is out of reach and a
    path outside its scratch directory cannot be written."""
    eng, make = setup
    other = socket.create_server(("127.0.0.1", 0))
    outside = tmp_path / "escaped"
    flow = make(agent_cmd=AGENT, agent_sandbox=True, agent_reward="file")
    flow.start(item(0, mode="probe", other_port=other.getsockname()[1], outside=str(outside)))
    [g], _ = drive(flow, eng, 1, timeout_s=120)
    other.close()
    assert not g.failed and [s.reward for s in g.samples] == [1.0, 1.0]
    assert g.counters["agent_extra_reached_other"] == 0
    assert g.counters["agent_extra_wrote_outside"] == 0 and not outside.exists()


def test_words_of_the_command_naming_files_of_the_launch_directory_become_absolute(tmp_path):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "run.sh").write_text("")
    (tmp_path / "agent.py").write_text("")
    cmd = ("cd .. && bash agents/run.sh --x=1 | python3 agent.py -m pkg 'agents/run.sh' missing.py"
           f" agents /bin/sh / {tmp_path}")
    resolved, named = resolve_paths(cmd, str(tmp_path))
    run, py = str(tmp_path / "agents" / "run.sh"), str(tmp_path / "agent.py")
    assert resolved == (f"cd .. && bash {run} --x=1 | python3 {py} -m pkg 'agents/run.sh' "
                        f"missing.py agents /bin/sh / {tmp_path}")
    # a sandbox mounts these: never "/" nor another absolute directory
    assert named == [run, py, "/bin/sh"]


def test_a_command_that_cannot_start_is_named_before_the_run():
    def problems(cmd):
        return command_problems(WorkflowConfig(name="agent", agent_cmd=cmd))

    assert problems(f"python3 {PROGRAM}") == problems("cd /tmp && ls") == []
    assert problems("FOO=1 prog") == []  # an assignment first: not checked
    assert problems("no_such_program --x") == ["workflow.agent_cmd='no_such_program --x': "
                                               "'no_such_program' is neither a program on PATH "
                                               "nor a file of this directory"]
    assert problems("'open") == ["workflow.agent_cmd=\"'open\": No closing quotation"]

"""The code sandbox on HumanEval's canonical solutions and on hostile programs."""

import os
import socket
import uuid
from pathlib import Path

import pytest

from areal_cli.config.task import RewardConfig
from areal_cli.rewards import score
from areal_cli.rewards.sandbox import Limits, run_python
from areal_cli.tasks import Problem
from areal_cli.tasks.humaneval import read_all, to_problem

FAST = RewardConfig(code_cpu_s=1, code_wall_s=2.0, code_mem_mb=512, code_nproc=16)
PROBE = Problem(
    "probe/0", "", "", {"test": "def check(f):\n    assert f() == 1\n", "entry_point": "f"}
)


def humaneval(indices):
    records = read_all()
    return [to_problem(records[i], "") for i in indices]


def sandbox_processes() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"sandbox_child" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:  # the process ended while we looked
            continue
    return found


def test_canonical_solutions_pass_and_wrong_ones_fail():
    for p in humaneval(range(0, 164, 8)):  # 21 of the 164; AREAL_SLOW_TESTS=1 runs all
        assert score(p.answer, p, RewardConfig()) == 1.0, p.id
        whole = f"Sure:\n```python\n{p.meta['code_prefix']}{p.answer}```\n"
        assert score(whole, p, RewardConfig()) == 1.0, p.id
        assert score("    return None\n", p, RewardConfig()) == 0.0, p.id


@pytest.mark.skipif(not os.environ.get("AREAL_SLOW_TESTS"), reason="set AREAL_SLOW_TESTS=1")
def test_all_164_canonical_solutions_pass():
    failed = [p.id for p in humaneval(range(164)) if score(p.answer, p, RewardConfig()) != 1.0]
    assert failed == []


def hostile(body: str) -> str:
    return "def f():\n" + "".join(f"    {line}\n" for line in body.splitlines()) + "    return 1\n"


@pytest.fixture(params=[True, False], ids=["namespaces", "fallback"])
def namespaces(request, monkeypatch):
    """Run each hostile case with kernel namespaces and with the unprivileged fallback."""
    import areal_cli.rewards.sandbox as sandbox

    real = sandbox.run_python
    monkeypatch.setattr(
        "areal_cli.rewards.code_reward.run_python",
        lambda program, limits: real(program, limits, namespaces=request.param),
    )
    return request.param


CASES = {
    "infinite_loop": "while True:\n    pass",
    "sleep_forever": "import time\ntime.sleep(1000)",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "allocate_10gb": "x = bytearray(10 * 1024 ** 3)",
    "exit_early": "import os\nos._exit(0)",
}


@pytest.mark.parametrize("case", CASES)
def test_hostile_code_is_contained_and_scores_zero(case, namespaces):
    assert score(hostile(CASES[case]), PROBE, FAST) == 0.0
    assert sandbox_processes() == []  # the whole tree is gone
    assert score(hostile("pass"), PROBE, FAST) == 1.0  # and the next call still works


def test_writing_outside_its_directory_fails(namespaces):
    target = Path(f"/tmp/areal_escape_{uuid.uuid4().hex}")
    body = f"open({str(target)!r}, 'w').write('escaped')"
    assert score(hostile(body), PROBE, FAST) == 0.0
    assert not target.exists()
    assert score(hostile("open('inside.txt', 'w').write('ok')"), PROBE, FAST) == 1.0


def test_no_network_even_to_loopback(namespaces):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    body = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).send(b'x')"
    try:
        assert score(hostile(body), PROBE, FAST) == 0.0
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    finally:
        server.close()
    assert score(hostile("pass"), PROBE, FAST) == 1.0


def test_output_flood_is_capped():
    result = run_python(
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", Limits(fsize_mb=1)
    )
    assert result.status == "failed" and len(result.output) <= 2000

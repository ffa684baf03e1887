"""The code reward on HumanEval's canonical solutions; a verdict the candidate cannot forge;
refusing to run without isolation; the unsafe opt-in; what the reward pool reports.
(Hostile programs against the isolation itself: test_sandbox_escapes.py.)"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from areal_cli.config.task import RewardConfig, TaskConfig
from areal_cli.rewards import RewardPool, score
from areal_cli.rewards import sandbox as sandbox_module
from areal_cli.rewards.code_reward import run_tests
from areal_cli.rewards.sandbox import (
    Limits,
    SandboxUnavailable,
    require,
    run_python,
    sandbox_problems,
)
from areal_cli.tasks import Problem
from areal_cli.tasks.humaneval import read_all, to_problem

# the tests that start sandboxed programs share one pytest-xdist worker (make test runs
# --dist loadgroup): the leftover checks of test_sandbox_escapes see every sandbox of the host
pytestmark = pytest.mark.xdist_group("sandbox")

FAST = RewardConfig(code_cpu_s=1, code_wall_s=3.0, code_mem_mb=512, code_nproc=16)
ISOLATIONS = ["bwrap", "unsafe_none"]


def humaneval(indices):
    records = read_all()
    return [to_problem(records[i], "") for i in indices]


def probe(test: str, entry: str = "f") -> Problem:
    return Problem("probe/0", "", "", {"test": test, "entry_point": entry})


ASSERT_ONE = probe("def check(f):\n    assert f() == 1\n")
RETURN_ONE = "```python\ndef f():\n    return 1\n```"


def test_canonical_solutions_pass_and_wrong_ones_fail():
    for p in humaneval(range(0, 164, 16)):  # 11 of the 164; AREAL_SLOW_TESTS=1 runs all
        assert score(p.answer, p, RewardConfig()) == 1.0, p.id
        whole = f"Sure:\n```python\n{p.meta['code_prefix']}{p.answer}```\n"
        assert score(whole, p, RewardConfig()) == 1.0, p.id
        assert score("    return None\n", p, RewardConfig()) == 0.0, p.id


def test_tests_drawing_random_inputs_and_calling_prefix_helpers_replay_the_same():
    for p in humaneval([32, 53]):  # 32: poly() from the prompt; 53: unseeded random inputs
        result = run_tests(p.answer, p, RewardConfig())
        assert result.passed, result.output


@pytest.mark.skipif(not os.environ.get("AREAL_SLOW_TESTS"), reason="set AREAL_SLOW_TESTS=1")
def test_all_164_canonical_solutions_pass():
    failed = [p.id for p in humaneval(range(164)) if score(p.answer, p, RewardConfig()) != 1.0]
    assert failed == []


FORGERIES = {
    # the old attack: a "passed" marker on every descriptor, then exit before any test runs
    "marker_then_exit": "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, "
                        "b'ok{\"end\":true}\\n')\n"
    "    except OSError:\n        pass\nos._exit(0)\ndef f():\n    return 2\n",
    # a well-formed "end" record, then exit: the calls the tests make were never answered
    "end_record_then_exit": "import os\nfor fd in range(3, 64):\n    try:\n"
    "        os.write(fd, b'{\"end\":true}\\n')\n    except OSError:\n        pass\nos._exit(0)\n",
    "exit_early": "import os\nos._exit(0)\n",
    "sys_exit_zero": "import sys\nsys.exit(0)\n",
    "eq_always_true": "class Any:\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = object.__hash__\ndef f():\n    return Any()\n",
    "int_subclass": "class One(int):\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\ndef f():\n    return One(5)\n",
    "patched_assertion": "import builtins\nbuiltins.AssertionError = type('N', (Exception,), {})\n"
    "def f():\n    return 2\n",
    "wrong_answer": "def f():\n    return 2\n",
    # answers forged ahead of the calls on every descriptor: too long, too deep, not JSON
    **{f"forged_answer_{kind}": "import os\nfor fd in range(3, 64):\n    try:\n"
       f"        os.write(fd, {frame!r})\n    except OSError:\n        pass\n"
       "def f():\n    return 1\n"
       for kind, frame in [("too_long", b"\x7f\xff\xff\xff"),
                           ("too_deep", len(b"[" * 99999).to_bytes(4, "big") + b"[" * 99999),
                           ("not_json", b"\x00\x00\x00\x03{1:")]},
}  # fmt: skip


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_forged_verdict_scores_zero(forgery, isolation):
    cfg = RewardConfig(**{**FAST.__dict__, "sandbox": isolation})
    result = run_tests(f"```python\n{FORGERIES[forgery]}```", ASSERT_ONE, cfg)
    assert result.status == "failed" and result.isolation == isolation, result.output
    assert run_tests(RETURN_ONE, ASSERT_ONE, cfg).passed


def test_the_replay_keeps_exceptions_mutation_and_tests_without_an_entry_point():
    raises = probe("def check(f):\n    try:\n        f(-1)\n    except ValueError:\n        "
                   "return\n"
                   "    raise AssertionError('no ValueError')\n")  # fmt: skip
    body = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    assert run_tests(f"```python\n{body}```", raises, FAST).passed
    sorts = probe("def check(f):\n    a = [3, 1, 2]\n    f(a)\n    assert a == [1, 2, 3]\n")
    assert run_tests("```python\ndef f(a):\n    a.sort()\n```", sorts, FAST).passed
    assert not run_tests("```python\ndef f(a):\n    pass\n```", sorts, FAST).passed
    mbpp = probe("assert add(1, 2) == 3\nassert add((1,), (2,)) == (1, 2)\n", entry="")
    add = "def add(a, b):\n    return a + b if a != 9 else add(a, b)\n"
    assert run_tests(f"```python\n{add}```", mbpp, FAST).passed
    assert not run_tests("```python\ndef add(a, b):\n    return [a, b]\n```", mbpp, FAST).passed


def test_output_flood_is_capped():
    result = run_python(
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", Limits(fsize_mb=1)
    )
    assert result.status == "failed" and len(result.output) <= 2000


def test_tool_output_and_isolation_are_reported():
    result = run_python("print(6 * 7)", Limits())
    assert result.passed and "42" in result.output and result.isolation == "bwrap"


def test_unsafe_none_is_an_explicit_opt_in_logged_on_every_result(caplog):
    cfg = RewardConfig(**{**FAST.__dict__, "sandbox": "unsafe_none"})
    with caplog.at_level(logging.WARNING):
        result = run_tests(RETURN_ONE, ASSERT_ONE, cfg)
    assert result.passed and result.isolation == "unsafe_none"
    assert "UNSAFE" in caplog.text and "NO isolation" in caplog.text
    assert "unknown" in RewardConfig(sandbox="unknown").validate()[0]


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    """A PATH without bubblewrap (the probe's cache cleared before and after)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox_module._probe.cache_clear()
    yield
    sandbox_module._probe.cache_clear()


def test_without_bubblewrap_code_runs_refuse_to_start(no_bwrap):
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        require("bwrap")
    with pytest.raises(SandboxUnavailable, match="unsafe_none"):
        run_tests(RETURN_ONE, ASSERT_ONE, FAST)
    code = RewardConfig(fn="code")
    assert "bubblewrap" in sandbox_problems(code, TaskConfig())[0]
    assert sandbox_problems(RewardConfig(), TaskConfig(source="humaneval"))  # auto on tests
    assert sandbox_problems(RewardConfig(fn="exact"), TaskConfig(), runs_code=True)
    assert sandbox_problems(RewardConfig(), TaskConfig()) == []  # math needs no sandbox
    assert sandbox_problems(RewardConfig(fn="code", sandbox="unsafe_none"), TaskConfig()) == []


def test_the_cli_exits_2_naming_the_package(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-m", "areal_cli.cli", "train", "reward.fn=code", "task=humaneval",
         "--dry-run"], capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    assert "apt-get install bubblewrap" in run.stdout + run.stderr


def test_bubblewrap_that_cannot_make_namespaces_is_refused_naming_the_sysctl():
    """A user namespace whose root may create no further namespaces (like a container's
    root under a strict seccomp profile): neither of bubblewrap's modes can start."""
    cli = f"{sys.executable} -m areal_cli.cli train reward.fn=code task=humaneval --dry-run"
    script = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {cli}"
    try:
        run = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    except FileNotFoundError:
        pytest.skip("no unshare(1) here")
    if "unshare:" in run.stderr:
        pytest.skip(f"cannot make a user namespace here: {run.stderr.strip()}")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "user.max_user_namespaces" in run.stdout + run.stderr


def test_the_pool_reports_which_isolation_ran():
    p = humaneval([0])[0]
    with RewardPool(RewardConfig(fn="auto"), 1) as pool:
        result = pool.submit(p.answer, p).result(timeout=60)
        math = pool.submit("Answer: 5", Problem("m/0", "", "5", {})).result(timeout=60)
    assert (result.score, result.sandbox) == (1.0, "bwrap")
    assert math.sandbox == "" and pool.sandbox_runs == {"bwrap": 1}


# Reads the tests out of its caller's frames, runs them once against a probe whose __eq__ records
# each expected value, then answers every call from that table: generic for `assert f(x) == y`.
FRAME_CHEAT = """import sys
TABLE = {}
class Probe:
    def __init__(self, key):
        self.key = key
    def __eq__(self, other):
        TABLE[self.key] = other
        return True
    __hash__ = object.__hash__
def probe(*args):
    return Probe(repr(args))
def ENTRY(*args):
    if not TABLE:
        frame = sys._getframe(1)
        while "check" not in frame.f_globals:
            frame = frame.f_back
        try:
            frame.f_globals["check"](probe)
        except BaseException:
            pass
    return TABLE.get(repr(args))
"""


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_reading_the_tests_from_the_callers_frame_scores_zero(isolation):
    """The tests run in a harness process of their own: the candidate's frames hold no test."""
    cfg = RewardConfig(**{**FAST.__dict__, "sandbox": isolation})
    secret = probe("def check(f):\n    assert f(3) == 'x7q'\n    assert f(4) == [1, 'zz']\n")
    cheat = f"```python\n{FRAME_CHEAT.replace('ENTRY', 'f')}```"
    result = run_tests(cheat, secret, cfg)
    assert result.status == "failed", result.output
    for p in humaneval([0, 13, 53]):  # on HumanEval: the cheat fails, the honest solution passes
        cheat = f"```python\n{FRAME_CHEAT.replace('ENTRY', p.meta['entry_point'])}```"
        assert run_tests(cheat, p, cfg).status == "failed", p.id
        assert run_tests(p.answer, p, cfg).passed, p.id


def test_raising_stop_iteration_cannot_end_the_tests_loop():
    """Raised inside the tests' `map`, a StopIteration would end it early: all([]) is True."""
    loop = probe("def check(f):\n    assert all(map(lambda x: f(x) == x + 1, range(3)))\n")
    stop = "```python\ndef f(x):\n    raise StopIteration\n```"
    assert run_tests(stop, loop, FAST).status == "failed"
    assert run_tests("```python\ndef f(x):\n    return x + 1\n```", loop, FAST).passed


def test_a_result_that_is_not_plain_data_fails():
    swallows = probe("def check(f):\n    try:\n        f()\n    except:\n        pass\n")
    for value in ("object()", "iter([1])", "type('L', (list,), {})([1])", "lambda: 1"):
        candidate = f"```python\ndef f():\n    return {value}\n```"
        for tests in (ASSERT_ONE, swallows):  # a bare `except` in the tests cannot hide it
            result = run_tests(candidate, tests, FAST)
            assert result.status == "failed" and "not a plain value" in result.output, value
    assert run_tests(RETURN_ONE, swallows, FAST).passed

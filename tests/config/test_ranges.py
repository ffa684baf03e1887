"""Every numeric setting is range- and finiteness-checked on load, all problems at once."""

from __future__ import annotations

import subprocess

import pytest
from conftest import AREAL, ROOT

from areal_cli.config.ranges import RANGES, numeric_fields
from areal_cli.config.schema import RootConfig
from areal_cli.eval.config import EvalRunConfig, compose_eval
from areal_cli.runconfig.compose import ConfigError, compose

# each was accepted without a word before (a silent hang, gradient ascent, a NaN model, a traceback)
BAD = {
    "rollout.max_concurrent=-1": "[0, inf)",
    "trainer.grad_clip=-1": "(0, inf)",
    "trainer.lr=inf": "finite",
    "reward.timeout_s=nan": "finite",
    "rollout.temperature=nan": "finite",
    "engine.page_size=0": "[1, 4096]",
    "launcher.port_base=70000": "[0, 65529]",
    "launcher.peer_timeout_s=nan": "finite",
    "algorithm.dual_clip=nan": "finite",
    "engine.gpu_memory_utilization=1.5": "(0, 1]",
}


def assert_each_named_once(bad: dict) -> None:
    """Composing every override of ``bad`` at once reports each, once (not again by an older
    check), naming its key and the allowed range."""
    with pytest.raises(ConfigError) as err:
        compose(list(bad))
    problems = err.value.problems
    for override, allowed in bad.items():
        key = override.split("=")[0]
        mine = [p for p in problems if p.startswith(key + "=")]
        assert len(mine) == 1 and allowed in mine[0], (key, problems)


def test_every_bad_value_is_reported_at_once_with_its_key_and_range():
    assert_each_named_once(BAD)


def test_the_defaults_and_edge_values_pass():
    compose([])
    compose(["launcher.port_base=65529", "rollout.max_concurrent=0",
             "engine.gpu_memory_utilization=1.0",
             "algorithm.dual_clip=null"])


def test_every_numeric_setting_has_a_range():
    """A new numeric key needs its entry in config/ranges.py RANGES."""
    missing = [key for cfg in (RootConfig(), EvalRunConfig()) for key, cls, name,
               _ in numeric_fields(cfg)
               if name not in RANGES.get(cls, {})]
    assert not missing, f"add these to RANGES in areal_cli/config/ranges.py: {missing}"
    optional = [("algorithm.dual_clip", 3.0), ("algorithm.behav_mask_low", 0.5),
                ("algorithm.behav_mask_high", 2.0)]  # None by default: give a value to walk them
    cfg = compose([f"{k}={v}" for k, v in optional])
    walked = {key for key, *_ in numeric_fields(cfg)}
    assert {k for k, _ in optional} <= walked


def test_eval_settings_are_checked_too():
    with pytest.raises(ConfigError) as err:
        compose_eval(["temperature=nan", "timeout_s=-1", "top_p=0"])
    text = str(err.value)
    assert "temperature=nan: must be a finite number" in text
    assert "timeout_s=-1.0: must be in [0, 2147483]" in text
    assert "top_p=0.0: must be in (0, 1]" in text


def test_port_base_out_of_range_exits_2_without_a_traceback(tmp_path):
    proc = subprocess.run(AREAL + ["train", f"run_dir={tmp_path}/r", "launcher.port_base=70000",
                                   "trainer.grad_clip=-1"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "launcher.port_base=70000: must be in [0, 65529]" in proc.stderr
    assert "trainer.grad_clip=-1.0" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_nan_parses_as_a_float_and_is_refused():
    """OmegaConf turns the text 'nan' into float('nan'): the check must see it, comparisons do
    not."""
    with pytest.raises(ConfigError) as err:
        compose(["trainer.weight_decay=nan"])
    assert "trainer.weight_decay=nan: must be a finite number in [0, inf)" in str(err.value)


# accepted before: a staleness no run can reach, "one gloo group of 100001 ranks", sandbox limits
# that never bind (so they were off)
BEYOND = {
    "rollout.max_staleness=1000000000": "must be at most trainer.steps=50",
    "rollout.workers=100000": "CPU core(s) this machine gives areal",
    "reward.code_mem_mb=100000000": "at most this machine's memory",
    "reward.code_nproc=100000000": "tasks this machine's kernel allows",
}


def test_values_beyond_the_run_or_the_machine_exit_2_naming_each_key(tmp_path):
    proc = subprocess.run(AREAL + ["train", f"run_dir={tmp_path}/r", "trainer.steps=50", *BEYOND],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    for override, why in BEYOND.items():
        assert any(line.strip().startswith(f"- {override}:") and why in line
                   for line in proc.stderr.splitlines()), \
            (override, proc.stderr)
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


def test_short_runs_keep_the_default_staleness_and_the_edges_pass():
    from areal_cli.config.machine import cores

    compose(["trainer.steps=1"])  # η = 4 (the default) though the run has one step
    compose(["trainer.steps=7", "rollout.max_staleness=7", f"rollout.workers={cores()}"])


# accepted before, then a started process crashed or stalled: an OverflowError at the first wait
# (ZeroMQ's poll takes int32 milliseconds), a heartbeat thread that never sleeps, 1e5 torch threads,
# a KV cache or engine batch past int32 indices, a --signal Slurm refuses
STARTED_THEN_FAILED = {
    "reward.batch_wait_s=1e12": "[0, 2147483] (seconds)",
    "launcher.peer_timeout_s=1e12": "(0, 2147483] (seconds)",
    "launcher.startup_timeout_s=1e12": "(0, 2147483] (seconds)",
    "launcher.stop_timeout_s=1e12": "[0, 2147483] (seconds)",
    "reward.timeout_s=1e12": "(0, 2147483] (seconds)",
    "reward.code_cpu_s=10000000000": "[1, 2147483] (seconds)",
    "workflow.agent_timeout_s=1e12": "(0, 2147483] (seconds)",
    "launcher.heartbeat_s=1e-6": "[0.1, 2147483] (seconds)",
    "launcher.signal_s=100000": "[0, 65535]",
    "trainer.threads=100000": "[0, 1024]",
    "engine.threads=100000": "[0, 1024]",
    "engine.kv_cache_tokens=1000000000000": "[0, 2147483647]",
    "engine.max_batch_tokens=10000000000": "[1, 2147483647]",
}


def test_values_a_started_process_cannot_take_are_refused_naming_key_and_range():
    assert_each_named_once(STARTED_THEN_FAILED)


def test_the_nearest_sane_values_pass():
    compose(["reward.batch_wait_s=2147483", "reward.timeout_s=2147483",
             "launcher.peer_timeout_s=2147483", "launcher.startup_timeout_s=2147483",
             "launcher.stop_timeout_s=2147483", "reward.code_cpu_s=2147483",
             "reward.code_wall_s=2147482", "workflow.agent_timeout_s=2147483",
             "launcher.heartbeat_s=0.1", "launcher.signal_s=65535",
             "engine.kv_cache_tokens=2147483647", "engine.max_batch_tokens=2147483647"])
    compose(["trainer.threads=1024", "engine.threads=1024", "launcher=slurm"])  # no local cores


def test_eval_waits_and_threads_are_bounded_too():
    with pytest.raises(ConfigError) as err:
        compose_eval(["timeout_s=1e12", "threads=100000"])
    text = str(err.value)
    assert "timeout_s=1000000000000.0: must be in [0, 2147483]" in text
    assert "threads=100000: must be in [0, 1024]" in text


def _refused(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    return err.value.problems


def test_values_beyond_the_rest_of_the_config_are_refused_naming_the_bound():
    from areal_cli.config.machine import cores

    n = cores()
    assert any(p.startswith("trainer.batch_size=1000000000: must be at most task.size=2000")
               for p in _refused(["trainer.batch_size=1000000000"]))
    assert any(p.startswith("rollout.group_size=100000000:") and "int32 indices" in p
               for p in _refused(["rollout.group_size=100000000"]))
    assert any(p.startswith("reward.batch_wait_s=20: must be below reward.timeout_s=10")
               for p in _refused(["reward.fn=[auto,judge]", "reward.judge.model=j",
                                  "reward.batch_wait_s=20"]))
    assert any(p.startswith("launcher.progress_timeout_s=2: must be 0 (never) or at least 3")
               for p in _refused(["launcher.progress_timeout_s=2"]))
    machine = _refused([f"engine.threads={n + 1}", f"trainer.threads={n + 1}",
                        f"reward.workers={n + 1}"])
    for key in ("engine.threads", "trainer.threads", "reward.workers"):
        assert any(p.startswith(f"{key}={n + 1}: must be at most the {n} CPU core(s)")
                   for p in machine), (key, machine)


def test_the_edges_of_those_bounds_pass():
    from areal_cli.config.machine import cores

    n = cores()
    compose(["trainer.batch_size=2000", "launcher.progress_timeout_s=3", "rollout.group_size=1000",
             f"engine.threads={n}", f"trainer.threads={n}", f"reward.workers={n}"])
    compose(["launcher.progress_timeout_s=0", "reward.fn=[auto,judge]", "reward.judge.model=j",
             "reward.batch_wait_s=9.9"])


def test_a_kv_cache_past_this_machines_memory_exits_2_at_dry_run(tmp_path):
    """The hf engine on the CPU allocates its whole cache at start: the plan refuses it first."""
    proc = subprocess.run(AREAL + ["train", "--dry-run", "engine.kv_cache_tokens=2000000000",
                                   "rollout.group_size=1000000"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "- engine.kv_cache_tokens=2000000000: the KV cache of 1 rollout worker(s)" in proc.stderr
    assert "more than this machine's" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(AREAL + ["train", "--dry-run", "rollout.group_size=1000000",
                                   "reward.batch_wait_s=1e12"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "- reward.batch_wait_s=1000000000000.0: must be in [0, 2147483]" in proc.stderr
    proc = subprocess.run(AREAL + ["train", "--dry-run", "rollout.group_size=1000000"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "- rollout.group_size=1000000: the KV cache" in proc.stderr

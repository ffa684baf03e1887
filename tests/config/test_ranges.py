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


def test_every_bad_value_is_reported_at_once_with_its_key_and_range():
    with pytest.raises(ConfigError) as err:
        compose(list(BAD))
    problems = err.value.problems
    for override, allowed in BAD.items():
        key = override.split("=")[0]
        mine = [p for p in problems if p.startswith(key + "=")]
        assert len(mine) == 1, (key, problems)  # once, not again by an older check
        assert allowed in mine[0], mine[0]


def test_the_defaults_and_edge_values_pass():
    compose([])
    compose(["launcher.port_base=65529", "rollout.max_concurrent=0", "engine.gpu_memory_utilization=1.0",
             "algorithm.dual_clip=null"])


def test_every_numeric_setting_has_a_range():
    """A new numeric key needs its entry in config/ranges.py RANGES."""
    missing = [key for cfg in (RootConfig(), EvalRunConfig()) for key, cls, name, _ in numeric_fields(cfg)
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
    assert "timeout_s=-1.0: must be in [0, inf)" in text and "top_p=0.0: must be in (0, 1]" in text


def test_port_base_out_of_range_exits_2_without_a_traceback(tmp_path):
    proc = subprocess.run(AREAL + ["train", f"run_dir={tmp_path}/r", "launcher.port_base=70000",
                                   "trainer.grad_clip=-1"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "launcher.port_base=70000: must be in [0, 65529]" in proc.stderr
    assert "trainer.grad_clip=-1.0" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_nan_parses_as_a_float_and_is_refused():
    """OmegaConf turns the text 'nan' into float('nan'): the check must see it, comparisons do not."""
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
        assert any(line.strip().startswith(f"- {override}:") and why in line for line in proc.stderr.splitlines()), \
            (override, proc.stderr)
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


def test_short_runs_keep_the_default_staleness_and_the_edges_pass():
    from areal_cli.config.machine import cores

    compose(["trainer.steps=1"])  # η = 4 (the default) though the run has one step
    compose(["trainer.steps=7", "rollout.max_staleness=7", f"rollout.workers={cores()}"])

"""Hostile LoRA settings stop `areal train` with exit code 2 before any process starts, naming the
key and the fix: a rank above the smallest targeted dimension, an unknown target module, LoRA with
PPO's critic, and a LoRA checkpoint resumed with another rank."""

from __future__ import annotations

import subprocess

import pytest
from conftest import AREAL, ROOT, TINY_RUN

from areal_cli.checkpoint_dirs import MARKER, marker_text
from areal_cli.lora import save_adapter
from areal_cli.runconfig.compose import compose, save_yaml
from areal_cli.rundir import RunDir


def _train(*args: str):
    return subprocess.run(AREAL + ["train", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=180)


def _nothing_started(run_dir) -> bool:
    return not RunDir(run_dir).metrics.exists() and not list(RunDir(run_dir).logs.glob("*.log"))


@pytest.mark.parametrize("overrides, needles", [
    # the tiny model's k_proj/v_proj map 64 → 32: rank 48 exceeds 32
    (["trainer.lora.rank=48"], ["trainer.lora.rank=48", "trainer.lora.rank<=32"]),
    (["trainer.lora.rank=4", "trainer.lora.target_modules=[q_proj,qkv_proj]"],
     ["trainer.lora.target_modules", "qkv_proj", "use some of", "o_proj"]),
    (["trainer.lora.rank=4", "algorithm=ppo"],
     ["trainer.lora.rank=4", "algorithm=grpo", "trainer.lora.rank=0"]),
    (["trainer.lora.rank=4", "trainer.lora.target_modules=[]"],
     ["trainer.lora.target_modules", "q_proj"]),
    (["trainer.lora.rank=-1"], ["trainer.lora.rank=-1"]),
    (["trainer.lora.rank=4", "trainer.lora.target_experts=true"],
     ["trainer.lora.target_experts=true", "no routed experts", "target_experts=false"]),
])
def test_bad_lora_settings_exit_2_before_any_process(tiny_model, tmp_path, overrides, needles):
    run = tmp_path / "r"
    proc = _train(f"run_dir={run}", f"model={tiny_model}", *TINY_RUN, *overrides)
    assert proc.returncode == 2, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    assert _nothing_started(run)


@pytest.mark.slow  # 10-19 s: make test-slow (make test stays within 15 minutes)
def test_a_lora_checkpoint_resumed_with_another_rank_exits_2(tiny_model, tmp_path):
    run = tmp_path / "r"
    cfg = compose([f"model={tiny_model}", f"run_dir={run}", "trainer.lora.rank=4", *TINY_RUN])
    run.mkdir(mode=0o700)  # as areal makes a run directory: others cannot read it
    RunDir(run).logs.mkdir()
    save_yaml(cfg, RunDir(run).config)
    proc = _train(f"resume={run}", "trainer.lora.rank=8")
    assert proc.returncode == 2
    assert "trainer.lora.rank=8" in proc.stderr and f"model={run}/checkpoints/final" in proc.stderr
    # a config edited by hand to another rank than its checkpoint's adapter
    ckpt = RunDir(run).checkpoint(2)
    save_adapter(ckpt / "adapter", iter([]), cfg.trainer.lora, str(tiny_model))
    (ckpt / "controller.json").write_text("{}")
    (ckpt / MARKER).write_text(marker_text(2))  # as the controller marks a checkpoint of the run
    cfg.trainer.lora.rank = 8
    save_yaml(cfg, RunDir(run).config)
    proc = _train(f"resume={run}")
    assert proc.returncode == 2
    assert "trainer.lora.rank=8" in proc.stderr and "rank-4 adapter" in proc.stderr, proc.stderr
    assert not RunDir(run).metrics.exists()

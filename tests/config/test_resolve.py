"""Every "auto" resolved once, when the run is planned: the values on the CPU and on GPUs (plans
made for GPU ids without a GPU), no auto left in what the processes read, resolving twice changes
nothing, and the choices are enums that refuse other values with the valid ones named."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from conftest import AREAL, ROOT

from areal_cli.config.cpu_dtype import choose
from areal_cli.config.resolve import (
    CPU,
    Placement,
    bucket_bytes,
    find_allocator,
    layer_params,
    require_resolved,
    unresolved,
)
from areal_cli.config.schema import RootConfig
from areal_cli.launcher.plan import make_plan
from areal_cli.runconfig.autos import resolve
from areal_cli.runconfig.compose import ConfigError, compose, load_yaml, to_yaml

GPUS = Placement(trainer_gpu=True)


def auto_lines(yaml_text: str) -> list[str]:
    """Lines of a config.yaml whose value is auto; reward.fn's auto is no resolution (it picks a
    scorer for each problem by what the problem carries), so it is left out."""
    return [x.strip() for x in yaml_text.splitlines() if x.strip().endswith(": auto") and x.strip()
            != "fn: auto"]


def test_cpu_and_gpu_resolve_the_device_dependent_keys_differently():
    cfg = compose([])
    cpu, gpu = resolve(cfg, CPU), resolve(cfg, GPUS)
    # trainer.optim_state: bfloat16 moments on the CPU, float32 on GPUs; the broadcast: gloo through
    # host memory with two 32 MiB bucket buffers on the CPU, staged 1 GiB NCCL buckets between GPUs
    assert (cpu.trainer.optim_state, gpu.trainer.optim_state) == ("bfloat16", "float32")
    assert (cpu.weights.backend, cpu.weights.staged, cpu.weights.bucket_mb) == ("gloo", "false", 32)
    assert (gpu.weights.backend, gpu.weights.staged, gpu.weights.bucket_mb) == ("nccl", "true",
                                                                                1024)
    # padded micro-batches on the CPU (a packed row's dense mask is O(T²) in CPU SDPA), packed on
    # GPUs
    assert (cpu.trainer.packing, gpu.trainer.packing) == ("false", "true")
    # a group's prompt once per row on the CPU (batching.share_prompts), not on GPUs
    assert (cpu.trainer.shared_prompts, gpu.trainer.shared_prompts) == ("true", "false")
    # bfloat16 on GPUs; on the CPU what this processor computes natively (config/cpu_dtype.py)
    assert (gpu.engine.dtype, gpu.trainer.dtype, gpu.weights.dtype) == ("bfloat16",) * 3
    assert (cpu.engine.dtype, cpu.trainer.dtype, cpu.weights.dtype) == (choose().dtype,) * 3
    for r in (cpu, gpu):  # the same wherever the run is
        assert (r.engine.lm_head_fp32, r.engine.weight_update) == ("false", "inplace")  # hf
    # the input is not changed
    assert cfg.trainer.optim_state == "auto" and cfg.weights.bucket_mb == 0


def test_a_rollout_worker_on_trainer_rank0s_gpu_gets_the_cuda_ipc_broadcast():
    shared = resolve(compose([]), Placement(trainer_gpu=True, shared_gpu=True))
    w = shared.weights
    assert (w.backend, w.staged, w.bucket_mb) == ("ipc", "true", 1024)
    assert shared.trainer.optim_state == "float32"  # the trainer is still on a GPU


def test_both_ends_of_the_broadcast_read_bucket_bytes_of_the_resolved_config():
    assert bucket_bytes(resolve(compose([]), CPU).weights) == 32 << 20
    assert bucket_bytes(resolve(compose(["weights.bucket_mb=8"]), GPUS).weights) == 8 << 20
    with pytest.raises(ValueError, match="weights.bucket_mb=0: resolve the config first"):
        bucket_bytes(compose([]).weights)  # 0 = auto: the engine never guesses the size itself


def test_plans_for_gpu_ids_resolve_for_gpus_without_one(tiny_model, tmp_path):
    base = [f"model={tiny_model}", f"run_dir={tmp_path}"]
    two = make_plan(compose(base), gpus=[0, 1]).cfg  # generation on GPU 0, training on GPU 1
    assert (two.weights.backend, two.trainer.optim_state) == ("nccl", "float32")
    one = make_plan(compose(base), gpus=[0]).cfg  # both on GPU 0: colocated
    assert (one.weights.backend, one.trainer.optim_state) == ("ipc", "float32")
    vllm = make_plan(compose([*base, "engine=vllm"]), gpus=[0, 1]).cfg
    # a Llama at TP 1
    assert (vllm.engine.lm_head_fp32, vllm.engine.weight_update) == ("true", "inplace")
    tp2 = make_plan(compose([*base, "engine=vllm", "engine.vllm.tensor_parallel_size=2"]),
                    gpus=[0, 1, 2]).cfg
    # any TP: each rank's weight loaders keep its slice
    assert tp2.engine.weight_update == "inplace"
    # the tiny model (74k decoder-layer weights) is not compiled; 2048-position output-layer chunks
    # on GPUs
    assert (two.trainer.compile, two.trainer.logprob_chunk_tokens) == ("false", 2048)
    assert make_plan(compose(base), gpus=[]).cfg.trainer.logprob_chunk_tokens == 256


def test_compile_auto_follows_the_layout():
    # Qwen2.5-1.5B: 28 layers × (q, o 1536² each; k, v 1536·256 each; MLP 3·1536·8960) = 1.31B ≥ 1B
    models = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
    assert layer_params(models / "qwen2.5-1.5b-instruct") == 28 * (2 * 1536**2 + 2 * 1536 * 256
                                                                   + 3 * 1536 * 8960)
    on_gpu = Placement(trainer_gpu=True, model_path=models / "qwen2.5-1.5b-instruct")
    assert resolve(compose([]), on_gpu).trainer.compile == "true"
    assert resolve(compose([]),
                   dataclasses.replace(on_gpu, trainer_gpu=False)).trainer.compile == "false"
    assert resolve(compose(["trainer.compile=false"]), on_gpu).trainer.compile == "false"


def test_a_mixture_of_experts_counts_every_expert_and_is_not_compiled():
    # OLMoE-1B-7B: 16 layers × (attention 4 · 2048², 64 experts × 3 · 2048 · 1024, router 2048 · 64)
    models = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
    olmoe = models / "olmoe-1b-7b-0924"
    assert layer_params(olmoe) == 16 * (4 * 2048**2 + 64 * 3 * 2048 * 1024 + 2048 * 64)
    on_gpu = Placement(trainer_gpu=True, model_path=olmoe)
    resolved = resolve(compose([]), on_gpu).trainer
    assert (resolved.compile, resolved.shard) == ("false", "true")
    assert resolve(compose(["trainer.compile=true"]), on_gpu).trainer.compile == "true"


def test_shard_auto_leaves_one_rank_of_a_small_model_unsharded(tiny_model):
    models = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
    small = Placement(trainer_gpu=True, model_path=tiny_model)
    large = dataclasses.replace(small, model_path=models / "qwen2.5-1.5b-instruct")
    assert layer_params(small.model_path) < 1e9 <= layer_params(large.model_path)
    assert resolve(compose([]), small).trainer.shard == "false"  # one GPU rank: host-bound
    assert resolve(compose([]), large).trainer.shard == "true"
    assert resolve(compose(["trainer.ranks=2"]), small).trainer.shard == "true"
    assert resolve(compose([]), CPU).trainer.shard == "false"
    # not known here (an uncached Hub model): FSDP, whose memory is the safe side
    assert resolve(compose([]), dataclasses.replace(small, model_path=None)).trainer.shard == "true"
    assert resolve(compose(["trainer.shard=true"]), small).trainer.shard == "true"
    with pytest.raises(ConfigError, match="trainer.shard=false with trainer.ranks=2"):
        compose(["trainer.shard=false", "trainer.ranks=2", "trainer.batch_size=2"])


def test_what_the_user_set_is_kept_and_weights_follow_the_engine():
    cfg = compose(["trainer.optim_state=bfloat16", "weights.bucket_mb=64", "weights.staged=false",
                   "weights.backend=gloo", "engine.lm_head_fp32=true", "precision=fp16"])
    r = resolve(cfg, GPUS)
    assert (r.trainer.optim_state, r.weights.bucket_mb, r.weights.staged, r.weights.backend) == (
        "bfloat16", 64, "false", "gloo")
    assert (r.engine.lm_head_fp32, r.engine.dtype, r.trainer.dtype) == ("true", "float16",
                                                                        "float16")
    assert r.weights.dtype == "float16"  # weights.dtype=auto: the engine's


def test_lora_merge_auto_merges_for_vllm_and_sends_the_adapter_to_hf():
    from areal_cli import lora

    assert resolve(compose(["engine=vllm", "trainer.lora.rank=8"]),
                   GPUS).engine.lora_merge == "true"
    hf = resolve(compose(["trainer.lora.rank=8"]), CPU)
    assert hf.engine.lora_merge == "false" and lora.sends_adapter(hf)
    kept = resolve(compose(["engine=vllm", "trainer.lora.rank=8", "engine.lora_merge=false"]), GPUS)
    assert kept.engine.lora_merge == "false" and lora.sends_adapter(kept)


def test_judge_engine_auto_is_vllm_only_on_reward_gpus_of_a_vllm_run():
    # vllm needs the GPU of reward.gpus and is installed where the run's engine is vllm; else hf
    assert resolve(compose([]), CPU).reward.judge.engine == "hf"
    # no reward.gpus: the CPU
    assert resolve(compose(["engine=vllm"]), GPUS).reward.judge.engine == "hf"
    assert resolve(compose(["reward.gpus=[2]"]), GPUS).reward.judge.engine == "hf"  # engine=hf
    assert resolve(compose(["engine=vllm", "reward.gpus=[2]"]), GPUS).reward.judge.engine == "vllm"
    kept = compose(["engine=vllm", "reward.gpus=[2]", "reward.judge.engine=hf"])
    assert resolve(kept, GPUS).reward.judge.engine == "hf"


def test_judge_engine_vllm_without_a_gpu_names_the_fix():
    with pytest.raises(ConfigError) as err:
        compose(["reward.fn=judge", "reward.judge.engine=vllm", "eval.at_end=false"])
    assert str(err.value) == ("  - reward.judge.engine=vllm needs a GPU and reward.gpus is empty: "
                              "set reward.gpus=[<gpu id>] (a GPU of its own), or "
                              "reward.judge.engine=hf")
    compose(["reward.fn=judge", "reward.judge.engine=vllm", "reward.gpus=[0]", "eval.at_end=false"])
    compose(["reward.judge.engine=vllm"])  # no judge in reward.fn: nothing runs it


def test_resolving_twice_changes_nothing_and_a_resolved_config_keeps_its_values():
    for placement in (CPU, GPUS, Placement(trainer_gpu=True, shared_gpu=True)):
        once = resolve(compose(["engine=vllm"]), placement)
        assert resolve(once, placement) == once
    planned_on_cpu = resolve(compose([]), CPU)
    assert resolve(planned_on_cpu, GPUS) == planned_on_cpu  # resolved once, where it was planned


def test_no_auto_is_left_in_the_resolved_config_or_the_written_config_yaml(tiny_model, tmp_path):
    assert unresolved(compose([])) == [
        "reward.judge.engine", "engine.dtype", "engine.weight_update", "engine.lora_merge",
        "engine.lm_head_fp32", "trainer.optim_state",
        "trainer.packing", "trainer.shared_prompts", "trainer.dtype",
        "trainer.activation_checkpointing", "trainer.compile",
        "trainer.shard", "weights.dtype", "weights.staged", "weights.backend", "launcher.allocator",
        "cluster.share", "logging.wandb_mode"]
    assert (unresolved(resolve(compose([]))) == [] and auto_lines(to_yaml(resolve(compose([]))))
            == [])
    plan = make_plan(compose([f"model={tiny_model}", f"run_dir={tmp_path / 'run'}", "engine=vllm"]),
                     gpus=[0, 1])
    plan.write()
    written = (tmp_path / "run" / "config.yaml").read_text()
    assert auto_lines(written) == [] and "fn: auto" in written
    loaded = require_resolved(load_yaml(tmp_path / "run" / "config.yaml", check=False),
                              "config.yaml")
    # 'true' survives YAML as the word
    assert loaded == plan.cfg and loaded.weights.staged == "true"


def test_a_process_refuses_a_config_that_was_not_resolved():
    with pytest.raises(ValueError, match=r"run/config.yaml: reward.judge.engine, engine.dtype, .* "
                                         r"still auto: start the run with `areal train`"):
        require_resolved(compose([]), "run/config.yaml")


def test_dry_run_prints_the_resolved_config():
    out = subprocess.run([*AREAL, "train", "--dry-run", "--no-checks", "trainer.steps=1"],
                         capture_output=True,
                         text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    config = out.stdout.split("# resolved config", 1)[1].split("# model", 1)[0]
    assert auto_lines(config) == []
    allocator = (find_allocator("auto") or ("system",))[0]  # what is installed here
    assert f"allocator: {allocator}" in config and "optim_state: bfloat16" in config
    assert "backend: gloo" in config and "staged: 'false'" in config and "bucket_mb: 32" in config


@pytest.mark.parametrize("override, message", [
    ("trainer.optim_state=float8", "trainer.optim_state=float8: use auto, float32 or bfloat16"),
    ("engine.dtype=fp8", "engine.dtype=fp8: use auto, bfloat16, float16 or float32"),
    ("weights.backend=mpi", "weights.backend=mpi: use auto, nccl, gloo or ipc"),
    ("engine.lm_head_fp32=maybe", "engine.lm_head_fp32=maybe: use auto, true or false"),
    ("launcher.allocator=mimalloc",
     "launcher.allocator=mimalloc: use auto, tcmalloc, jemalloc or system"),
    ("logging.wandb_mode=cloud", "logging.wandb_mode=cloud: use auto, online, offline or disabled"),
    ("rollout.batch_order=newest", "rollout.batch_order=newest: use finished or admission"),
    ("reward.judge.engine=sglang", "reward.judge.engine=sglang: use auto, hf or vllm"),
])
def test_a_value_outside_a_choice_names_the_valid_ones(override, message):
    with pytest.raises(ConfigError) as err:
        compose([override])
    assert str(err.value) == f"  - {message}"


def test_choices_keep_the_cli_syntax_and_a_bad_one_exits_2():
    cfg = compose(["trainer.optim_state=bfloat16", "weights.staged=True",
                   "engine.lm_head_fp32=false"])
    assert (cfg.trainer.optim_state, cfg.weights.staged, cfg.engine.lm_head_fp32) == ("bfloat16",
                                                                                      "true",
                                                                                      "false")
    out = subprocess.run([*AREAL, "train", "--dry-run", "trainer.optim_state=float8"],
                         capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert (out.returncode == 2
            and "trainer.optim_state=float8: use auto, float32 or bfloat16" in out.stderr)
    assert "Traceback" not in out.stderr


def test_a_config_file_with_a_bare_yaml_boolean_for_a_switch_is_told_to_quote_it(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(RootConfig()).replace("staged: auto", "staged: false"))
    with pytest.raises(ConfigError,
                       match=r"weights.staged=False: use auto, true or false \(in YAML quoted"):
        load_yaml(path, check=False)


def test_wandb_mode_follows_the_environment_where_the_run_is_planned(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a W&B key
    for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    assert resolve(RootConfig()).logging.wandb_mode == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve(RootConfig()).logging.wandb_mode == "online"
    monkeypatch.setenv("WANDB_MODE", "dryrun")  # the wandb client's old word for offline
    assert resolve(RootConfig()).logging.wandb_mode == "offline"
    monkeypatch.setenv("WANDB_MODE", "cloud")
    with pytest.raises(ValueError,
                       match="WANDB_MODE=cloud .*set WANDB_MODE to online, offline or disabled"):
        resolve(RootConfig())
    cfg = RootConfig()
    cfg.logging.wandb_mode = "disabled"
    # set in the config: the environment is not read
    assert resolve(cfg).logging.wandb_mode == "disabled"


def test_a_slurm_plan_resolves_for_the_nodes_gpus_not_the_login_nodes(tmp_path):
    from areal_cli.launcher.slurm import build

    def planned(*overrides):
        cfg = compose(["launcher=slurm", f"run_dir={tmp_path / 'run'}", *overrides])
        return build(cfg, python="/opt/venv/bin/python")[0].cfg

    gpu = planned("launcher.nodes=2", "launcher.gpus_per_node=8")
    assert (gpu.weights.backend, gpu.weights.staged, gpu.trainer.optim_state) == ("nccl", "true",
                                                                                  "float32")
    cpu = planned("launcher.nodes=2", "launcher.gpus_per_node=0")
    assert (cpu.weights.backend, cpu.weights.staged, cpu.trainer.optim_state) == ("gloo", "false",
                                                                                  "bfloat16")

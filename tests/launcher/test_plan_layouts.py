"""GPU layouts of `areal train` on the CPU: which GPUs each process gets, the weight-group ranks of
tensor-parallel vLLM workers, and the layouts whose counts do not add up (exit 2 with the fix)."""

from __future__ import annotations

import pytest

from areal_cli.config.resolve import Placement
from areal_cli.launcher.devices import device_map
from areal_cli.launcher.plan import make_plan
from areal_cli.runconfig.compose import compose


@pytest.fixture(autouse=True)
def _no_visible_devices_set(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # GPU ids are the cards' own here


def plan(tiny_model, tmp_path, gpus, *overrides):
    cfg = compose([f"model={tiny_model}", f"run_dir={tmp_path}", *overrides])
    return make_plan(cfg, gpus=gpus)


def env_of(p, name):
    return next(proc.env.get("CUDA_VISIBLE_DEVICES") for proc in p.procs if proc.name == name)


def test_one_tp2_vllm_worker_and_two_trainer_ranks_on_four_gpus(tiny_model, tmp_path):
    p = plan(tiny_model, tmp_path, [0, 1, 2, 3], "engine=vllm", "cluster.gpus=[0,1,2,3]",
             "engine.vllm.tensor_parallel_size=2", "rollout.workers=1", "trainer.ranks=2")
    assert p.devices == {"rollout": [0, 1], "trainer": [2, 3]}
    assert env_of(p, "rollout-0") == "0,1" and env_of(p, "trainer") == "2,3"
    assert p.cfg.engine.weight_update == "inplace"  # each TP rank's weight loaders keep its slice
    text = p.describe()
    assert "engine.weight_update=inplace" in text and "tensor_parallel_size=2" in text
    assert "one NCCL group of 3 ranks" in text and "rollout-0: ranks 1..2" in text


def test_two_tp1_workers_each_get_a_gpu_and_ranks_in_one_group(tiny_model, tmp_path):
    p = plan(tiny_model, tmp_path, [0, 1, 2, 3], "engine=vllm", "rollout.workers=2",
             "trainer.ranks=2")
    assert p.devices == {"rollout": [0, 1], "trainer": [2, 3]}
    assert [env_of(p, "rollout-0"), env_of(p, "rollout-1")] == ["0", "1"]
    assert p.cfg.engine.weight_update == "inplace"  # a Llama at TP 1
    text = p.describe()
    assert "one NCCL group of 3 ranks" in text and "rollout-1: rank 2" in text


def test_two_tp2_workers_leave_the_trainer_the_rest(tiny_model, tmp_path):
    p = plan(tiny_model, tmp_path, list(range(8)), "engine=vllm",
             "engine.vllm.tensor_parallel_size=2", "rollout.workers=2", "trainer.ranks=4")
    assert p.devices == {"rollout": [0, 1, 2, 3], "trainer": [4, 5, 6, 7]}
    assert [env_of(p, "rollout-0"), env_of(p, "rollout-1")] == ["0,1", "2,3"]
    assert "one NCCL group of 5 ranks" in p.describe() and "rollout-1: ranks 3..4" in p.describe()


def test_gpu_ids_count_among_the_gpus_this_process_was_given(tiny_model, tmp_path, monkeypatch):
    # under CUDA_VISIBLE_DEVICES=4,5,6,7 (a scheduler's allocation) GPU 0 of the run is card 4,
    # never card 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    p = plan(tiny_model, tmp_path, [0, 1, 2, 3], "engine=vllm", "rollout.workers=2",
             "trainer.ranks=2")
    assert p.devices == {"rollout": [0, 1], "trainer": [2, 3]}
    assert [env_of(p, "rollout-0"), env_of(p, "rollout-1"), env_of(p, "trainer")] == ["4", "5",
                                                                                      "6,7"]


def test_gpus_no_process_uses_are_shown_idle(tiny_model, tmp_path):
    p = plan(tiny_model, tmp_path, [0, 1, 2, 3], "engine=vllm")
    assert p.devices == {"rollout": [0], "trainer": [1], "idle": [2, 3]}
    assert "idle: GPU 2,3  (raise trainer.ranks or rollout.workers" in p.describe()


def test_explicit_gpu_lists_with_tensor_parallel_workers(tiny_model, tmp_path):
    p = plan(tiny_model, tmp_path, [0, 1, 2, 3], "engine=vllm", "rollout.gpus=[2,3]",
             "trainer.gpus=[0]",
             "engine.vllm.tensor_parallel_size=2")
    assert p.devices == {"rollout": [2, 3], "trainer": [0], "idle": [1]}
    assert env_of(p, "rollout-0") == "2,3"


@pytest.mark.parametrize("overrides,fix", [
    (["engine.vllm.tensor_parallel_size=2", "rollout.workers=2"], "leave none of the 4 GPUs"),
    (["engine.vllm.tensor_parallel_size=2", "trainer.ranks=4"],
     "trainer.ranks=4 but only 2 GPU(s)"),
    (["engine.vllm.tensor_parallel_size=2", "rollout.gpus=[0,1]", "rollout.workers=2",
      "trainer.gpus=[2,3]"],
     "needs 4 generation GPUs; rollout.gpus has 2"),
    (["engine=hf", "engine.vllm.tensor_parallel_size=2"], "only with engine=vllm"),
])
def test_layouts_that_do_not_add_up_name_the_fix(overrides, fix):
    cfg = compose(["engine=vllm", "cluster.gpus=[0,1,2,3]", *overrides])
    with pytest.raises(ValueError, match=fix.replace("(", r"\(").replace(")", r"\)")):
        device_map(cfg, gpus=[0, 1, 2, 3])


def test_one_gpu_cannot_hold_a_tp2_worker():
    cfg = compose(["engine=vllm", "engine.vllm.tensor_parallel_size=2", "cluster.gpus=[0]"])
    with pytest.raises(ValueError, match="needs 2 GPUs per rollout worker"):
        device_map(cfg, gpus=[0])


def test_tp2_layout_exits_2_at_the_cli_when_it_does_not_fit(tmp_path):
    """On this CPU machine no GPU is visible: the GPU ids themselves are refused first, exit 2."""
    import subprocess

    from conftest import AREAL, ROOT

    proc = subprocess.run(AREAL
                          + ["train", "engine=vllm", "cluster.gpus=[0,1,2,3]",
                             "engine.vllm.tensor_parallel_size=2",
                                   "--dry-run"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2 and "do not exist here" in proc.stderr


def test_dry_run_shows_the_drawn_lengths_and_refuses_an_unknown_profile(tiny_model, tmp_path):
    p = plan(tiny_model, tmp_path, [], "rollout.length_profile=arithmetic_long",
             "rollout.max_new_tokens=8192")
    assert "p10 160, p50 848, p90 3264 of rollout.max_new_tokens=8192), EOS ignored" in p.describe()
    with pytest.raises(ValueError, match="rollout.length_profile=nope: neither a built-in"):
        plan(tiny_model, tmp_path, [], "rollout.length_profile=nope")


def test_a_judge_reward_plans_the_reward_model_process(tiny_model, tiny_reward_model, tmp_path):
    p = plan(tiny_model, tmp_path, [0, 1, 2], "engine=vllm", "reward.fn=[auto,judge,model]",
             "reward.weights=[1,0.5,2]", f"reward.model.path={tiny_reward_model}",
             "reward.gpus=[2]")
    names = [proc.name for proc in p.procs]
    assert names[:2] == ["controller", "reward-model"] and p.devices["reward"] == [2]
    assert "idle" not in p.devices  # GPU 2 is the reward model's
    assert env_of(p, "reward-model") == "2"
    text = p.describe()
    assert "reward = 1·auto + 0.5·judge + 2·model" in text and "areal_cli.rewards.server" in text
    # auto: GPU 2, engine=vllm
    assert "reward.judge.engine=vllm: a vllm.LLM on GPU 2, 80% of its memory" in text
    on_cpu = plan(tiny_model, tmp_path / "cpu", [], "reward.fn=judge", "eval.at_end=false")
    assert env_of(on_cpu, "reward-model") == "" and on_cpu.devices["reward"] == []
    assert "reward.judge.engine=hf: transformers on the CPU" in on_cpu.describe()
    with pytest.raises(ValueError, match=r"reward.gpus=\[5\]"):
        plan(tiny_model, tmp_path / "bad", [0, 1], "reward.fn=judge", "eval.at_end=false",
             "reward.gpus=[5]")


def test_the_plan_says_what_activation_checkpointing_auto_chose(tiny_model, tmp_path):
    """A trainer on GPUs of known memory: the choice and its estimate in the plan's memory lines
    (the tiny model fits any card whole); a plan for other nodes (memory unknown) says so and
    checkpoints every layer."""
    cfg = compose([f"model={tiny_model}", f"run_dir={tmp_path / 'run'}", "engine=vllm"])
    plan = make_plan(cfg, gpus=[],
                     placement=Placement(trainer_gpu=True, gpu_memory_bytes=80 * 10**9))
    assert plan.cfg.trainer.activation_checkpointing == "false"
    assert any("activation checkpointing none (auto: ~" in n and "of 75 GiB" in n
               for n in plan.notes["memory"])
    unknown = make_plan(cfg, gpus=[], placement=Placement(trainer_gpu=True))
    assert unknown.cfg.trainer.activation_checkpointing == "true"
    assert any("every layer (auto: the card or the model's layout is not known here)" in n
               for n in unknown.notes["memory"])
    assert "activation checkpointing" in unknown.describe()


def test_vllm_shares_one_gpu_with_the_trainer_through_cuda_ipc(tiny_model, tmp_path):
    p = plan(tiny_model, tmp_path, [0], "engine=vllm")
    assert p.devices == {"rollout": [0], "trainer": [0]}
    assert env_of(p, "rollout-0") == env_of(p, "trainer") == "0"
    w = p.cfg.weights
    # device to device, staged on the trainer, 1 GiB buckets; in place through vLLM's loaders
    assert (w.backend, w.staged, w.bucket_mb) == ("ipc", "true", 1024)
    assert p.cfg.engine.weight_update == "inplace"


@pytest.mark.parametrize(("overrides", "fix"), [
    (["engine.weight_update=reload"], "engine.weight_update=inplace"),
    (["weights.backend=nccl"], "NCCL refuses two ranks on one GPU"),
])
def test_one_gpu_layouts_that_cannot_move_weights_name_the_fix(tiny_model, tmp_path, overrides,
                                                               fix):
    with pytest.raises(ValueError, match=fix):
        plan(tiny_model, tmp_path, [0], "engine=vllm", *overrides)


def test_ipc_is_refused_where_no_process_shares_trainer_rank0s_gpu(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="weights.backend=ipc joins processes of one GPU"):
        plan(tiny_model, tmp_path, [0, 1], "engine=vllm", "weights.backend=ipc")
    with pytest.raises(ValueError, match="the trainer and the rollout workers must share it"):
        plan(tiny_model, tmp_path, [], "weights.backend=ipc")


def test_a_worker_beside_rank0_and_one_on_another_gpu_cannot_share_one_weight_group(tiny_model,
                                                                                    tmp_path):
    with pytest.raises(ValueError, match=r"rollout worker\(s\) \[1\] are on other GPUs"):
        plan(tiny_model, tmp_path, [0, 1], "engine=vllm", "rollout.workers=2",
             "rollout.gpus=[0,1]", "trainer.gpus=[0]")


GIB = 1 << 30


def shared_plan(model, tmp_path, card_gib, *overrides):
    """The share notes of a one-GPU vLLM plan on a card of ``card_gib`` GiB, for ``model``."""
    from areal_cli.engines import spec
    from areal_cli.launcher.share import choose_share, share_notes
    from areal_cli.runconfig.autos import resolve

    cfg = compose([f"model={model}", f"run_dir={tmp_path}", "engine=vllm", *overrides])
    card = spec("vllm").shared_card(cfg, card_gib * GIB, model)
    where = Placement(trainer_gpu=True, rollout_gpu=True, shared_gpu=True, gpu_memory_bytes=card,
                      model_path=model)
    out, where = choose_share(cfg, resolve(cfg, where), where, card_gib * GIB)
    return share_notes(out, where, card_gib * GIB, 0)


def test_auto_alternates_where_the_trainer_fits_only_while_the_engine_sleeps(tmp_path):
    model = layout_dir(tmp_path, hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)  # 7B
    text = "\n".join(shared_plan(model, tmp_path, 140, "engine.gpu_memory_utilization=0.5",
                                 "trainer.optim_state=bfloat16"))
    assert "alternate: vllm sleeps while the trainer steps" in text, text
    assert "of the 136.0 GiB while it sleeps" in text and "staging" not in text
    # it wakes beside the weights and bfloat16 moments (~57 GiB), not the staged copy's 14 more
    assert "wakes beside the trainer's ~60.7 GiB kept between steps" in text, text
    # float32 moments: ~85 GiB kept, and 0.5 of the card no longer fits beside it when it wakes
    with pytest.raises(ValueError) as err:
        shared_plan(model, tmp_path, 140, "engine.gpu_memory_utilization=0.5")
    msg = str(err.value)
    assert "do not fit on GPU 0 when vllm wakes for an update" in msg
    assert "lower engine.gpu_memory_utilization to 0.36 or less (now 0.5)" in msg, msg
    text = "\n".join(shared_plan(model, tmp_path, 140, "engine.gpu_memory_utilization=0.35"))
    assert "alternate" in text
    # the 1.5B layout fits beside it: concurrent, staged
    small = layout_dir(tmp_path)
    text = "\n".join(shared_plan(small, tmp_path, 140, "engine.gpu_memory_utilization=0.5"))
    assert "concurrent" in text and "behind generation" in text


def layout_dir(tmp_path, **sizes):
    """A model directory holding only the config.json of a Qwen2 layout (the planner reads no
    weights)."""
    import json

    d = tmp_path / "layout"
    d.mkdir(exist_ok=True)
    config = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=1536,
                  intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    (d / "config.json").write_text(json.dumps({**config, **sizes}))
    return d


def test_the_shared_gpu_plan_prints_each_share_and_the_staging_copy(tmp_path):
    model = layout_dir(tmp_path)  # Qwen2.5-1.5B's layout: ~1.5e9 parameters
    lines = shared_plan(model, tmp_path, 140, "engine.gpu_memory_utilization=0.4")
    text = "\n".join(lines)
    assert ("GPU 0 (140 GiB) shared by trainer rank 0 and rollout-0 (engine=vllm), concurrent"
            in text)
    # 0.4 of the card (56 GiB), and the staging copy in bfloat16 (~2.9 GiB) + two 1-GiB buckets
    assert "vllm: 60.9 GiB awake (engine.gpu_memory_utilization=0.4" in text, text
    assert "and 4.9 GiB beside it to receive each update behind generation" in text
    assert "trainer rank 0: ~" in text and "of the 79.1 GiB left" in text, text


def test_a_shared_gpu_plan_that_cannot_fit_names_what_to_lower(tmp_path):
    model = layout_dir(tmp_path, hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)  # 7B
    with pytest.raises(ValueError) as err:  # concurrent asked: its fixes, alternate among them
        shared_plan(model, tmp_path, 80, "engine.gpu_memory_utilization=0.5",
                    "cluster.share=concurrent")
    msg = str(err.value)
    assert "do not fit on GPU 0 together" in msg
    for fix in ("engine.gpu_memory_utilization (now 0.5)", "trainer.micro_batch_tokens",
                "cluster.share=alternate", "trainer.optim_state=bfloat16", "trainer.lora.rank=16"):
        assert fix in msg
    with pytest.raises(ValueError) as err:  # auto: alternate tried too, and the 7B does not fit
        shared_plan(model, tmp_path, 80, "engine.gpu_memory_utilization=0.5")
    msg = str(err.value)
    assert "alternate: vllm sleeps while the trainer steps" in msg
    assert "of the 76.0 GiB while it sleeps" in msg
    assert "engine.gpu_memory_utilization" not in msg.split("lower ")[1]  # asleep, it holds 4 GiB
    # a LoRA adapter on a 140-GiB card: the frozen weights, vLLM's share and both staging copies
    text = "\n".join(shared_plan(model, tmp_path, 140, "engine.gpu_memory_utilization=0.3",
                                 "trainer.lora.rank=16"))
    assert "of the 81.8 GiB left" in text, text


def test_the_defaults_follow_the_hardware_where_none_is_named():
    from areal_cli.launcher.plan import hardware_defaults

    # the CPU: conf/'s defaults (hf, 4 groups, 30 steps) stand, and nothing is said
    assert hardware_defaults(compose([]), []) == ([], [])
    # Slurm (the GPUs are on the nodes): left as composed
    assert hardware_defaults(compose(["launcher=slurm", "cluster.gpus=[0]"]), []) == ([], [])
    # GPUs without vLLM (this machine): hf, and why with the install command; GPU-sized steps
    extra, lines = hardware_defaults(compose(["cluster.gpus=[0]"]), [])
    assert extra == ["trainer.batch_size=16", "trainer.steps=50"]
    assert "engine=hf (auto: GPU(s) [0] here but vLLM is not installed" in lines[0]
    assert "pip install 'areal-cli[vllm]'" in lines[0]
    # a split smaller than 16 problems: a step draws distinct prompts
    assert hardware_defaults(compose(["cluster.gpus=[0]", "task.size=8"]), [])[0][0] == (
        "trainer.batch_size=8")
    # what the user named stays; vLLM named on one GPU: staleness 1 unless named too
    overrides = ["cluster.gpus=[0]", "engine=vllm", "trainer.steps=7"]
    extra, lines = hardware_defaults(compose(overrides), overrides)
    assert extra == ["trainer.batch_size=16", "rollout.max_staleness=1"]
    overrides += ["rollout.max_staleness=3"]
    assert hardware_defaults(compose(overrides), overrides)[0] == ["trainer.batch_size=16"]
    # vLLM on two GPUs: generation and training on cards of their own, staleness as configured
    overrides = ["cluster.gpus=[0,1]", "engine=vllm"]
    assert "rollout.max_staleness=1" not in hardware_defaults(compose(overrides), overrides)[0]

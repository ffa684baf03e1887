"""A tiny mixture-of-experts run for real (every process, gloo, ZeroMQ on loopback): 3 steps with
routing replay and its probe, the load-balancing loss and logp_gap_fresh in every step's metrics,
a final checkpoint of the same layout; and the architecture check that admits the MoE layouts areal
knows and refuses the others with the reason."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_RUN, read_jsonl, run_train, tiny_moe
from transformers import AutoConfig

from areal_cli.architectures import MOE, ModelError, check_supported
from areal_cli.rundir import RunDir


@pytest.mark.slow  # ~40 s on 2 cores
def test_tiny_moe_trains_three_steps(tmp_path):
    model = tiny_moe(tmp_path / "model")
    run = tmp_path / "run"
    # every row trains (the random model's rewards are all 0): the step forwards fresh tokens
    run_train(run, f"model={model}", *TINY_RUN, "trainer.steps=3",
              "trainer.skip_zero_advantage=false", "rollout.max_staleness=0",
              "algorithm.routing_probe=true", timeout=400)
    rd = RunDir(run)
    rows = read_jsonl(rd.metrics)
    assert len(rows) == 3
    for row in rows:
        assert 1.5 < row["router_aux_loss"] < 8  # top-2 of 8: 2 when balanced
        assert row["logp_gap_fresh"] < 1e-3 and row["fresh_tokens"] > 0
        # the same float32 weights on both sides: the trainer's routers choose the engine's experts
        assert row["routing_flip_fraction"] == 0 and row["logp_gap_fresh_free"] < 1e-3
    saved = AutoConfig.from_pretrained(rd.final)
    assert saved.model_type == "qwen3_moe" and saved.num_experts == 8


@pytest.mark.parametrize("kind", list(MOE))
def test_known_moe_layouts_are_admitted(kind, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": kind, "architectures": [MOE[kind]], "num_experts": 8}))
    check_supported(tmp_path, "model=x")


def test_an_unknown_moe_layout_is_refused_with_the_reason(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
         "n_routed_experts": 64}))
    with pytest.raises(ModelError, match="mixture-of-experts layout areal does not know.*"
                                         "qwen3_moe, qwen2_moe, olmoe, mixtral"):
        check_supported(tmp_path, "model=x")


@pytest.mark.slow  # ~45 s on 2 cores
def test_lora_on_the_experts_under_two_fsdp2_ranks_reaches_both_workers_merged(tmp_path):
    """trainer.lora.target_experts on two FSDP2 trainer ranks (gloo): every update, the adapters
    merged per expert, reaches both hf workers bit-exact (weights.verify hashes both ends); the
    final adapter names the experts' weights as peft does, and its experts' adapters trained."""
    from safetensors.torch import load_file

    model = tiny_moe(tmp_path / "model")
    run = tmp_path / "run"
    run_train(run, f"model={model}", *TINY_RUN, "trainer.steps=2", "trainer.ranks=2",
              "rollout.workers=2", "weights.verify=true", "trainer.lora.rank=4",
              "trainer.lora.alpha=8", "trainer.lr=1e-2", "trainer.lora.target_experts=true",
              "trainer.skip_zero_advantage=false", "rollout.max_staleness=0", timeout=400)
    rd = RunDir(run)
    sent = {m["version"]: m["weights_sha"] for m in read_jsonl(rd.metrics)}
    loaded = read_jsonl(run / "weight_updates.jsonl")
    assert {u["worker"] for u in loaded} == {"rollout-0", "rollout-1"} and len(loaded) == 4
    assert all(u["weights_sha"] == sent[u["version"]] for u in loaded)
    adapter = rd.final / "adapter"
    conf = json.loads((adapter / "adapter_config.json").read_text())
    assert conf["target_parameters"] == ["experts.gate_up_proj", "experts.down_proj"]
    tensors = load_file(adapter / "adapter_model.safetensors")
    experts_b = {n: t for n, t in tensors.items() if ".experts." in n and ".lora_B." in n}
    assert len(experts_b) == 4
    # B starts at 0. The random model earns no reward, so only the load-balancing loss trains:
    # through layer 1's router it reaches layer 0's experts (layer 1's reach no later router)
    assert all(t.abs().max() > 0 for n, t in experts_b.items() if ".layers.0." in n)

"""LoRA on a mixture of experts' routed experts (trainer.lora.target_experts): peft's parameter
wrappers on each layer's 3D expert weights; the merge areal sends and saves against the adapted
model's own forward and peft's own delta; training, activation recomputation and two FSDP2 ranks;
the checkpoint peft loads; the config checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import MOE_CONFIGS, tiny_moe
from transformers import AutoModelForCausalLM

from areal_cli import lora, moe
from areal_cli.config.schema import LoraConfig
from areal_cli.runtime import exit_now
from areal_cli.trainer.model import build_policy, full_parameters, save_hf
from tests.trainer.helpers import config, init_gloo, make_batch, plain_model, step_runner

CPU = torch.device("cpu")
LO = LoraConfig(rank=4, alpha=8, target_experts=True)
IDS = torch.tensor([[5, 17, 300, 42, 7, 99, 1000, 3]])


def _randomise(model) -> None:
    torch.manual_seed(3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if lora.is_adapter(n):
                p.normal_(0, 0.1)


@pytest.mark.parametrize("kind", list(MOE_CONFIGS))
def test_merged_experts_give_the_adapted_forward_and_peft_delta(kind, tmp_path):
    init_gloo()
    src = tiny_moe(tmp_path / kind, kind)
    adapted = build_policy(src, CPU, torch.float32, False, lora=LO, shard=False)
    _randomise(adapted)
    names = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert any(".mlp.experts." in n for n in names) and all(lora.is_adapter(n) for n in names)
    merged = dict(lora.merged_items(adapted.named_parameters(), lora.scale(LO)))
    plain = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32,
                                                 **moe.load_kwargs(src))
    assert list(merged) == [n for n, _ in plain.named_parameters()]
    missing, unexpected = plain.load_state_dict(merged, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    # peft's own delta of every expert weight: the same merged tensor
    for name, m in adapted.named_modules():
        if type(m).__name__ == "ParamWrapper":
            key = f"{lora.clean_name(name).replace('.base_layer', '')}.{m.parameter_name}"
            w0 = m.get_param().detach()
            torch.testing.assert_close(merged[key], w0 + m.get_delta_weight(lora.ADAPTER))
            assert not torch.equal(merged[key], w0)
    adapted.eval(), plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=IDS).logits, adapted(input_ids=IDS).logits,
                                   atol=1e-5, rtol=1e-5)
    # the merged update's layout: the plain model's names and shapes
    cfg = config(f"model={src}", "trainer.lora.rank=4", "trainer.lora.target_experts=true")
    assert cfg.engine.lora_merge == "true"  # the hf engine's auto would take the adapter
    assert [(s.name, s.shape) for s in lora.update_specs(adapted, cfg)] == [
        (n, tuple(p.shape)) for n, p in plain.named_parameters()]


def test_expert_adapters_train_the_same_with_activation_recompute(tiny_moe_model):
    init_gloo()
    over = ("trainer.lora.rank=4", "trainer.lora.target_experts=true", "trainer.lr=1e-2",
            "rollout.group_size=2")
    batch = make_batch(plain_model(tiny_moe_model), groups=2, group_size=2, seed=1)
    after = []
    for checkpointing in (False, True):
        runner = step_runner(tiny_moe_model, *over, checkpointing=checkpointing)
        before = {n: p.detach().clone() for n, p in runner.model.named_parameters()}
        runner.train(batch, version=0)
        now = {n: p.detach().clone() for n, p in runner.model.named_parameters()}
        experts = [n for n in now if ".experts." in n and ".lora_B." in n]
        assert len(experts) == 4 and all(not torch.equal(now[n], before[n]) for n in experts)
        frozen = [n for n in now if not lora.is_adapter(n)]
        assert all(torch.equal(now[n], before[n]) for n in frozen)  # experts' W0, routers too
        after.append(now)
    for n in after[0]:
        torch.testing.assert_close(after[1][n], after[0][n], atol=1e-6, rtol=1e-5)


def _grads(model) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.fill_(0.01)  # uniform: the same on a shard as on the whole tensor
    logits = model(input_ids=IDS).logits.float()
    torch.log_softmax(logits, -1)[0, :-1].gather(-1, IDS[0, 1:, None]).sum().backward()
    out = {}
    for n, p in model.named_parameters():
        if p.requires_grad:
            g = p.grad
            out[lora.clean_name(n)] = (g.full_tensor() if hasattr(g, "full_tensor") else g).clone()
    return out


def _two_ranks(rank: int, init: str, model: str, out: str) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1]))
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.manual_seed(0)
    sharded = build_policy(Path(model), CPU, torch.float32, False, lora=LO)
    grads = _grads(sharded)
    merged = dict(lora.merged_items(full_parameters(sharded), lora.scale(LO)))
    if rank == 0:
        torch.save({"grads": grads, "merged": merged}, out)
    dist.destroy_process_group()
    exit_now(0)  # as every areal process ends: no interpreter teardown beside a gloo thread


def test_two_fsdp2_ranks_give_the_one_rank_gradients_and_merge(tiny_moe_model, tmp_path):
    """The experts' wrappers put a parametrization on a parameter FSDP2 all-gathers for the
    forward and frees after it: the adapters' gradients and the merged weights gathered from two
    shards equal one unsharded rank's."""
    out = tmp_path / "rank0.pt"
    mp.spawn(_two_ranks, args=(f"file://{tmp_path / 'store'}", str(tiny_moe_model), str(out)),
             nprocs=2, join=True)
    got = torch.load(out)
    init_gloo()
    torch.manual_seed(0)
    one = build_policy(tiny_moe_model, CPU, torch.float32, False, lora=LO, shard=False)
    want = _grads(one)
    assert set(got["grads"]) == set(want) and any(".experts." in n for n in want)
    for n in want:
        assert want[n].abs().max() > 0, n
        torch.testing.assert_close(got["grads"][n], want[n], atol=1e-5, rtol=1e-4)
    merged = dict(lora.merged_items(one.named_parameters(), lora.scale(LO)))
    for n in merged:
        torch.testing.assert_close(got["merged"][n], merged[n], atol=1e-6, rtol=1e-6)


def test_the_saved_experts_adapter_loads_in_peft_and_the_merged_checkpoint_in_transformers(
        tmp_path):
    from peft import PeftModel

    init_gloo()
    src = tiny_moe(tmp_path / "src", "olmoe")
    adapted = build_policy(src, CPU, torch.float32, False, lora=LO, shard=False)
    _randomise(adapted)
    adapted.eval()
    with torch.no_grad():
        want = adapted(input_ids=IDS).logits
    save_hf(adapted, src, tmp_path / "final", lora=LO, shard_bytes=64 << 10)
    conf = json.loads((tmp_path / "final" / "adapter" / "adapter_config.json").read_text())
    assert conf["target_parameters"] == ["experts.gate_up_proj", "experts.down_proj"]
    assert "experts" not in conf["target_modules"] and "base_layer" not in conf["target_modules"]
    base = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, tmp_path / "final" / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final", dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=IDS).logits, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(merged(input_ids=IDS).logits, want, atol=1e-4, rtol=1e-4)


def test_expert_adapter_checks(tiny_model, tiny_moe_model):
    from areal_cli.config.read import ConfigError
    from areal_cli.runconfig.compose import compose

    assert lora.check_model(tiny_moe_model, LO) == []
    assert "no routed experts" in lora.check_model(tiny_model, LO)[0]
    assert "smallest dimension" in lora.check_model(
        tiny_moe_model, LoraConfig(rank=40, target_experts=True))[0]
    small = lora.adapter_size(tiny_moe_model, LoraConfig(rank=4))
    # 2 layers × 8 experts × rank 4 × ((64 + 64) + (64 + 32)) float32 more
    assert lora.adapter_size(tiny_moe_model, LO) - small == 4 * 2 * 8 * 4 * (128 + 96)
    with pytest.raises(ConfigError, match="trainer.lora.dropout=0"):
        compose([f"model={tiny_moe_model}", "trainer.lora.rank=4",
                 "trainer.lora.target_experts=true", "trainer.lora.dropout=0.1"])
    with pytest.raises(ConfigError, match="engine.lora_merge=auto"):
        compose([f"model={tiny_moe_model}", "trainer.lora.rank=4",
                 "trainer.lora.target_experts=true", "engine.lora_merge=false"])


def test_a_resume_keeps_the_experts_adapter_exactly_and_refuses_the_other_choice(
        tiny_moe_model, tmp_path):
    from areal_cli.checkpoint_dirs import MARKER, marker_text
    from areal_cli.launcher.preflight import lora_problems
    from areal_cli.runconfig.compose import compose
    from areal_cli.rundir import RunDir
    from areal_cli.trainer import checkpoint

    init_gloo()
    over = ("trainer.lora.rank=4", "trainer.lora.target_experts=true", "trainer.lr=1e-2",
            "rollout.group_size=2")
    a = step_runner(tiny_moe_model, *over)
    a.train(make_batch(plain_model(tiny_moe_model), groups=2, group_size=2, seed=1), version=0)
    run = tmp_path / "run"
    ckpt = RunDir(run).checkpoint(1)
    checkpoint.save(a, 1, ckpt)
    (ckpt / "controller.json").write_text("{}")
    (ckpt / MARKER).write_text(marker_text(1))
    b = step_runner(tiny_moe_model, *over)  # a fresh run: new random A
    assert checkpoint.load(b, ckpt) == 1
    got = dict(b.model.named_parameters())
    for n, p in a.model.named_parameters():
        if lora.is_adapter(n):
            assert torch.equal(p, got[n]), n
    same = compose([f"model={tiny_moe_model}", *over[:2]])
    other = compose([f"model={tiny_moe_model}", "trainer.lora.rank=4"])
    same.resume = other.resume = str(run)
    assert lora_problems(same, tiny_moe_model) == []
    assert "resume with trainer.lora.target_experts=true" in lora_problems(other,
                                                                          tiny_moe_model)[0]

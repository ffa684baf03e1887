"""LoRA under FSDP2 on a GPU keeps the frozen matmul weights in the compute dtype (bfloat16) beside
float32 adapters, and a bfloat16 checkpoint loads straight onto the card: the forward equals full
fine-tuning's (whose float32 weights FSDP casts to bfloat16 for every forward; the adapters add
exactly zero before the first step), and a backward reaches the adapters. The default model
(dense) and a tiny Qwen3-MoE (fused experts)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from conftest import tiny_moe

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _bf16_copy(src, out):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


@pytest.mark.parametrize("kind", ["dense", "qwen3_moe"])
def test_lora_frozen_weights_in_bfloat16_under_fsdp(kind, tmp_path):
    from areal_cli.config.schema import LoraConfig
    from areal_cli.model_source import resolve_model
    from areal_cli.trainer.model import build_policy, checkpoint_dtype

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    src = resolve_model("smollm2-135m-instruct") if kind == "dense" else tiny_moe(
        tmp_path / "moe", kind)
    path = _bf16_copy(src, tmp_path / "bf16")
    assert checkpoint_dtype(path) == torch.bfloat16
    device = torch.device("cuda", 0)
    ids = torch.randint(100, 10000, (2, 96), device=device)
    full = build_policy(path, device, torch.bfloat16, activation_checkpointing=False)
    with torch.no_grad():
        want = full(input_ids=ids).logits.float()
    del full
    torch.cuda.empty_cache()
    model = build_policy(path, device, torch.bfloat16, activation_checkpointing=False,
                         lora=LoraConfig(rank=8))
    frozen = {n: _local(p).dtype for n, p in model.named_parameters() if not p.requires_grad}
    trainable = {n: _local(p).dtype for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and set(trainable.values()) == {torch.float32}
    half = [n for n in frozen if n.endswith("base_layer.weight") or ".mlp.experts." in n]
    assert half and all(frozen[n] == torch.bfloat16 for n in half), frozen
    held = sum(_local(p).nbytes for p in model.parameters()) / 2**20
    print(f"{kind}: the LoRA model's parameters {held:.1f} MiB; {len(half)} frozen matmul "
          "weights in bfloat16")
    got = model(input_ids=ids).logits.float()
    diff = (got - want).abs()
    print(f"{kind}: logits against full fine-tuning's: max {diff.max():.3e}, "
          f"{(diff > 0).float().mean():.2%} differ")
    # the adapters add zero and the same bfloat16 weights compute: equal but for a rare rounding
    assert float((diff > 0).float().mean()) < 0.01
    loss = torch.log_softmax(got[:, :-1], -1).gather(-1, ids[:, 1:, None]).mean()
    loss.backward()
    grads = [_local(p.grad) for n, p in model.named_parameters() if "lora_B" in n]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)

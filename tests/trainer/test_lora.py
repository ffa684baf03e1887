"""LoRA in the trainer: only the adapters train and hold optimizer state; a checkpoint holds the adapter
and its optimizer, and a resume restores both exactly; the final checkpoint is a merged model that
``from_pretrained`` loads and that computes what the adapted model computes."""

from __future__ import annotations

import torch

from areal_cli.lora import saved_rank
from areal_cli.trainer import checkpoint
from areal_cli.trainer.model import save_hf
from tests.trainer.helpers import init_gloo, make_batch, plain_model, step_runner

LORA = ("trainer.lora.rank=4", "trainer.lora.alpha=8", "trainer.lr=1e-2", "trainer.optim_state=float32",
        "algorithm.ppo_epochs=1")


def _adapter(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_only_adapters_train_and_hold_optimizer_state(tiny_model):
    init_gloo()
    runner = step_runner(tiny_model, *LORA)
    base = {n: p.detach().clone() for n, p in runner.model.named_parameters() if "lora_" not in n}
    before = _adapter(runner.model)
    runner.train(make_batch(plain_model(tiny_model), 2, 4), version=0)
    after = _adapter(runner.model)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_B" in n), "B did not move"
    for n, p in runner.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base[n]), f"frozen {n} changed"
    owned = {id(p) for p in runner.opt.state}
    adapters = {id(p) for n, p in runner.model.named_parameters() if "lora_" in n}
    assert owned == adapters  # AdamW moments exist for the adapters and nothing else
    assert len(before) == 2 * 7 * 2  # A and B of 7 projections in each of 2 layers


def test_resume_restores_adapter_and_optimizer_exactly(tiny_model, tmp_path):
    init_gloo()
    a = step_runner(tiny_model, *LORA)
    model = plain_model(tiny_model)
    a.train(make_batch(model, 2, 4, seed=1), version=0)
    checkpoint.save(a, 1, tmp_path / "ckpt")
    assert saved_rank(tmp_path / "ckpt" / "adapter") == 4
    b = step_runner(tiny_model, *LORA)  # a fresh run: new random A
    assert checkpoint.load(b, tmp_path / "ckpt") == 1
    for (n, pa), (_, pb) in zip(_adapter(a.model).items(), _adapter(b.model).items(), strict=True):
        assert torch.equal(pa, pb), n
    sa, sb = a.opt.state_dict()["state"], b.opt.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[k][name], sb[k][name]), (k, name)
    # the next step is the same on both
    batch = make_batch(model, 2, 4, seed=2)
    a.train(batch, version=1)
    b.train(batch, version=1)
    for (n, pa), (_, pb) in zip(_adapter(a.model).items(), _adapter(b.model).items(), strict=True):
        assert torch.equal(pa, pb), n


def test_final_checkpoint_is_the_merged_model(tiny_model, tmp_path):
    init_gloo()
    runner = step_runner(tiny_model, *LORA)
    runner.train(make_batch(plain_model(tiny_model), 2, 4), version=0)
    save_hf(runner.model, tiny_model, tmp_path / "final", lora=runner.cfg.trainer.lora)
    merged = plain_model(tmp_path / "final")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    ids = torch.tensor([[5, 17, 300, 42, 7, 99]])
    runner.model.eval()
    with torch.no_grad():
        want = runner.model(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        base = plain_model(tiny_model)(input_ids=ids).logits
    assert (got - base).abs().max() > 1e-3  # the adapter changed the model
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert saved_rank(tmp_path / "final" / "adapter") == 4


def test_frozen_linear_weights_in_the_compute_dtype_compute_the_same(tiny_model):
    """One CPU rank with LoRA keeps the frozen linear weights in bf16 (autocast cast them to bf16 for each
    matmul anyway); the embedding, the norms and the adapters stay float32; the logits are the same."""
    from areal_cli.config.schema import LoraConfig
    from areal_cli.trainer.batching import autocast
    from areal_cli.trainer.model import build_policy

    init_gloo()
    lo = LoraConfig(rank=4)
    torch.manual_seed(0)
    lean = build_policy(tiny_model, torch.device("cpu"), torch.bfloat16, False, lora=lo)
    torch.manual_seed(0)
    full = build_policy(tiny_model, torch.device("cpu"), torch.float32, False, lora=lo)
    dtypes = {n: p.dtype for n, p in lean.named_parameters()}
    assert dtypes["model.layers.0.self_attn.q_proj.base_layer.weight"] == torch.bfloat16
    assert dtypes["model.layers.0.mlp.down_proj.base_layer.weight"] == torch.bfloat16
    assert dtypes["model.embed_tokens.weight"] == dtypes["model.norm.weight"] == torch.float32
    assert all(dtypes[n] == torch.float32 for n in dtypes if "lora_" in n)
    with torch.no_grad():
        for (n, a), (_, b) in zip(lean.named_parameters(), full.named_parameters(), strict=True):
            if "lora_B" in n:
                a.normal_(std=0.1)
                b.copy_(a)
    ids = torch.tensor([[5, 17, 300, 42, 7, 99, 1000, 3]])
    with torch.no_grad(), autocast(ids.device, torch.bfloat16):
        assert torch.equal(lean(input_ids=ids).logits, full(input_ids=ids).logits)


def test_mfu_counts_four_flops_a_frozen_weight_and_token():
    """With LoRA the frozen weights' matmuls cost forward 2 + input gradient 2 = 4 FLOPs a weight and
    token (no weight gradient); attention scores (no weights) keep their 6 × 2 · d per pair."""
    from transformers import AutoConfig

    from areal_cli.model_source import resolve_model
    from areal_cli.trainer.metrics import MFU, flop_terms

    config = AutoConfig.from_pretrained(resolve_model("smollm2-135m-instruct"))
    body, attention, head = flop_terms(config)
    lean = MFU(config, torch.device("cpu"), 0.0, 1, frozen=True).terms
    assert lean == (body * 4 / 6, attention, head * 4 / 6)
    assert MFU(config, torch.device("cpu"), 0.0, 1).terms == (body, attention, head)

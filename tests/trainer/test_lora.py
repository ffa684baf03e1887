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

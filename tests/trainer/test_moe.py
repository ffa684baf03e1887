"""Mixture-of-experts models in the trainer, on tiny random MoEs of real config classes: the grouped
expert path against the modelling code's loop over experts, routing replay forcing the engine's
experts (activation recomputation included) while the router keeps its gradient, the
load-balancing loss, and MFU counting active parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import MOE_CONFIGS, hf_engine, tiny_moe
from helpers import config, init_gloo, make_batch, plain_model, step_runner

from areal_cli import moe
from areal_cli.engines.base import Sequence, routing_array
from areal_cli.trainer.batching import from_batch
from areal_cli.trainer.model import build_policy


def _loss(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(input_ids=ids).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])
    return logits, -lp.mean()


@pytest.mark.parametrize("kind", list(MOE_CONFIGS))
def test_grouped_experts_give_the_logits_and_gradients_of_the_loop_over_experts(kind, tmp_path):
    """The trainer's policy (experts as one grouped GEMM) against transformers' ``eager`` experts:
    the modelling code's Python loop over the experts hit, one matmul pair each."""
    from transformers import AutoModelForCausalLM

    init_gloo()
    path = tiny_moe(tmp_path / kind, kind)
    policy = build_policy(path, torch.device("cpu"), torch.float32, activation_checkpointing=False)
    loop = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                experts_implementation="eager")
    assert policy.config._experts_implementation == moe.EXPERTS_IMPLEMENTATION == "grouped_mm"
    assert loop.config._experts_implementation == "eager"
    ids = torch.randint(5, 1000, (3, 17), generator=torch.Generator().manual_seed(0))
    got, ref = _loss(policy, ids), _loss(loop, ids)
    assert torch.allclose(got[0], ref[0], atol=1e-5), (got[0] - ref[0]).abs().max()
    got[1].backward()
    ref[1].backward()
    mine = dict(policy.named_parameters())
    for name, p in loop.named_parameters():
        g = mine[name].grad
        assert g is not None and torch.allclose(g, p.grad, atol=1e-6, rtol=1e-4), name


def _generated(path, prompts: list[list[int]], perturb: float):
    """Sequences a real slot-loop engine recording routing generated, on weights moved by
    ``perturb`` from ``path``'s (so the trainer's own routing differs from the engine's)."""
    eng = hf_engine(path, sequences=4, routing=True)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in eng.model.parameters():
            p.add_(torch.randn_like(p) * perturb)
    for i, p in enumerate(prompts):
        eng.submit(Sequence(f"s{i}", p, max_new_tokens=12, ignore_eos=True))
    done = []
    while len(done) < len(prompts):
        done += eng.poll(0.1)
    eng.close()
    return sorted(done, key=lambda s: s.rid)


def _with_routing(batch, seqs):
    """``batch`` with the engine's sequences as its samples (routing included)."""
    flat = [s for g in batch.groups for s in sorted(g.samples, key=lambda s: s.sample_index)]
    for sample, seq in zip(flat, seqs, strict=True):
        sample.prompt_ids = np.asarray(seq.prompt_ids, np.int32)
        sample.output_ids = np.asarray(seq.output_ids, np.int32)
        n = len(seq.output_ids)
        sample.logprobs, sample.versions = np.asarray(seq.logprobs, np.float32), np.zeros(n,
                                                                                         np.int32)
        sample.loss_mask = np.ones(n, np.uint8)
        sample.routed_experts = routing_array(seq.routing)
    return batch


def _used_experts(runner, ro, mb):
    """The experts each token of micro-batch ``mb`` went to in the trainer's forward, and the
    experts the forward was given to force (None: routed live), both ``[tokens, layers, k]``."""
    routers = runner.routers
    routers.record = True
    try:
        runner._forward(ro, mb)
        used = routers.take_recorded()
    finally:
        routers.record = False
    return used, routers.forced


@pytest.mark.parametrize("packing", ["false", "true"])
def test_replay_forces_the_engines_experts_and_the_router_keeps_its_gradient(tiny_moe_model,
                                                                             packing):
    init_gloo()
    prompts = [[1, 9690, 198, 504 + i, 30, 28][: 4 + i % 3] for i in range(4)]
    seqs = _generated(tiny_moe_model, prompts, perturb=0.05)
    assert all(len(s.routing) == len(s.prompt_ids) + len(s.output_ids) - 1 for s in seqs)
    runner = step_runner(tiny_moe_model, "rollout.group_size=2", f"trainer.packing={packing}")
    model = plain_model(tiny_moe_model)
    ro = from_batch(_with_routing(make_batch(model, 2, 2), seqs))
    mb = list(range(ro.n))
    used, forced = _used_experts(runner, ro, mb)
    have = (forced >= 0).all(-1).all(-1)
    # every token but each sequence's last (never an input to the engine) and the padding
    assert int(have.sum()) == sum(len(s.routing) for s in seqs)
    assert torch.equal(used[have], forced[have])  # exactly the engine's experts
    runner.replay = False
    live, none = _used_experts(runner, ro, mb)
    assert none is None
    assert not torch.equal(live[have], forced[have]), "the trainer routes like the engine anyway"
    runner.replay = True
    lp, _ = runner._forward(ro, mb)
    (lp.sum()).backward()
    for router in runner.routers.routers:
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_the_routing_probe_measures_the_gap_and_the_flips_without_replay(tiny_moe_model):
    # algorithm.routing_probe: the same step also reports the behaviour gap of a forward routed by
    # the trainer itself and the share of (token, sparse layer) whose experts it would change; both
    # equal what a forward without replay gives on the same micro-batch, before the update
    init_gloo()
    prompts = [[1, 9690, 198, 504 + i, 30, 28][: 4 + i % 3] for i in range(4)]
    seqs = _generated(tiny_moe_model, prompts, perturb=0.05)
    batch = _with_routing(make_batch(plain_model(tiny_moe_model), 2, 2), seqs)
    runner = step_runner(tiny_moe_model, "rollout.group_size=2", "algorithm.routing_probe=true",
                         "trainer.lr=1e-12")
    ro = from_batch(batch)
    mb = list(range(ro.n))
    forced_used, forced = _used_experts(runner, ro, mb)
    runner.replay = False
    live, _ = _used_experts(runner, ro, mb)
    lp_free, _ = runner._forward(ro, mb)
    runner.replay = True
    known = (forced >= 0).all(-1)
    flips = ((forced.sort(-1).values != live.sort(-1).values).any(-1) & known).sum()
    mask = ro.loss_mask.bool()
    want_gap = float((lp_free.detach() - ro.behav_logp).abs()[mask].mean())
    out = runner.train(batch, version=0)
    assert out["routing_flip_fraction"] == pytest.approx(float(flips / known.sum()), abs=1e-6)
    assert 0 < out["routing_flip_fraction"] < 1  # the perturbed engine routed some tokens otherwise
    assert out["logp_gap_fresh_free"] == pytest.approx(want_gap, rel=1e-4)
    assert out["logp_gap_fresh_free"] > out["logp_gap_fresh"]  # replay closes part of the gap
    off = step_runner(tiny_moe_model, "rollout.group_size=2").train(batch, version=0)
    assert "routing_flip_fraction" not in off and "logp_gap_fresh_free" not in off


def test_replay_survives_activation_recomputation(tiny_moe_model):
    """With activation checkpointing every layer's forward runs again in backward: the forced
    experts must be used there too, so the gradients equal those of the run without
    recomputation."""
    init_gloo()
    prompts = [[1, 9690, 198, 504 + i, 30] for i in range(4)]
    seqs = _generated(tiny_moe_model, prompts, perturb=0.05)
    grads = []
    for checkpointing in (False, True):
        runner = step_runner(tiny_moe_model, "rollout.group_size=2", checkpointing=checkpointing)
        ro = from_batch(_with_routing(make_batch(plain_model(tiny_moe_model), 2, 2), seqs))
        lp, _ = runner._forward(ro, list(range(ro.n)))
        lp.sum().backward()
        grads.append({n: p.grad.clone() for n, p in runner.model.named_parameters()})
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-6), name


def test_a_step_adds_the_load_balancing_loss_and_reports_it(tiny_moe_model):
    init_gloo()
    model = plain_model(tiny_moe_model)
    batch = make_batch(model, 2, 2)
    out = {}
    for coef in (0.0, 1.0):
        runner = step_runner(tiny_moe_model, "rollout.group_size=2",
                             f"algorithm.router_aux_loss_coef={coef}")
        out[coef] = (runner.train(batch, version=0),
                     [r.weight.detach().clone() for r in runner.routers.routers])
    # top-2 of 8 experts: 2 when perfectly balanced, up to 8 when every token picks the same two
    aux = out[1.0][0]["router_aux_loss"]
    assert 1.9 < aux < 8 and aux == pytest.approx(out[0.0][0]["router_aux_loss"], rel=1e-5)
    # the term moved the routers (the policy loss moves them too: compare the two)
    assert any(not torch.equal(a, b) for a, b in zip(out[0.0][1], out[1.0][1], strict=True))
    assert out[1.0][0]["logp_gap_fresh"] < 1e-4  # on-policy behaviour logprobs, live routing


def test_aux_loss_is_transformers_load_balancing_loss(tiny_moe_model):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    torch.manual_seed(0)
    logits = [torch.randn(10, 8) for _ in range(2)]
    chosen = [torch.softmax(x, -1).topk(2, -1).indices for x in logits]
    ref = load_balancing_loss_func(tuple(logits), 8, 2)
    assert torch.allclose(moe.aux_loss(logits, chosen, 8), ref)
    real = torch.ones(10, dtype=torch.bool)
    real[7:] = False  # padding: as transformers with an attention mask
    ref = load_balancing_loss_func(tuple(logits), 8, 2, attention_mask=real[None].long())
    assert torch.allclose(moe.aux_loss(logits, chosen, 8, real), ref)


def test_forcing_a_routing_of_the_wrong_layout_is_refused(tiny_moe_model):
    init_gloo()
    runner = step_runner(tiny_moe_model)
    with pytest.raises(ValueError, match="this model has 8 experts"):
        runner.routers.force(torch.full((3, 2, 2), 8))
    with pytest.raises(ValueError, match=r"\[tokens, 2 sparse layers, top-2\]"):
        runner.routers.force(torch.zeros(3, 2, 3, dtype=torch.long))


def test_mfu_counts_the_active_experts_only(tiny_moe_model):
    from transformers import AutoConfig

    from areal_cli.trainer.metrics import flop_terms

    cfg = AutoConfig.from_pretrained(tiny_moe_model)
    body, _, _ = flop_terms(cfg)
    h, d = 64, 16
    attention = 2 * h * 4 * d + 2 * h * 2 * d
    # top-2 of 8 experts of inner size 32 (gate, up, down), and the router's H·E
    assert body == 6 * 2 * (attention + 2 * 3 * h * 32 + h * 8)
    assert config().algorithm.routing_replay  # on by default


def test_lora_on_an_moe_adapts_attention_and_leaves_the_experts_frozen(tiny_moe_model):
    from areal_cli.lora import check_model

    init_gloo()
    cfg = config("trainer.lora.rank=4")
    assert check_model(tiny_moe_model, cfg.trainer.lora) == []
    runner = step_runner(tiny_moe_model, "trainer.lora.rank=4", "rollout.group_size=2")
    trainable = {n for n, p in runner.model.named_parameters() if p.requires_grad}
    assert trainable and all("self_attn" in n and "lora_" in n for n in trainable)
    metrics = runner.train(make_batch(plain_model(tiny_moe_model), 2, 2), version=0)
    assert np.isfinite(metrics["grad_norm"]) and "router_aux_loss" in metrics


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe"])
def test_lora_keeps_frozen_matmul_weights_in_the_compute_dtype_and_loads_them_as_saved(
        kind, tmp_path, monkeypatch):
    # LoRA in bfloat16: the linear layers' and the fused experts' weights (the bulk of an MoE)
    # bfloat16, the embedding, norms and routers float32. A bfloat16 checkpoint loads as it is (no
    # float32 copy of the whole model first), to the same values as through float32
    from transformers import AutoModelForCausalLM

    from areal_cli.config.schema import LoraConfig
    from areal_cli.trainer import model as policy

    init_gloo()
    src = tiny_moe(tmp_path / "f32", kind)
    bf = tmp_path / "bf"
    AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(bf)
    for f in src.glob("tokenizer*"):
        (bf / f.name).write_bytes(f.read_bytes())
    assert policy.checkpoint_dtype(bf) == torch.bfloat16
    assert policy.checkpoint_dtype(src) == torch.float32

    def params() -> dict[str, torch.Tensor]:
        m = build_policy(bf, torch.device("cpu"), torch.bfloat16, activation_checkpointing=False,
                         lora=LoraConfig(rank=4), shard=False)
        return {n: p.detach().clone() for n, p in m.named_parameters()}

    direct = params()
    monkeypatch.setattr(policy, "checkpoint_dtype", lambda path: None)  # through float32
    through = params()
    experts = [n for n in direct if ".mlp.experts." in n]
    # the linear layers' (nn.Linear: the projections, Qwen2-MoE's shared-expert gate)
    linear = [n for n in direct if "lora_" not in n and n.endswith(
        ("proj.weight", "proj.bias", "proj.base_layer.weight", "proj.base_layer.bias",
         "shared_expert_gate.weight"))]
    assert experts and linear
    for n, p in direct.items():
        want = torch.bfloat16 if n in experts + linear else torch.float32  # adapters float32
        assert p.dtype == through[n].dtype == want, n
        if "lora_" not in n:
            assert torch.equal(p, through[n]), n

"""The trainer step on a real tiny model (FSDP2 on a one-rank gloo group, float32): the
decoupled objective's gradient at staleness 0, proximal recomputation, the reference, the
critic, and one step of every preset."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import config, init_gloo, make_batch, plain_model, step_runner
from helpers import grads as _grads

from areal_cli.trainer.batching import from_batch
from areal_cli.trainer.critic import Critic
from areal_cli.trainer.model import build_policy
from areal_cli.trainer.step import StepRunner

F32 = torch.float32


@pytest.fixture(scope="module", autouse=True)
def gloo():
    init_gloo()


def _standard_ppo_grads(model, batch, eps=0.2) -> dict[str, torch.Tensor]:
    """Plain PPO written out: r = π_θ/μ per token, A = (R - group mean) / (group std + 1e-6),
    loss = -Σ_tokens min(r A, clip(r, 1-ε, 1+ε) A) / tokens; one sequence per forward."""
    model.zero_grad()
    terms, tokens = [], 0
    for g in batch.groups:
        rew = torch.tensor([s.reward for s in g.samples], dtype=torch.float64)
        adv = (rew - rew.mean()) / (rew.std(unbiased=False) + 1e-6)
        for s, a in zip(g.samples, adv.float(), strict=True):
            p, r = s.prompt_ids.tolist(), s.output_ids.tolist()
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(r)[:, None])[:, 0]
            ratio = torch.exp(lp - torch.from_numpy(s.logprobs))
            terms.append(torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a).sum())
            tokens += len(r)
    (-torch.stack(terms).sum() / tokens).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("packing", [True, False])
def test_decoupled_gradient_equals_standard_ppo_at_staleness_0(tiny_model, packing):
    # the gradients stay in .grad after AdamW's step; a huge grad_clip leaves them unscaled
    runner = step_runner(tiny_model, "algorithm=grpo", "algorithm.loss_agg=token_mean",
                         "rollout.max_staleness=0",
                     "trainer.grad_clip=1e9", f"trainer.packing={packing}")
    ref_model = plain_model(tiny_model)
    batch = make_batch(ref_model, groups=2, group_size=3, seed=2)
    runner.train(batch)
    got, want = _grads(runner.model), _standard_ppo_grads(ref_model, batch)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-6), name
    assert sum(float(g.abs().sum()) for g in want.values()) > 0


def test_prox_mu_clips_against_the_policy_that_sampled_stale_samples(tiny_model):
    # recompute_proximal=false at staleness > 0: π_prox = μ, so the step is plain PPO against the
    # behaviour logprobs, whose clip zeroes the tokens that moved more than ε since sampling
    ref_model = plain_model(tiny_model)
    batch = make_batch(ref_model, groups=2, group_size=3, seed=2)
    for g in batch.groups:  # μ of every other token 0.5 nats off: those ratios leave [0.8, 1.2]
        for s in g.samples:
            s.logprobs = s.logprobs.copy()
            s.logprobs[::2] += 0.5
    want = _standard_ppo_grads(ref_model, batch)
    common = ("algorithm=grpo", "algorithm.loss_agg=token_mean", "rollout.max_staleness=2",
              "trainer.grad_clip=1e9")
    coupled = step_runner(tiny_model, *common, "algorithm.recompute_proximal=false")
    stats = coupled.train(batch)
    assert stats["clip_fraction"] > 0
    got = _grads(coupled.model)
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-6), name
    # r = 1: no clip
    recomputed = step_runner(tiny_model, *common, "algorithm.recompute_proximal=true")
    assert recomputed.train(batch)["clip_fraction"] == 0
    assert any(not torch.allclose(g, want[n], rtol=1e-4, atol=1e-6) for n,
               g in _grads(recomputed.model).items())


def test_proximal_recomputed_equals_same_forward(tiny_model):
    runner = step_runner(tiny_model, "algorithm.ppo_epochs=2", "rollout.max_staleness=1",
                         "algorithm.recompute_proximal=true")
    assert runner._needs_proximal()
    ro = from_batch(make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=3))
    mbs = runner._micro_batches(ro)
    prox = runner._proximal(ro, mbs)
    for mb in mbs:
        lp, _ = runner._forward(ro, mb)
        for j, i in enumerate(mb):
            assert torch.allclose(prox[i], lp[j].detach(), atol=1e-6)
    one = step_runner(tiny_model, "algorithm.ppo_epochs=1", "rollout.max_staleness=1")
    assert not one._needs_proximal()


def test_reference_is_frozen_initial_policy(tiny_model):
    runner = step_runner(tiny_model, "algorithm=grpo", "algorithm.kl_coef=0.1", "trainer.lr=1e-3")
    assert runner.reference is not None and runner.critic is None
    assert not any(p.requires_grad for p in runner.reference.model.parameters())
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=4)
    first = runner.train(batch)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # policy = reference before any step
    second = runner.train(batch)
    assert second["kl_ref"] > 0  # the policy moved, the reference did not


def test_critic_value_loss_falls_on_a_fixed_batch(tiny_model):
    cfg = config("algorithm=ppo", "algorithm.critic_lr=1e-3")
    critic = Critic.load(tiny_model, cfg, torch.device("cpu"), F32, world=1)
    ro = from_batch(make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=5,
                               rewards=[1.0, 0.5, 1.0, 0.5]))
    mbs = [list(range(ro.n))]
    returns = ro.rewards[:, None] * ro.loss_mask  # any fixed target
    losses = []
    for _ in range(6):
        old = critic.values(ro, mbs)
        stats, _ = critic.train(ro, mbs, old, returns, float(ro.loss_mask.sum()), max_len=64)
        losses.append(float(stats["value_loss"]))
    assert losses[1] < losses[0] and losses[-1] < 0.3 * losses[0], losses


EXPECTED = {"loss", "pg_loss", "clip_fraction", "approx_kl", "entropy", "behav_weight_mean",
            "behav_weight_max", "masked_fraction", "grad_norm", "adv_mean", "adv_std",
            "train_tokens_per_s"}


@pytest.mark.parametrize("preset",
                         ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline",
                                    "ppo", "dapo", "cispo"])
def test_every_preset_trains_in_process(tiny_model, preset):
    runner = step_runner(tiny_model, f"algorithm={preset}", "algorithm.ppo_epochs=2")
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=6)
    metrics = runner.train(batch)
    assert EXPECTED <= set(metrics)
    if preset == "ppo":
        assert {"value_loss", "value_clip_fraction", "critic_grad_norm"} <= set(metrics)
    if preset in ("rloo", "reinforce_pp", "reinforce_pp_baseline"):
        assert "kl_ref" in metrics
    assert all(math.isfinite(v) for v in metrics.values()), metrics


def test_logp_gap_fresh_compares_sequences_wholly_of_the_current_version(tiny_model):
    # behaviour logprobs of the same float32 weights: the gap is zero. Then half the sequences
    # sampled wholly with version 1 and shifted by 0.1, the others begun with version 0 and
    # finished with version 1 (a weight update mid-sequence: their later tokens saw a context the
    # old weights computed) and shifted by 0.5 there: only the whole ones count, gap 0.1
    runner = step_runner(tiny_model, "trainer.lr=1e-12")
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=6)
    same = runner.train(batch, version=0)
    total = sum(len(s.output_ids) for g in batch.groups for s in g.samples)
    assert same["fresh_tokens"] == total and same["logp_gap_fresh"] == pytest.approx(0.0, abs=1e-5)
    fresh = 0
    for g in batch.groups:
        for i, s in enumerate(g.samples):
            if i % 2 == 0:
                s.versions[:] = 1
                s.logprobs += 0.1
                fresh += len(s.versions)
            else:
                s.versions[len(s.versions) // 2:] = 1
                s.logprobs[s.versions == 1] += 0.5
    shifted = runner.train(batch, version=1)
    assert 0 < shifted["fresh_tokens"] == fresh < total
    assert shifted["logp_gap_fresh"] == pytest.approx(0.1, abs=1e-4)
    assert "logp_gap_fresh" not in runner.train(batch, version=7)


def test_float16_compute_scales_the_loss_and_skips_an_overflowing_step(tiny_model):
    # float16 autocast: the scaled loss's gradients are divided back (a step is taken and the
    # weights move); a scale so large the float16 gradients overflow skips the step and halves
    cfg = config("trainer.dtype=float16", "trainer.lr=1e-3")
    torch.manual_seed(0)
    model = build_policy(tiny_model, torch.device("cpu"), torch.float16,
                         activation_checkpointing=False)
    runner = StepRunner.build(model, tiny_model, cfg, torch.device("cpu"), torch.float16, rank=0,
                              world=1)
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=7,
                       rewards=[1.0, 0.0, 1.0, 0.0])
    before = {n: p.detach().clone() for n, p in runner.model.named_parameters()}
    out = runner.train(batch, version=0)
    assert (out["loss_scale"] == 2.0**16 and out["skipped_steps"] == 0
            and math.isfinite(out["grad_norm"]))
    assert any(not torch.equal(before[n], p.detach()) for n, p in runner.model.named_parameters())
    runner.scale.value = 1e30
    kept = {n: p.detach().clone() for n, p in runner.model.named_parameters()}
    out = runner.train(batch, version=0)
    assert out["skipped_steps"] == 1 and out["loss_scale"] == 5e29
    assert all(torch.equal(kept[n], p.detach()) for n, p in runner.model.named_parameters())


def test_precision_fp16_sets_engine_and_trainer_and_validates():
    from areal_cli.runconfig.compose import ConfigError, compose, validate

    cfg = compose(["engine=vllm", "precision=fp16"])
    assert (cfg.engine.dtype, cfg.trainer.dtype) == ("float16", "float16") and validate(cfg) == []
    assert compose(["engine=vllm"]).engine.dtype == "bfloat16"
    with pytest.raises(ConfigError,
                       match="trainer.dtype=float8: use auto, bfloat16, float16 or float32"):
        compose(["trainer.dtype=float8"])


def test_activation_checkpointing_recomputes_layers_and_keeps_gradients(tiny_model):
    # the policy trains in train mode, so transformers checkpoints each decoder layer: its
    # forward runs again in backward (2 calls per micro-batch, not 1); the gradients are the same
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=10,
                       rewards=[1.0, 0.0, 0.0, 1.0])
    grads, calls = {}, {}
    for ckpt in (False, True):
        cfg = config("trainer.grad_clip=1e9", "trainer.lr=1e-12",
                     f"trainer.activation_checkpointing={ckpt}")
        torch.manual_seed(0)
        model = build_policy(tiny_model, torch.device("cpu"), F32, activation_checkpointing=ckpt)
        assert model.training and model.model.gradient_checkpointing == ckpt
        seen = []
        # transformers checkpoints the layer's forward (its own hooks run once): count a submodule
        model.model.layers[0].self_attn.register_forward_pre_hook(lambda *_,
                                                                  seen=seen: seen.append(1))
        runner = StepRunner.build(model, tiny_model, cfg, torch.device("cpu"), F32, rank=0, world=1)
        out = runner.train(batch)
        grads[ckpt], calls[ckpt] = _grads(runner.model), len(seen) / out["micro_batches"]
    assert calls == {False: 1, True: 2}
    for name, g in grads[False].items():
        assert torch.allclose(grads[True][name], g, rtol=1e-5, atol=1e-9), name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_non_finite_gradient_skips_the_step(tiny_model, dtype):
    # a NaN reward makes its group's advantages, the loss and the gradient NaN: the weights stay
    # as they were and the step is counted in skipped_steps; the next finite batch steps again
    cfg = config(f"trainer.dtype={dtype}", "trainer.lr=1e-3")
    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = build_policy(tiny_model, torch.device("cpu"), dt, activation_checkpointing=False)
    runner = StepRunner.build(model, tiny_model, cfg, torch.device("cpu"), dt, rank=0, world=1)
    ref = plain_model(tiny_model)
    before = {n: p.detach().clone() for n, p in runner.model.named_parameters()}
    bad = runner.train(make_batch(ref, groups=2, group_size=2, seed=11,
                                  rewards=[1.0, float("nan"), 0.0, 1.0]))
    assert not math.isfinite(bad["grad_norm"]) and bad["skipped_steps"] == 1
    names = dict(runner.model.named_parameters())
    # named for the trainer's warning
    assert runner.nonfinite and all(n in names for n in runner.nonfinite)
    assert all(torch.equal(before[n], p.detach()) for n, p in runner.model.named_parameters())
    good = runner.train(make_batch(ref, groups=2, group_size=2, seed=11,
                                   rewards=[1.0, 0.0, 0.0, 1.0]))
    assert (math.isfinite(good["grad_norm"]) and good["skipped_steps"] == 1 and runner.nonfinite
            == [])
    assert any(not torch.equal(before[n], p.detach()) for n, p in runner.model.named_parameters())


def test_the_parameters_with_non_finite_gradients_are_named(tiny_model):
    from areal_cli.trainer.step import nonfinite_grads

    model = plain_model(tiny_model)
    params = list(model.named_parameters())
    for _, p in params:
        p.grad = torch.zeros_like(p)
    assert nonfinite_grads(model) == []
    params[3][1].grad[0, 0] = float("inf")
    params[5][1].grad.view(-1)[-1] = float("nan")
    assert nonfinite_grads(model) == [params[3][0], params[5][0]]
    assert nonfinite_grads(model, limit=1) == [params[3][0]]

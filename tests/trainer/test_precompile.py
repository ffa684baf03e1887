"""Compiling the policy's layers before the first batch (``trainer/precompile.py``): which forms of
input a run's steps can give the layers, and, with the layers really compiled on the CPU, that a
step after ``precompile`` compiles nothing more while one without it does."""

from __future__ import annotations

import pytest
import torch
from helpers import config, init_gloo, make_batch, plain_model, step_runner

from areal_cli.trainer.batching import PACKED_ROW_TOKENS_CUDA, from_batch, model_inputs
from areal_cli.trainer.model import build_policy
from areal_cli.trainer.precompile import compiled_graphs, input_forms, synthetic_rollouts
from areal_cli.trainer.step import StepRunner


@pytest.fixture(scope="module", autouse=True)
def gloo():
    init_gloo()


def names(forms) -> list[tuple[str, bool]]:
    return [(f.name, f.grad) for f in forms]


def test_forms_of_a_packed_gpu_run_cover_rows_and_segment_offsets(tiny_model):
    runner = step_runner(tiny_model, "trainer.packing=true", "trainer.micro_batch_tokens=32768",
                         "rollout.max_new_tokens=2048")
    runner.varlen = True  # what a GPU with FlashAttention's varlen op sets (trainer.varlen)
    forms = input_forms(runner, PACKED_ROW_TOKENS_CUDA)
    assert names(forms) == [("one packed row", True), ("packed rows", True),
                            ("segment offsets", True),
                            ("empty micro-batch", True)]  # every row of a batch can be skipped
    for form in forms[:-1]:  # each synthetic micro-batch takes the path its name says
        ro = synthetic_rollouts(form.lengths)
        long = runner.varlen and max(form.lengths) > PACKED_ROW_TOKENS_CUDA
        x = model_inputs(ro, list(range(ro.n)), True, row_tokens=PACKED_ROW_TOKENS_CUDA,
                         varlen=long)
        assert (x.cu_seqlens is not None) == (form.name == "segment offsets")
        assert x.ids.shape[0] == (2 if form.name == "packed rows" else 1)
    # responses of at most 512 tokens never exceed a packed row: no segment offsets to compile for
    runner.cfg.rollout.max_new_tokens, runner.cfg.engine.vllm.max_model_len = 512, 1536
    assert "segment offsets" not in [f.name for f in input_forms(runner, PACKED_ROW_TOKENS_CUDA)]


def test_forms_follow_padding_ranks_and_the_proximal_pass(tiny_model):
    runner = step_runner(tiny_model, "trainer.packing=false", "algorithm.ppo_epochs=2",
                         "algorithm.recompute_proximal=true", "trainer.skip_zero_advantage=false")
    runner.world = 2  # a rank of two can get an empty micro-batch
    shapes = [("one padded row", ()), ("padded rows", ()), ("empty micro-batch", ())]
    assert names(input_forms(runner, None)) == [(n, g) for g in (True, False) for n, _ in shapes]
    runner.world = 1
    assert "empty micro-batch" not in [f.name for f in input_forms(runner, None)]
    cpu_packed = step_runner(tiny_model, "trainer.packing=true")  # the CPU packs one row
    assert names(input_forms(cpu_packed, None)) == [("one packed row", True),
                                                    ("empty micro-batch", True)]


def test_segment_offsets_pack_one_row_whatever_the_row_limit(tiny_model):
    ro = from_batch(make_batch(plain_model(tiny_model), groups=2, group_size=3, seed=2))
    masked = model_inputs(ro, list(range(ro.n)), True, row_tokens=12)
    x = model_inputs(ro, list(range(ro.n)), True, row_tokens=12, varlen=True)
    assert masked.ids.shape[0] > 1 and x.ids.shape[0] == 1
    lens = [len(p) + len(r) for p, r in zip(ro.prompts, ro.responses, strict=True)]
    assert x.ids.shape[1] == sum(lens)  # no padding
    assert torch.equal(x.cu_seqlens,
                       torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32))


@pytest.mark.slow
def test_a_step_after_precompile_compiles_nothing(tiny_model):
    # the layers compiled for real on the CPU (inductor): the first step of a runner that did not
    # precompile compiles, one that did compiles nothing (its forms were all foreseen)
    cfg = config("trainer.packing=true", "trainer.grad_clip=1e9")
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=3, seed=4)
    compiled = {}
    for warm in (True, False):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = build_policy(tiny_model, torch.device("cpu"), torch.float32,
                             activation_checkpointing=False,
                             compile_layers=True)
        runner = StepRunner.build(model, tiny_model, cfg, torch.device("cpu"), torch.float32,
                                  rank=0, world=1)
        before = compiled_graphs()
        forms, seconds = runner.precompile() if warm else ([], 0.0)
        if warm:
            assert forms == ["one packed row",
                             "empty micro-batch"] and compiled_graphs() > before and seconds > 0
            # the zero gradients dropped
            assert all(p.grad is None for p in runner.model.parameters())
        compiled[warm] = runner.train(batch)["compiled_graphs"]
    assert compiled[True] == 0 and compiled[False] > 0


def test_compiled_layers_are_not_guarded_on_the_micro_batch_size(tiny_model):
    # inductor's mix-order reduction (GPU) decides by the tokens of the micro-batch and guards the
    # graph on that size unless in non-strict mode: a run then compiled each layer again mid-run
    # (1.5B, H200)
    import torch._inductor.config as inductor

    if not hasattr(inductor.triton, "mix_order_reduction_non_strict_mode"):
        pytest.skip("this torch's inductor has no mix-order reduction")
    inductor.triton.mix_order_reduction_non_strict_mode = False
    build_policy(tiny_model, torch.device("cpu"), torch.float32, activation_checkpointing=False,
                 compile_layers=True)
    assert inductor.triton.mix_order_reduction_non_strict_mode

"""Each speed lever of the trainer leaves the logprobs and the gradients of a step as they were:
selective activation checkpointing, FSDP2's reshard_after_forward (two gloo ranks) and
``torch.compile`` of each decoder layer (Inductor's CPU backend: slow, about a minute)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import config, grads, init_gloo, make_batch, plain_model

from areal_cli.runtime import exit_now
from areal_cli.trainer.batching import from_batch
from areal_cli.trainer.model import build_policy
from areal_cli.trainer.step import StepRunner

F32 = torch.float32
CPU = torch.device("cpu")


def logprobs_and_grads(path, batch, **options) -> tuple[torch.Tensor, dict[str, torch.Tensor],
                                                        list[int]]:
    """The batch's logprobs at the initial weights and the gradients of one step, built with
    ``options`` (build_policy's keywords); and how often each layer's attention ran per
    micro-batch."""
    cfg = config("trainer.grad_clip=1e9", "trainer.lr=1e-12", "trainer.skip_zero_advantage=false")
    torch.manual_seed(0)
    model = build_policy(path, CPU, F32, **options)
    calls = [0] * len(model.model.layers)
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.register_forward_pre_hook(lambda *_,
                                                  i=i: calls.__setitem__(i, calls[i] + 1))
    runner = StepRunner.build(model, path, cfg, CPU, F32, rank=dist.get_rank(),
                              world=dist.get_world_size())
    ro = from_batch(batch)
    with torch.no_grad():
        lp, _ = runner._forward(ro, list(range(ro.n)))
    calls[:] = [0] * len(calls)
    out = runner.train(batch)
    return lp, grads(runner.model), [c // out["micro_batches"] for c in calls]


def assert_same(a, b, reordered: bool = False) -> None:
    """Same logprobs and gradients. ``reordered``: b's kernels sum in another order (fused by
    Inductor), so an element that nearly cancels may differ in its last bits; its tolerance is
    then relative to the tensor's largest element."""
    assert torch.allclose(a[0], b[0], rtol=1e-5, atol=1e-6)
    for name, g in a[1].items():
        atol = 1e-5 * g.abs().max().item() if reordered else 1e-8
        assert torch.allclose(b[1][name], g, rtol=1e-4, atol=atol), name


def test_checkpointing_every_other_layer_recomputes_only_those(tiny_model):
    init_gloo()
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=4)
    base = logprobs_and_grads(tiny_model, batch, activation_checkpointing=False)
    every = logprobs_and_grads(tiny_model, batch, activation_checkpointing=True, checkpoint_every=2)
    # layer 0 runs again in backward, layer 1 does not
    assert base[2] == [1, 1] and every[2] == [2, 1]
    assert_same(base, every)
    with pytest.raises(ValueError, match="checkpoint_every must be at least 1"):
        build_policy(tiny_model, CPU, F32, activation_checkpointing=True, checkpoint_every=0)


@pytest.mark.slow  # about 80 s of compilation with a cold cache
def test_compiled_layers_give_the_same_step(tiny_model):
    init_gloo()
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=5)
    from torch._dynamo.utils import counters

    base = logprobs_and_grads(tiny_model, batch, activation_checkpointing=True)
    counters.clear()
    compiled = logprobs_and_grads(tiny_model, batch, activation_checkpointing=True,
                                  compile_layers=True)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo captured the layers
    assert base[2] == compiled[2] == [2, 2]  # each layer still recomputed in backward
    assert_same(base, compiled, reordered=True)


@pytest.mark.slow  # about 20 s of compilation with a cold cache
def test_compiled_layers_take_micro_batches_of_new_lengths_without_compiling_again(tiny_model):
    from torch._dynamo.utils import counters

    init_gloo()
    cfg = config("trainer.skip_zero_advantage=false", "trainer.packing=true")
    model = build_policy(tiny_model, CPU, F32, activation_checkpointing=False, compile_layers=True)
    runner = StepRunner.build(model, tiny_model, cfg, CPU, F32, rank=0, world=1)
    plain = plain_model(tiny_model)
    counters.clear()
    runner.train(make_batch(plain, groups=2, group_size=2, seed=10))
    layers = counters["frames"]["ok"]
    for seed, groups in ((11, 3), (12, 4)):  # packed lengths the first step never saw
        batch = make_batch(plain, groups=groups, group_size=2, seed=seed)
        runner.train(batch)
    # the output layer's reduce may compile once more for a chunk of another length; the layers do
    # not
    assert counters["frames"]["ok"] <= layers + 1


def _two_ranks(rank: int, init: str, path: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    batch = make_batch(plain_model(path), groups=2, group_size=2, seed=6)
    got = {reshard: logprobs_and_grads(path, batch, activation_checkpointing=False,
                                       reshard_after_forward=reshard)
           for reshard in (True, False)}
    if rank == 0:
        torch.save(got, out)
    dist.destroy_process_group()
    exit_now(0)  # as every areal process ends: no interpreter teardown beside a gloo thread


@pytest.mark.slow  # 10-19 s: make test-slow (make test stays within 15 minutes)
def test_keeping_parameters_gathered_after_forward_gives_the_same_step(tiny_model, tmp_path):
    out = tmp_path / "rank0.pt"
    mp.spawn(_two_ranks, args=(f"file://{tmp_path / 'store'}", str(tiny_model), str(out)), nprocs=2,
             join=True)
    got = torch.load(out)
    assert_same(got[True], got[False])

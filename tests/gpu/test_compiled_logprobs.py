"""Compiled decoder layers (trainer.compile) and eager ones compute the same logprobs within
bfloat16 rounding: measured against a float32 forward of the same weights, the compiled trainer
is no further from it than the eager one. The default model, its real weights; 4 sequences of
64 + 448 random tokens (rows of one sequence: varlen attention where the trainer takes it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _batch(seqs: int = 4, length: int = 448):
    from areal_cli.transport.messages import Batch, GroupResult, Sample

    rng = np.random.default_rng(0)
    groups = []
    for g in range(seqs // 2):
        prompt = rng.integers(100, 10000, 64).astype(np.int32)
        samples = [Sample(sample_index=i, prompt_ids=prompt,
                          output_ids=rng.integers(100, 10000, length).astype(np.int32),
                          logprobs=np.full(length, -2.0, np.float32),
                          versions=np.zeros(length, np.int32),
                          loss_mask=np.ones(length, np.uint8), reward=float(i),
                          reward_status="ok", finish_reason="length", num_turns=1,
                          completion="") for i in range(2)]
        groups.append(GroupResult(group_id=g, prompt_id=f"p{g}", worker=0, samples=samples,
                                  gen_time_s=0.0, gen_tokens=0))
    return Batch(step=0, groups=groups)


def test_compiled_layers_are_as_close_to_float32_as_eager_ones():
    from transformers import AutoModelForCausalLM

    from areal_cli.config.resolve import Placement
    from areal_cli.model_source import resolve_model
    from areal_cli.runconfig.autos import resolve
    from areal_cli.runconfig.compose import compose
    from areal_cli.trainer.batching import from_batch, model_inputs
    from areal_cli.trainer.logprobs import forward_logprobs
    from areal_cli.trainer.model import build_policy, policy_options
    from areal_cli.trainer.step import StepRunner

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    device = torch.device("cuda", 0)
    path = resolve_model("smollm2-135m-instruct")
    ro = from_batch(_batch())
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     attn_implementation="sdpa").to(device)
    with torch.no_grad():
        ref, _ = forward_logprobs(reference, model_inputs(ro, [0], False, device=device),
                                  torch.float32, 1.0, 256)
    ref = ref[0].float().cpu()
    del reference
    got = {}
    for compiled in (False, True):
        cfg = resolve(compose(["trainer.packing=true", "trainer.activation_checkpointing=false",
                               "engine.lm_head_fp32=true", f"trainer.compile={compiled}",
                               "rollout.group_size=2", "rollout.max_new_tokens=448"]),
                      Placement(trainer_gpu=True, model_path=path))
        model = build_policy(path, device, torch.bfloat16, **policy_options(cfg))
        runner = StepRunner(model, cfg, device, torch.bfloat16, rank=0, world=1)
        with torch.no_grad():
            got[compiled] = runner._forward(ro, [0])[0][0].float().cpu()
        del runner, model
        torch.cuda.empty_cache()
    eager, comp = (got[False] - ref).abs(), (got[True] - ref).abs()
    between = (got[True] - got[False]).abs()
    print(f"logprobs vs float32: eager max {eager.max():.3e} mean {eager.mean():.3e}; compiled "
          f"max {comp.max():.3e} mean {comp.mean():.3e}; compiled vs eager max "
          f"{between.max():.3e} mean {between.mean():.3e}")
    assert float(comp.mean()) <= 1.5 * float(eager.mean()) + 1e-3
    assert float(comp.max()) <= 2.0 * float(eager.max()) + 0.02

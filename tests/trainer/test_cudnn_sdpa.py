"""The trainer keeps attention off cuDNN's SDPA backend (``model.no_cudnn_sdpa``), whose backward
returns NaN query gradients for masked attention at key lengths 64 past a multiple of 128 when a
query row's log-sum-exp is below ln(FLT_MAX) (torch 2.11+ on H100/H200).

The GPU tests run only where CUDA is: the first is the kernel's failing case after the trainer's
switch; the second a left-padded micro-batch of the trainer's own path (padding rows, 192 columns)
whose bfloat16 gradients must be finite and within bf16 rounding of its float32 gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import plain_model

from areal_cli.trainer import model as trainer_model
from areal_cli.trainer.batching import from_batch, model_inputs
from areal_cli.trainer.logprobs import forward_logprobs
from areal_cli.transport.messages import Batch, GroupResult, Sample

cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="cuDNN's attention backend needs a CUDA GPU")


@pytest.fixture
def cudnn_sdpa_restored():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_switch_turns_the_backend_off(cudnn_sdpa_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    trainer_model.no_cudnn_sdpa()
    assert not torch.backends.cuda.cudnn_sdp_enabled()


@cuda
def test_masked_attention_backward_is_finite_at_the_failing_length(cudnn_sdpa_restored):
    """Every score ~ -120 (log-sum-exp < -88.7), 704 = 5 * 128 + 64 keys, an explicit mask: cuDNN's
    backward gave NaN query gradients here; after the trainer's switch another kernel runs."""
    trainer_model.no_cudnn_sdpa()
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, d = 704, 64
    q = torch.randn(1, 1, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.1
    k = torch.randn(1, 1, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.1
    v = torch.randn(1, 1, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(d)
    for x in (q, k, v):
        x.requires_grad_(True)
    mask = torch.ones(n, n, dtype=torch.bool, device="cuda").tril()[None, None]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=gen))
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()


def padded_batch(prompt_len: int, resp_lens: list[int]) -> Batch:
    """One group of samples with one prompt and responses of ``resp_lens`` tokens (random ids)."""
    gen = np.random.default_rng(0)
    prompt = gen.integers(5, 1000, prompt_len).astype(np.int32)
    samples = [Sample(sample_index=i, prompt_ids=prompt,
                      output_ids=gen.integers(5, 1000, n).astype(np.int32),
                      logprobs=np.full(n, -2.0, np.float32), versions=np.zeros(n, np.int32),
                      loss_mask=np.ones(n, np.uint8), reward=float(i % 2), reward_status="ok",
                      finish_reason="stop", num_turns=1, completion="") for i,
               n in enumerate(resp_lens)]
    return Batch(step=0, groups=[GroupResult(group_id=0, prompt_id="p0", worker=0, samples=samples,
                                             gen_time_s=0.0, gen_tokens=0)])


@cuda
def test_left_padded_micro_batch_has_finite_gradients(tiny_model, cudnn_sdpa_restored):
    """The trainer's padded path on the GPU at 192 columns (64 past 128): bf16 gradients finite and
    within bf16 rounding of the float32 gradients of the same rows."""
    trainer_model.no_cudnn_sdpa()
    ro = from_batch(padded_batch(42, [150, 20, 120, 5]))
    grads = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = plain_model(tiny_model).cuda()
        x = model_inputs(ro, list(range(ro.n)), packed=False, device=torch.device("cuda"),
                         buckets=0)
        assert x.ids.shape[1] % 128 == 64, x.ids.shape
        lp, _ = forward_logprobs(model, x, dtype, 1.0, 64)
        (lp * ro.loss_mask.cuda()).sum().backward()
        grads[dtype] = torch.cat([p.grad.float().flatten() for p in model.parameters()
                                  if p.grad is not None])
    assert torch.isfinite(grads[torch.bfloat16]).all()
    rel = (grads[torch.bfloat16] - grads[torch.float32]).norm() / grads[torch.float32].norm()
    assert rel < 0.05, rel

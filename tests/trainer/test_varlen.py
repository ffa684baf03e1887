"""Packed attention through segment offsets (``trainer.varlen``): the model fed ``cu_seqlens``
instead of a block mask gives the same logprobs and gradients as the masked path.

torch's ``varlen_attn`` runs on CUDA only; here a per-segment SDPA with its signature stands in
for the kernel, so what is checked is everything around it: the segment offsets of a packed row,
the flattening and head layout, GQA and the keyword path through
transformers. The kernel itself is compared with SDPA's kernels on a GPU
(``benchmarks/attention_kernels.py``)."""

from __future__ import annotations

import pytest
import torch
from helpers import make_batch, plain_model

from areal_cli.trainer import varlen
from areal_cli.trainer.batching import from_batch, model_inputs
from areal_cli.trainer.logprobs import forward_logprobs

F64 = torch.float64


def sdpa_by_segment(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), scale=None,
                    enable_gqa=False):
    """varlen_attn's contract on the CPU: each segment attends to itself only."""
    assert window_size == (-1, 0) and torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32
    assert max_q == max_k == int((cu_q[1:] - cu_q[:-1]).max())
    out = torch.empty_like(q)
    for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
        seg = [x[a:b].transpose(0, 1)[None] for x in (q, k, v)]  # [1, H, n, D]
        o = torch.nn.functional.scaled_dot_product_attention(*seg, is_causal=True, scale=scale,
                                                             enable_gqa=enable_gqa)
        out[a:b] = o[0].transpose(0, 1)
    return out


def test_segments_are_the_sequences_end_to_end():
    cu, longest = varlen.segments([2, 3, 3], device="cpu")
    assert cu.tolist() == [0, 2, 5, 8] and cu.dtype == torch.int32 and longest == 3


def older_signature(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1)):
    """varlen_attn as torch 2.11 has it: no enable_gqa (the key/value heads must be repeated)."""
    assert (k.shape[1]
            == q.shape[1]), "key/value heads not repeated for a varlen_attn without enable_gqa"
    return sdpa_by_segment(q, k, v, cu_q, cu_k, max_q, max_k, window_size=window_size, scale=scale)


@pytest.mark.parametrize("kernel", [sdpa_by_segment, older_signature], ids=["gqa", "no_gqa"])
@pytest.mark.parametrize("row_tokens", [None, 12])
def test_varlen_path_equals_masked_path(tiny_model, monkeypatch, row_tokens, kernel):
    monkeypatch.setattr(varlen, "_varlen_attn", lambda: kernel)
    ro = from_batch(make_batch(plain_model(tiny_model), groups=2, group_size=3, seed=2))
    weights = torch.randn(ro.loss_mask.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    results = []
    for use_varlen in (False, True):
        from transformers import AutoModelForCausalLM

        attn = varlen.register() if use_varlen else "sdpa"
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=F64,
                                                     attn_implementation=attn)
        assert varlen.uses(model) == use_varlen
        x = model_inputs(ro, list(range(ro.n)), True, row_tokens=row_tokens, varlen=use_varlen)
        assert (x.attention_mask is None) == use_varlen
        # one row whatever row_tokens (the masked path's rows hold padding), none padded
        if use_varlen:
            assert x.ids.shape[0] == 1 and x.cu_seqlens[-1] == x.ids.numel()
        elif row_tokens:
            assert x.ids.shape[0] > 1
        lp, ent = forward_logprobs(model, x, torch.float32, 0.9, chunk=4)
        (lp * weights).sum().backward()
        results.append((lp.detach(), ent, {n: p.grad for n, p in model.named_parameters()}))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    assert float(lp0.abs().sum()) > 0
    assert torch.allclose(lp1, lp0, rtol=0, atol=1e-9) and torch.allclose(ent1, ent0, rtol=0,
                                                                          atol=1e-9)
    for name, grad in g0.items():
        assert torch.allclose(g1[name], grad, rtol=1e-7, atol=1e-10), name


def test_without_segments_it_is_sdpa(tiny_model, monkeypatch):
    # a rank's empty micro-batch (a plain forward) and a micro-batch of short sequences (packed
    # with the block mask) run through SDPA with their mask on a model loaded for varlen
    from transformers import AutoModelForCausalLM

    def no_kernel():
        raise AssertionError("varlen_attn called for inputs without segments")

    monkeypatch.setattr(varlen, "_varlen_attn", no_kernel)
    models = [AutoModelForCausalLM.from_pretrained(tiny_model, dtype=F64, attn_implementation=a)
              for a in ("sdpa", varlen.register())]
    ids = torch.tensor([[7, 8, 9]])
    outs = [m(input_ids=ids).logits for m in models]
    assert torch.allclose(outs[0], outs[1], rtol=0, atol=1e-10)
    ro = from_batch(make_batch(plain_model(tiny_model), groups=2, group_size=3, seed=3))
    x = model_inputs(ro, list(range(ro.n)), True, row_tokens=12)
    assert x.attention_mask.ndim == 4 and x.cu_seqlens is None
    outs = [forward_logprobs(m, x, torch.float32, 1.0, chunk=4)[0] for m in models]
    assert torch.allclose(outs[0], outs[1], rtol=0, atol=1e-10)


def test_not_available_on_cpu():
    assert not varlen.available(torch.device("cpu"))


def test_half_gemm_backward_is_the_linear_layers():
    # the CUDA output layer (bf16 GEMM, float32 logits): its backward against autograd of x @ w.T
    from types import SimpleNamespace

    from areal_cli.trainer.model import HalfGemmFloat32Out, half_gemm_float32_out

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, generator=gen).bfloat16()
    w = torch.randn(11, 8, generator=gen).bfloat16()
    grad = torch.randn(2, 3, 11, generator=gen)
    gx, gw = HalfGemmFloat32Out.backward(SimpleNamespace(saved_tensors=(x, w),
                                                         needs_input_grad=(True, True)), grad)
    xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
    (xr @ wr.t()).backward(grad.bfloat16().float())
    assert gx.dtype == gw.dtype == torch.bfloat16 and gx.shape == x.shape and gw.shape == w.shape
    assert torch.allclose(gx.float(), xr.grad, rtol=2e-2, atol=1e-2)
    assert torch.allclose(gw.float(), wr.grad, rtol=2e-2, atol=1e-2)
    assert not half_gemm_float32_out(x, w)  # CPU: the float32 GEMM


def test_half_gemm_with_a_frozen_weight_computes_no_weight_gradient(monkeypatch):
    # LoRA: the output layer is frozen, so its backward returns None for the weight (no [vocab,
    # hidden] GEMM) and the input's gradient is the linear layer's; the CUDA-only GEMM is replaced
    # by its float32 value
    import areal_cli.trainer.model as model

    monkeypatch.setattr(model, "mm_float32_out", lambda a, b: a.float() @ b.float())
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, generator=gen).bfloat16().requires_grad_()
    w = torch.randn(11, 8, generator=gen).bfloat16()
    calls = []
    orig = model.HalfGemmFloat32Out.backward

    def spy(ctx, grad):
        out = orig(ctx, grad)
        calls.append(out)
        return out

    monkeypatch.setattr(model.HalfGemmFloat32Out, "backward", staticmethod(spy))
    y = model.HalfGemmFloat32Out.apply(x, w)
    assert y.dtype == torch.float32
    grad = torch.randn(4, 11, generator=gen)
    y.backward(grad)
    assert calls[0][1] is None and w.grad is None
    assert torch.allclose(x.grad.float(), grad.bfloat16().float() @ w.float(), rtol=2e-2, atol=1e-2)
    w.requires_grad_()
    model.HalfGemmFloat32Out.apply(x, w).backward(grad)
    assert calls[1][1] is not None and w.grad.shape == w.shape

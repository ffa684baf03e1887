"""Packed attention on CUDA as FlashAttention over variable-length segments.

A packed micro-batch (``batching.pack``) holds several sequences per row. With SDPA they are kept
apart by an explicit ``[rows, 1, T, T]`` block-diagonal mask, and an explicit mask rules out SDPA's
FlashAttention kernel: the memory-efficient kernel then computes every one of the T × T scores,
the masked half included. Here the sequences lie end to end in one row, and each (a segment)
attends causally to itself through torch's ``varlen_attn`` (FlashAttention with cumulative segment
offsets), with no mask at all.

The model is loaded with ``attn_implementation=NAME``; transformers builds no mask for an
implementation it has no mask function for, and passes the forward's ``cu_seq_lens_q`` /
``max_length_q`` keywords through to each attention call. Inputs without them (a micro-batch of
short sequences, see ``StepRunner._forward``, or a rank's empty one) go to transformers' SDPA
with the mask they carry.

Rows of one long sequence step faster than with masked SDPA; rows of short packed sequences step
slower (the step is bound by launching kernels there), hence varlen only for rows longer than a
packed row (benchmarks/trainer_variants.py, docs/bench/history.md).

The kernel is torch's ``varlen_attn`` (FlashAttention 2). cuDNN's attention over the same offsets is
faster but not offered: a training step stopped with an illegal memory access, and on ragged
segments its gradients were wrong, not rounded (BENCHMARKS.md "Attention kernels, forward +
backward").
"""

from __future__ import annotations

import functools
import inspect

import torch

NAME = "areal_varlen"


def _varlen_attn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def available(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device and this torch has ``varlen_attn``."""
    return device.type == "cuda" and _varlen_attn() is not None


@functools.lru_cache(maxsize=16)
def _causal_kwargs(fn, scale: float | None, gqa: bool) -> dict:
    """Keywords for causal attention in whichever ``varlen_attn`` signature this torch has."""
    params = inspect.signature(fn).parameters
    kw = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if scale is not None and "scale" in params:
        kw["scale"] = scale
    if gqa and "enable_gqa" in params:
        kw["enable_gqa"] = True
    return kw


def varlen_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask, scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """transformers attention function: ``query`` ``[B, Hq, T, D]``, ``key``/``value`` ``[B, Hkv, T,
    D]``, segments given by ``cu_seq_lens_q`` over the ``B · T`` flattened tokens; returns
    ``([B, T, Hq, D], None)``. Without segments it is transformers' SDPA attention."""
    cu, longest = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cu is None or longest is None:  # inputs without segments (a rank's empty micro-batch): SDPA
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if dropout:
        raise ValueError(f"attention '{NAME}' has no dropout; the trainer sets every dropout to 0")
    b, hq, t, d = query.shape
    hkv = key.shape[1]
    fn = _varlen_attn()
    kw = dict(_causal_kwargs(fn, scaling, gqa=hkv != hq))
    if hkv != hq and "enable_gqa" not in kw:  # an older varlen_attn: repeat the key/value heads
        key, value = (x.repeat_interleave(hq // hkv, dim=1) for x in (key, value))
        hkv = hq
    if scaling is not None and "scale" not in kw and abs(scaling - d ** -0.5) > 1e-6:
        raise ValueError(f"attention '{NAME}': this torch's varlen_attn has no scale argument "
                         f"(model scale {scaling}); set trainer.varlen_attention=false")
    q = query.transpose(1, 2).reshape(b * t, hq, d)
    k = key.transpose(1, 2).reshape(b * t, hkv, d)
    v = value.transpose(1, 2).reshape(b * t, hkv, d)
    out = fn(q, k, v, cu, cu, longest, longest, **kw)
    return out.reshape(b, t, hq, d), None


def register() -> str:
    """Make ``varlen_attention`` an attention implementation of transformers; its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention)
    return NAME


def uses(model) -> bool:
    """Whether ``model`` runs its attention through ``varlen_attention``."""
    return getattr(model.config, "_attn_implementation", None) == NAME


def segments(lengths: list[int], device) -> tuple[torch.Tensor, int]:
    """``(cu_seqlens int32 [sequences + 1], longest sequence)`` of sequences of ``lengths`` tokens
    one after another in one row (``batching.pack`` with varlen)."""
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    return torch.tensor(bounds, dtype=torch.int32, device=device), max(lengths)

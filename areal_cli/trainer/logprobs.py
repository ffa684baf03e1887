"""Response-token logprobs and entropies with the output layer applied in chunks of positions.

The ``[tokens, vocab]`` logits of a whole micro-batch are never held: the output layer runs on
``chunk`` positions at a time, each chunk's float32 log-softmax is reduced at once to the
sampled token's logprob and the entropy, and under autograd each chunk is checkpointed (its
logits are recomputed in backward from the chunk's hidden states), so memory grows with the
chunk, not the micro-batch. The numbers are those of one full log-softmax: each row's
log-softmax only sees its own row.

With ``buckets`` the last, partial chunk is padded with zero rows up to a bucket size
(``batching.bucket``): the CPU's oneDNN caches keep one output-layer matmul per shape, and the
number of response tokens (so the last chunk's size) differs in every micro-batch. The padded
rows' outputs are dropped, so they add nothing to the values or the gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from areal_cli.trainer.batching import Inputs, autocast, bucket, to_rows
from areal_cli.trainer.timing import StepClock


def _reduce(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
            entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's logits to the targets' logprobs and the entropies."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # float32 log-softmax (float64 stays float64)
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    lp = logp_all.gather(-1, targets[:, None])[:, 0]
    # without a gradient (no entropy bonus) it comes after the last tensor backward needs, so a
    # checkpoint's recompute stops before it; with the bonus it flows through the same log-softmax
    with torch.set_grad_enabled(entropy_grad):
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return lp, ent


@functools.cache
def compiled_reduce() -> Callable:
    """``_reduce`` under ``torch.compile``: the float32 cast, log-softmax, gather and entropy of a
    chunk (and their backward) fused into a few kernels instead of about ten passes over the
    ``[chunk, vocab]`` logits. A model built with ``trainer.compile`` uses it
    (``compiled_head``)."""
    return torch.compile(_reduce)


def _chunk(head: Callable, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
           entropy_grad: bool = False, reduce: Callable = _reduce) -> tuple[torch.Tensor,
                                                                            torch.Tensor]:
    return reduce(head(hidden), targets, temperature, entropy_grad)


def chunked_logprobs(head: Callable, hidden: torch.Tensor, targets: torch.Tensor,
                     temperature: float,
                     chunk: int, buckets: int = 0, entropy_grad: bool = False,
                     reduce: Callable = _reduce) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprob, entropy)`` ``[tokens]`` of ``targets`` under ``softmax(head(hidden) / T)``,
    ``chunk`` positions at a time (checkpointed when a gradient is needed; the last chunk padded
    up to its ``buckets`` size); the entropy carries a gradient only with ``entropy_grad`` (an
    entropy bonus in the loss)."""
    if chunk < 1:
        raise ValueError(f"trainer.logprob_chunk_tokens must be at least 1, got {chunk}")
    grad = torch.is_grad_enabled() and hidden.requires_grad
    lps, ents = [], []
    for s in range(0, hidden.shape[0], chunk):
        h, t = hidden[s:s + chunk], targets[s:s + chunk]
        n = h.shape[0]
        if bucket(n, buckets) > n:
            h = torch.cat([h, h.new_zeros(bucket(n, buckets) - n, h.shape[1])])
            t = torch.cat([t, t.new_zeros(h.shape[0] - n)])
        args = (head, h, t, temperature, entropy_grad and grad, reduce)
        lp, ent = checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args)
        lps.append(lp[:n])
        ents.append(ent[:n])
    if not lps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(lps), torch.cat(ents)


def forward_logprobs(model, x: Inputs, dtype: torch.dtype, temperature: float, chunk: int,
                     buckets: int = 0,
                     entropy_grad: bool = False,
                     clock: StepClock | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob and entropy ``[n, width]`` of each response token of ``x`` (0 where not valid).

    The model's own forward runs (so FSDP gathers and frees the output layer as usual), with
    its output layer swapped for one that takes the kept hidden states at the response
    positions and returns their ``(logprob, entropy)``; the layer's own forward (e.g. the
    float32 head) computes each chunk's logits, under the same autocast; ``buckets`` pads the
    last chunk (see the module's docstring). The entropy is detached unless ``entropy_grad``.
    ``clock`` (a ``timing.StepClock``): marks the end of the layers' forward, of the head's forward
    and, in the backward that follows, of the head's backward (a hook on its input's gradient)."""
    head = model.get_output_embeddings()
    own = head.__dict__.get("forward")  # an instance override (float32_head) or the class's
    inner = head.forward
    reduce = compiled_reduce() if getattr(model, "compiled_head", False) else _reduce

    def logprob_head(kept: torch.Tensor) -> torch.Tensor:
        if clock is not None:
            clock.mark("forward")
            if kept.requires_grad:
                kept.register_hook(lambda _grad: clock.mark("head_backward"))
        lp, ent = chunked_logprobs(inner, kept[x.rows, x.cols], x.targets, temperature, chunk,
                                   buckets,
                                   entropy_grad, reduce)
        if clock is not None:
            clock.mark("head_forward")
        return torch.stack([lp, ent], dim=-1)

    head.forward = logprob_head
    try:
        with autocast(x.ids.device, dtype):
            out = model(**x.model_kwargs()).logits
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
    ent = out[:, 1] if entropy_grad else out[:, 1].detach()
    return to_rows(out[:, 0], x.valid), to_rows(ent, x.valid)

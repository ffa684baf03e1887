"""How much activation checkpointing a trainer rank on a GPU needs:
``trainer.activation_checkpointing=auto``.

Recomputing activations costs compute that MFU does not count
(BENCHMARKS.md "Qwen2.5-7B layout, 3 trainer ranks, no vLLM"). ``auto`` picks the least
recomputation whose estimated peak fits the trainer's card: none, every other layer, every layer.
The estimate, per rank, in bytes:

- weights, gradients and AdamW moments: P × (4 + 4 + 8, or 4 with bfloat16 moments) / ranks; with
  LoRA the frozen weights alone, in the compute dtype (2 bytes; 4 with trainer.dtype=float32; the
  adapters are a rounding error, except on a mixture of experts' routed experts
  (``trainer.lora.target_experts``): their adapters' float32 weights, gradients and moments, and
  each kept layer's experts merged with them, which the grouped GEMM keeps for its backward);
- the staged wire copy on rank 0 (``weights.staged``): P × 2;
- activations of one micro-batch of ``micro_batch_tokens``: a layer kept whole holds
  ``ACT_FACTOR × (18·hidden + 6·intermediate)`` bytes a token (its inputs and outputs, q/k/v, the
  MLP's gate, up and product; bf16 with a float32 residual), a checkpointed one its float32 input;
- the output layer's chunk: ``logprob_chunk_tokens`` × vocabulary × 4 bytes, three times (logits,
  log-softmax, their gradient);
- ``HEADROOM`` for the CUDA context, NCCL and the allocator.

The estimate errs high against the peaks in BENCHMARKS.md "Trainer throughput and memory", so
``auto`` errs towards more checkpointing, never towards an out-of-memory stop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

GIB = 1024 ** 3
ACT_FACTOR = 1.15
"""Bytes of a whole layer's activations per token, over 18·hidden + 6·intermediate (fitted high on
the 1.5B and 7B measurements above)."""
HEADROOM = 4 * GIB
FILL = 0.9
"""Fraction of the card's memory the estimate may take."""


@dataclass(frozen=True)
class Layout:
    """The sizes of a decoder-only model that set the trainer's memory (from its config.json)."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    expert_params: int = 0
    """Weights of the routed experts (every sparse layer)."""
    expert_io: int = 0
    """Σ over the routed experts' weights of (out + in): rank-r adapters on them hold r × this."""

    @classmethod
    def from_config(cls, path: Path) -> Layout:
        """A dense layout, or a mixture-of-experts one (``areal_cli.moe``): every expert's weights
        count in ``params``; ``intermediate`` is what one token runs through (its top-k experts and
        a shared expert), for the activations."""
        from areal_cli import moe

        c = json.loads((Path(path) / "config.json").read_text())
        c = c.get("text_config", c)
        h, inter = c["hidden_size"], c["intermediate_size"]
        n, v = c["num_hidden_layers"], c["vocab_size"]
        heads = c["num_attention_heads"]
        head_dim = c.get("head_dim") or h // heads
        kv = c.get("num_key_value_heads", heads) * head_dim
        attention = h * heads * head_dim * 2 + 2 * h * kv + 2 * h
        embed = v * h * (1 if c.get("tie_word_embeddings", False) else 2)
        config = SimpleNamespace(**c)
        sparse, k = set(moe.sparse_layers(config)), moe.top_k(config)
        expert, shared = moe.expert_widths(config)
        mlp = moe.mlp_params(config)
        # a token's MLP width: its top-k experts and a shared one in a sparse layer, else the dense
        widths = ([k * expert + shared] if sparse else []) + ([inter] if len(sparse) < n else [])
        experts = len(sparse) * moe.experts_of(config)
        return cls(params=n * attention + sum(mlp) + embed + h, layers=n, hidden=h,
                   intermediate=max(widths), vocab=v, expert_params=experts * 3 * h * expert,
                   expert_io=experts * (3 * expert + 2 * h))


def estimate_bytes(lay: Layout, *, ranks: int, micro_batch_tokens: int, every: int | None,
                   moments_bytes: int,
                   lora: bool, staged: bool, chunk: int, frozen_bytes: int = 2,
                   expert_rank: int = 0) -> int:
    """Estimated peak of trainer rank 0: ``every`` None = no checkpointing, k = every k-th layer;
    ``expert_rank``: the rank of adapters on the routed experts (0: none)."""
    grads = (lay.expert_io * expert_rank if lora else lay.params) * 4 / ranks
    whole = ACT_FACTOR * (18 * lay.hidden + 6 * lay.intermediate)
    # layers not recomputed
    kept = lay.layers if every is None else lay.layers - -(-lay.layers // every)
    inputs = (lay.layers - kept) * 4 * lay.hidden
    acts = micro_batch_tokens * (kept * whole + inputs + (whole if every is not None else 0))
    head = 3 * chunk * lay.vocab * 4
    # adapted experts: each kept layer's merged expert weights (one more while recomputing)
    merged = (lay.expert_params * frozen_bytes * (kept + (every is not None)) / lay.layers
              if expert_rank else 0)
    return int(_kept(lay, ranks, moments_bytes, lora, staged, frozen_bytes, expert_rank) + grads
               + acts + head + merged)


def resident_bytes(lay: Layout, *, ranks: int, moments_bytes: int, lora: bool,
                   staged: bool, frozen_bytes: int = 2, expert_rank: int = 0) -> int:
    """What trainer rank 0 keeps on its card between two steps (its gradients freed): weights and
    AdamW moments, the staged wire copy, ``HEADROOM``. With ``cluster.share=alternate`` the engine
    wakes beside this much at each update."""
    return int(_kept(lay, ranks, moments_bytes, lora, staged, frozen_bytes, expert_rank))


def _kept(lay: Layout, ranks: int, moments_bytes: int, lora: bool, staged: bool,
          frozen_bytes: int = 2, expert_rank: int = 0) -> float:
    """Bytes of weights and AdamW moments per rank (with LoRA the frozen weights alone), the staged
    wire copy and ``HEADROOM``: what a rank holds outside a step's gradients and activations."""
    per_param = frozen_bytes if lora else 4 + moments_bytes
    adapters = lay.expert_io * expert_rank * (4 + moments_bytes) if lora else 0
    return ((lay.params * per_param + adapters) / ranks + (2 * lay.params if staged else 0)
            + HEADROOM)


def choose(lay: Layout, card_bytes: int, **kw) -> tuple[int | None, int]:
    """``(every, estimate)``: the least checkpointing (None, then 2, then 1) whose estimate fits
    ``FILL`` of the card; every layer (1) when none does."""
    for every in (None, 2, 1):
        need = estimate_bytes(lay, every=every, **kw)
        if need <= FILL * card_bytes:
            break
    return every, need

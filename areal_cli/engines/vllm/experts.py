"""Mixture-of-experts weights into vLLM's fused experts, in place (``inplace.py``).

vLLM keeps a sparse layer's experts in two parameters of its FusedMoE layer: ``w13_weight``
``[experts, 2·inner/TP, hidden]`` (each expert's gate rows, then its up rows) and ``w2_weight``
``[experts, hidden, inner/TP]``; their ``weight_loader(param, weight, weight_name, shard_id,
expert_id)`` writes one expert's gate ("w1"), up ("w3") or down ("w2") matrix, keeping this TP
rank's slice. What the trainer sends (transformers 5's names) reaches them here:

- fused 3D tensors, ``<layer>.mlp.experts.gate_up_proj`` ``[experts, 2·inner, hidden]`` (gate rows,
  then up rows) and ``<layer>.mlp.experts.down_proj`` ``[experts, hidden, inner]``: one loader call
  per expert and shard, as vLLM's own ``RoutedExperts.load_weights`` does for such a checkpoint;
- one expert's matrices, ``<layer>.mlp.experts.<e>.gate_proj.weight`` (or Mixtral's ``w1``/``w3``/
  ``w2``), as in the per-expert checkpoints on the Hub.

vLLM names Mixtral's sparse block ``block_sparse_moe`` where transformers 5 says ``mlp``
(``ALIASES``). Only the unquantized Triton kernels keep the loaders' layout; a backend that
re-lays the weights out after loading (FlashInfer, AITER) is refused (``check_backends``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

FUSED = {"gate_up_proj": ("w13_weight", ("w1", "w3")), "down_proj": ("w2_weight", ("w2",))}
"""transformers 5's fused expert tensor → (vLLM's parameter, the shard ids its rows split into)."""

PER_EXPERT = {"gate_proj": ("w13_weight", "w1"), "up_proj": ("w13_weight", "w3"),
              "down_proj": ("w2_weight", "w2"), "w1": ("w13_weight", "w1"),
              "w3": ("w13_weight", "w3"), "w2": ("w2_weight", "w2")}
"""One expert's matrix → (vLLM's parameter, its shard id)."""

ALIASES = ((".mlp.", ".block_sparse_moe."),)
"""(transformers' module, vLLM's) for a layout whose vLLM model names its sparse block otherwise."""

LOADER_LAYOUT_BACKENDS = {"TRITON", "BATCHED_TRITON"}
"""vLLM's unquantized MoE backends that run on the weights as the loaders write them."""

_FUSED = re.compile(r"^(?P<block>.+)\.experts\.(?P<leaf>gate_up_proj|down_proj)$")
_ONE = re.compile(r"^(?P<block>.+)\.experts\.(?P<e>\d+)\.(?P<leaf>\w+)\.weight$")


@dataclass(frozen=True)
class Experts:
    """How one checkpoint tensor reaches a FusedMoE parameter through its weight loader."""

    weight_name: str  # vLLM's parameter leaf ("w13_weight"), which its loader reads
    shards: tuple[str, ...]  # shard ids the tensor's rows split into, in order
    expert: int | None  # the one expert of a 2D tensor; None: a fused [experts, ...] tensor


def find(name: str, params) -> str | None:
    """``name``, or its alias among ``params`` (the engine's parameter names), or None."""
    if name in params:
        return name
    for ours, theirs in ALIASES:
        if ours in name and name.replace(ours, theirs, 1) in params:
            return name.replace(ours, theirs, 1)
    return None


def expert_route(name: str, params) -> tuple[str, Experts] | None:
    """(the engine's FusedMoE parameter, how to load) for an expert tensor of the checkpoint; None
    where ``name`` is none (or the engine has no such fused parameter: a dense MLP)."""
    m = _FUSED.match(name)
    if m:
        leaf, shards = FUSED[m["leaf"]]
        expert = None
    else:
        m = _ONE.match(name)
        if m is None or m["leaf"] not in PER_EXPERT:
            return None
        leaf, shard = PER_EXPERT[m["leaf"]]
        shards, expert = (shard,), int(m["e"])
    target = fused_param(m["block"], leaf, params)
    return None if target is None else (target, Experts(leaf, shards, expert))


def fused_param(block: str, leaf: str, params) -> str | None:
    """The engine's ``<block>.experts.[…].<leaf>`` (vLLM 0.26 nests it in ``routed_experts``)."""
    for b in (block, *((block + ".").replace(o, t, 1)[:-1] for o, t in ALIASES)):
        for mid in ("", "routed_experts."):
            if f"{b}.experts.{mid}{leaf}" in params:
                return f"{b}.experts.{mid}{leaf}"
    return None


def check_shape(name: str, shape, how: Experts, param_shape) -> None:
    """ValueError naming engine.weight_update=reload where a fused tensor does not match its
    parameter: another expert count (expert parallelism), or a hidden size on another axis."""
    if how.expert is not None:
        return  # a 2D matrix: the loader's own copy checks it
    hidden_axis = -1 if how.weight_name == "w13_weight" else 1
    if (len(shape) != 3 or shape[0] != param_shape[0]
            or shape[hidden_axis] != param_shape[hidden_axis]
            or shape[1 if hidden_axis == -1 else 2] % len(how.shards)):
        raise ValueError(f"engine.weight_update=inplace: {name} of shape {list(shape)} does not "
                         f"fit the engine's {how.weight_name} of shape {list(param_shape)}; set "
                         "engine.weight_update=reload")


def pieces(tensor: torch.Tensor, how: Experts):
    """(expert id, shard id, matrix) of every loader call ``tensor`` takes."""
    experts = tensor.unbind(0) if how.expert is None else (tensor,)
    first = 0 if how.expert is None else how.expert
    for e, w in enumerate(experts, start=first):
        for shard, part in zip(how.shards, w.chunk(len(how.shards), dim=0), strict=True):
            yield e, shard, part


def load_experts(param: torch.nn.Parameter, tensor: torch.Tensor, how: Experts) -> None:
    """``tensor`` written into ``param`` (a FusedMoE parameter or its shadow) by its loader."""
    loader = param.weight_loader
    for e, shard, part in pieces(tensor, how):
        loader(param, part, how.weight_name, shard, e)


def check_backends(backends: dict[str, str]) -> None:
    """``backends``: FusedMoE layer → vLLM's unquantized MoE backend name. ValueError naming
    engine.weight_update=reload where one re-lays the weights out after loading."""
    other = sorted({b for b in backends.values() if b not in LOADER_LAYOUT_BACKENDS})
    if other:
        raise ValueError(f"engine.weight_update=inplace: vLLM runs these experts with {other}, "
                         "which re-lay the weights out after loading; set "
                         "engine.weight_update=reload")


def moe_backends(model: torch.nn.Module) -> dict[str, str]:
    """Each FusedMoE layer of vLLM's ``model`` (a module holding ``w13_weight``) → its backend."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(getattr(module, "w13_weight", None), torch.Tensor):
            method = getattr(module, "quant_method", None)
            method = getattr(method, "old_quant_method", method)  # wrapped for all2all (EP)
            backend = getattr(method, "unquantized_backend", None)
            out[name] = getattr(backend, "name", str(backend))
    return out

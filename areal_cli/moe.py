"""Mixture-of-experts layers: which experts each token went to, recorded by an engine and forced in
the trainer (routing replay), and the router's load-balancing loss.

transformers (5.x) gives every supported layout (``architectures.MOE``) a router module per sparse
layer: ``forward(hidden [N, H]) -> (logits [N, E], weights [N, k], experts [N, k])``, softmax
over the logits, the top-k, renormalised where the layout does (``norm_topk_prob``; Mixtral always).
``Routers.install`` wraps each router's forward (the module and its parameters stay as they are):

- ``record``: the forward's chosen experts are kept, one ``[N, k]`` per sparse layer (the engine);
- ``force``: a ``[N, layers, k]`` tensor of expert ids (-1: the router's own choice for that token)
  replaces the top-k, and the weights are recomputed from the live router's probabilities of the
  forced experts, so the router still gets its gradient (the trainer); the tensor stays set until
  the next ``force``, so activation recomputation in backward forces the same experts;
- ``collect``: the forward's router logits are kept for ``aux_loss``.

A routing on the wire (``Sample.routed_experts``) is ``[positions, layers, k]`` of the trajectory's
tokens (prompt then output), in ``routing_dtype``; a position's row is that of the last forward the
engine ran over it (a re-prefill after a weight update or another turn writes it again), and a
position the engine never ran (the last token) has none: the trainer routes it itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from areal_cli.architectures import MOE

EXPERTS_IMPLEMENTATION = "grouped_mm"
"""transformers' experts implementation for every MoE model here: the (token, expert) pairs sorted
by expert, then torch's grouped matmul over per-expert offsets, forward and backward; many times
faster than the modelling code's loop over experts and than ``batched_mm`` on the CPU
(``benchmarks/moe_experts.py``, BENCHMARKS.md "Mixture-of-experts layers")."""


def is_moe(model_path) -> bool:
    """Whether the checkpoint at ``model_path`` (its config.json) is of an MoE layout of ``MOE``."""
    config = Path(model_path) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("model_type") in MOE


def load_kwargs(model_path) -> dict:
    """``from_pretrained``'s extra keywords for the model at ``model_path``: the experts
    implementation of an MoE model, nothing for a dense one."""
    return {"experts_implementation": EXPERTS_IMPLEMENTATION} if is_moe(model_path) else {}


def sparse_layers(config) -> list[int]:
    """Indices of the decoder layers with a sparse (routed) MLP, from a transformers config."""
    n = config.num_hidden_layers
    if not experts_of(config):
        return []
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    return [i for i in range(n) if i not in dense and (i + 1) % step == 0]


def experts_of(config) -> int:
    """Routed experts per sparse layer (0: a dense model)."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    return 0


def top_k(config) -> int:
    return int(getattr(config, "num_experts_per_tok", 0) or 0)


def expert_widths(config) -> tuple[int, int]:
    """(a routed expert's inner width, the shared expert's: 0 without one), from a transformers
    config (or a namespace of its config.json)."""
    # OLMoE and Mixtral give an expert's width as intermediate_size
    expert = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    return expert, getattr(config, "shared_expert_intermediate_size", None) or 0  # Qwen2-MoE


def mlp_params(config) -> list[int]:
    """Each decoder layer's MLP parameters, from a transformers config (or a namespace of its
    config.json): a sparse layer counts every routed expert, its router and a shared expert
    (Qwen2-MoE); a dense layer its gated MLP."""
    h, inter = config.hidden_size, config.intermediate_size
    sparse, experts = set(sparse_layers(config)), experts_of(config)
    expert, shared = expert_widths(config)
    routed = experts * 3 * h * expert + h * experts + (3 * h * shared + h if shared else 0)
    return [routed if i in sparse else 3 * h * inter for i in range(config.num_hidden_layers)]


def routing_dtype(experts: int) -> np.dtype:
    """The wire dtype of expert ids: one byte up to 256 experts, else two."""
    return np.dtype(np.uint8) if experts <= 256 else np.dtype(np.int16)


def router_of(layer) -> torch.nn.Module | None:
    """The router of a decoder layer (``mlp.gate`` returning logits, weights and experts)."""
    mlp = getattr(layer, "mlp", None)
    gate = getattr(mlp, "gate", None)
    return gate if gate is not None and hasattr(mlp, "experts") else None


class Routers:
    """The wrapped routers of one model, in sparse-layer order (see the module docstring)."""

    def __init__(self, routers: list[torch.nn.Module], experts: int, k: int):
        self.routers, self.experts, self.k = routers, experts, k
        self.forced: torch.Tensor | None = None  # [N, layers, k] int64
        self.record = False
        self.recorded: list[torch.Tensor | None] = [None] * len(routers)
        self.collect = False
        self.logits: list[torch.Tensor] = []  # collected: each sparse layer's router logits
        self.chosen: list[torch.Tensor] = []  # and the experts it used

    @classmethod
    def install(cls, model) -> Routers | None:
        """Wrap the routers of ``model``'s sparse layers (None for a dense model); kept on the model
        as ``model.routers``."""
        config = model.config
        layers = model.get_decoder().layers
        found = [router_of(layers[i]) for i in sparse_layers(config)]
        if not found:
            return None
        if any(r is None for r in found):
            raise ValueError(f"model_type={config.model_type}: a sparse layer has no router "
                             "(mlp.gate) where transformers' MoE layouts have one")
        routers = cls(found, experts_of(config), top_k(config))
        for i, r in enumerate(found):
            r.forward = routers._wrap(i, r, r.forward)
        model.routers = routers
        return routers

    @property
    def layers(self) -> int:
        return len(self.routers)

    def force(self, forced: torch.Tensor | None) -> None:
        """Route by ``forced`` ``[N, layers, k]`` (-1 rows: the router's own choice) from the next
        forward on; None: every token routed by the router."""
        if forced is not None:
            if forced.dim() != 3 or forced.shape[1:] != (self.layers, self.k):
                raise ValueError(f"a routing of shape {tuple(forced.shape)}: this model routes "
                                 f"[tokens, {self.layers} sparse layers, top-{self.k}]")
            if bool((forced >= self.experts).any()):
                raise ValueError(f"a routing names expert {int(forced.max())}: this model has "
                                 f"{self.experts} experts per layer")
            forced = forced.long()
        self.forced = forced

    def take_recorded(self) -> torch.Tensor:
        """``[N, layers, k]`` experts of the last forward (``record`` on)."""
        if any(r is None for r in self.recorded):
            raise RuntimeError("no routing recorded: record was off or no forward ran")
        out = torch.stack(self.recorded, dim=1)
        self.recorded = [None] * self.layers
        return out

    def take_collected(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The router logits and the experts used, per sparse layer, of the forwards since the
        last call (``collect`` on, gradients enabled)."""
        out = (self.logits, self.chosen)
        self.logits, self.chosen = [], []
        return out

    def _wrap(self, layer: int, router, inner):
        normalise = bool(getattr(router, "norm_topk_prob", True))

        def forward(hidden_states):
            logits, weights, experts = inner(hidden_states)
            if self.forced is not None:
                experts, weights = self._forced(layer, logits, weights, experts, normalise)
            if self.record:
                self.recorded[layer] = experts.detach()
            if self.collect and torch.is_grad_enabled():
                self.logits.append(logits)
                self.chosen.append(experts.detach())
            return logits, weights, experts

        return forward

    def _forced(self, layer, logits, weights, experts, normalise: bool):
        forced = self.forced[:, layer].to(experts.device)
        if forced.shape[0] != experts.shape[0]:
            raise RuntimeError(f"routing replay: {forced.shape[0]} routed tokens forced where the "
                               f"forward routes {experts.shape[0]}")
        live = (forced < 0).any(-1, keepdim=True)
        experts = torch.where(live, experts, forced)
        top = torch.softmax(logits.float(), dim=-1).gather(-1, experts)
        if normalise:
            top = top / top.sum(dim=-1, keepdim=True)
        return experts, top.to(weights.dtype)


def aux_loss(logits: list[torch.Tensor], chosen: list[torch.Tensor], n_experts: int,
             real: torch.Tensor | None = None) -> torch.Tensor:
    """The switch-transformer load-balancing loss, as transformers' ``load_balancing_loss_func``:
    ``E · Σ_e f_e · P_e`` over every sparse layer's tokens together, f_e the routed slots that went
    to expert e per token (the experts used: the forced ones under replay; no gradient), P_e the
    mean router probability of e; top-k when perfectly balanced. ``real`` ``[N]`` bool: the tokens
    that count (not padding)."""
    probs = torch.cat([torch.softmax(x.float(), dim=-1) for x in logits])
    experts = torch.cat(chosen)
    mask = (torch.ones(probs.shape[0], device=probs.device) if real is None
            else real.reshape(-1).to(probs.device).float().repeat(len(logits)))
    counts = torch.zeros(n_experts, device=probs.device).scatter_add_(
        0, experts.reshape(-1), mask.repeat_interleave(experts.shape[1]))
    tokens = mask.sum().clamp(min=1)
    mean_prob = (probs * mask[:, None]).sum(0) / tokens
    return n_experts * (counts / tokens * mean_prob).sum()

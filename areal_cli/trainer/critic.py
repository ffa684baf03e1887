"""The critic of PPO (``adv_estimator: gae``): the policy's base model with a scalar value head
on the last hidden state, FSDP-sharded like the actor, trained by its own AdamW.

The head replaces ``lm_head``, so the model's own forward (and ``logits_to_keep``) gives one
value per kept position: V(s_t) is read at the position that predicts response token t.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from areal_cli.config.schema import RootConfig
from areal_cli.trainer.batching import (
    Rollouts,
    dummy_forward,
    forward,
    merge_stats,
    model_inputs,
    to_rows,
)
from areal_cli.trainer.loss import STAT_REDUCTIONS, value_loss
from areal_cli.trainer.loss_scale import LossScale


def build_value_model(model_path: Path, device: torch.device, compute_dtype: torch.dtype,
                      seed: int, shard: bool = True):
    """fp32 master weights, a ``Linear(hidden, 1)`` head (same init on every rank), sharded per
    decoder layer and at the root as ``model.build_policy`` shards the actor (``shard``: the
    resolved trainer.shard)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.config.use_cache = False
    model.config.tie_word_embeddings = False
    hidden = model.config.hidden_size
    head = torch.nn.Linear(hidden, 1)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # OpenRLHF's value-head init: N(0, 1/(hidden+1)), zero bias
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) / (hidden + 1))
        head.bias.zero_()
    model.lm_head = head
    model = model.to(device)
    if not shard:
        return model
    mp = (MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
          if device.type == "cuda" else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


class Critic:
    def __init__(self, model, cfg: RootConfig, device: torch.device, compute_dtype: torch.dtype,
                 world: int):
        self.model, self.cfg, self.device = model, cfg, device
        self.dtype, self.world = compute_dtype, world
        self.scale = LossScale(compute_dtype == torch.float16)
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.algorithm.critic_lr,
                                     weight_decay=cfg.trainer.weight_decay, fused=True)

    @classmethod
    def load(cls, model_path: Path, cfg: RootConfig, device, compute_dtype, world: int) -> Critic:
        return cls(build_value_model(model_path, device, compute_dtype, cfg.seed,
                                     shard=cfg.trainer.shard != "false"), cfg, device,
                   compute_dtype, world)

    def _values(self, ro: Rollouts, mb: list[int]) -> torch.Tensor:
        t = self.cfg.trainer
        x = model_inputs(ro, mb, t.packing == "true", buckets=t.shape_buckets).to(self.device)
        return to_rows(forward(self.model, x, self.dtype)[:, 0], x.valid)

    @torch.no_grad()
    def values(self, ro: Rollouts, mbs: list[list[int]]) -> torch.Tensor:
        """``[N, L]`` values of this rank's rows (the rows of ``mbs``), 0 elsewhere."""
        out = torch.zeros(ro.loss_mask.shape, device=self.device)
        for mb in mbs:
            if not mb:
                dummy_forward(self.model, self.device, self.dtype, backward=False)
                continue
            out[mb] = self._values(ro, mb)
        return out

    def train(self, ro: Rollouts, mbs: list[list[int]], old_values: torch.Tensor,
              returns: torch.Tensor,
              global_tokens: float, max_len: int) -> tuple[dict, torch.Tensor]:
        """One AdamW step on the clipped value loss × value_coef; (merged stats, grad norm)."""
        alg = self.cfg.algorithm
        self.opt.zero_grad(set_to_none=True)
        stats: dict[str, torch.Tensor] = {}
        for mb in mbs:
            if not mb:
                dummy_forward(self.model, self.device, self.dtype, backward=True)
                continue
            mask = ro.loss_mask[mb].to(self.device)
            loss, st = value_loss(self._values(ro, mb), old_values[mb], returns[mb], mask,
                                  alg.value_clip,
                                  mode=alg.loss_agg, global_tokens=global_tokens,
                                  global_seqs=float(ro.n), max_len=max_len)
            # FSDP averages over ranks
            (alg.value_coef * loss * (self.world * self.scale.value)).backward()
            merge_stats(stats, st, STAT_REDUCTIONS)
        self.scale.unscale_(self.model.parameters())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                   self.cfg.trainer.grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        if self.scale.update(grad_norm) and bool(torch.isfinite(grad_norm)):  # no inf/NaN step
            self.opt.step()
        return stats, grad_norm

"""One training step: advantages on the whole batch, this rank's shard, proximal logprobs,
token-budget micro-batches, the decoupled PPO loss, clipping, AdamW."""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from areal_cli.config.schema import RootConfig
from areal_cli.trainer.advantages import compute_advantages
from areal_cli.trainer.batching import from_batch, left_pad, micro_batches, response_logprobs, shard
from areal_cli.trainer.loss import STAT_REDUCTIONS, policy_loss, shape_rewards


class StepRunner:
    def __init__(self, model, cfg: RootConfig, device, compute_dtype, rank: int, world: int):
        self.model, self.cfg, self.device = model, cfg, device
        self.dtype, self.rank, self.world = compute_dtype, rank, world
        t = cfg.trainer
        self.opt = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay,
                                     betas=(0.9, 0.999), eps=1e-8)
        warm = max(1, t.warmup_steps)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / warm))
        self.pad = 0

    def _autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def train(self, batch) -> dict:
        cfg, alg = self.cfg, self.cfg.algorithm
        ro = from_batch(batch)
        lengths = torch.tensor([len(r) for r in ro.responses], dtype=torch.float32)
        max_len = cfg.rollout.max_new_tokens * max(1, cfg.workflow.max_turns)
        rewards = shape_rewards(ro.rewards.double(), lengths, alg, cfg.rollout.max_new_tokens).float()
        adv, _ = compute_advantages(rewards, ro.loss_mask, alg, group_size=ro.group_size)
        global_tokens = float(ro.loss_mask.sum())
        rows = list(shard(ro.n, self.rank, self.world))
        full_lens = [len(ro.prompts[i]) + len(ro.responses[i]) for i in rows]
        count = torch.tensor(len(micro_batches(full_lens, cfg.trainer.micro_batch_tokens)))
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        mbs = [[rows[j] for j in mb] for mb in micro_batches(full_lens, cfg.trainer.micro_batch_tokens,
                                                             int(count))]
        t0 = time.perf_counter()
        prox = self._proximal(ro, mbs) if self._needs_proximal() else {}
        for _epoch in range(cfg.algorithm.ppo_epochs):
            stats, loss_total, grad_norm = self._optimizer_step(ro, adv, mbs, prox, global_tokens, max_len)
        elapsed = time.perf_counter() - t0
        out = self._reduce(stats, global_tokens)
        lt = torch.tensor([loss_total])
        dist.all_reduce(lt)
        trained = float(ro.loss_mask.sum())
        m = ro.loss_mask
        out.update(loss=float(lt) / self.world, grad_norm=float(grad_norm), trained_tokens=int(trained),
                   train_tokens_per_s=trained / elapsed, lr=self.sched.get_last_lr()[0],
                   adv_mean=float(adv[m].mean()) if m.any() else 0.0,
                   adv_std=float(adv[m].std()) if m.sum() > 1 else 0.0,
                   micro_batches=len(mbs))
        return out

    def _optimizer_step(self, ro, adv, mbs, prox, global_tokens, max_len):
        stats: dict[str, torch.Tensor] = {}
        self.opt.zero_grad(set_to_none=True)
        loss_total = 0.0
        for mb in mbs:
            loss, st = self._micro_step(ro, adv, mb, prox, global_tokens, max_len)
            loss_total += float(loss)
            for k, v in st.items():
                if k not in stats:
                    stats[k] = v
                elif STAT_REDUCTIONS.get(k) == "max":
                    stats[k] = torch.maximum(stats[k], v)
                else:
                    stats[k] = stats[k] + v
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        self.opt.step()
        self.sched.step()
        return stats, loss_total, grad_norm

    def _needs_proximal(self) -> bool:
        """A separate no-grad pass is only needed when several optimizer steps use one batch;
        with one step per batch π_prox is exactly the current weights, so the loss takes
        ``logp.detach()`` from the same forward (same numbers, a third less compute)."""
        alg, r = self.cfg.algorithm, self.cfg.rollout
        return alg.ppo_epochs > 1 and (alg.recompute_proximal or r.max_staleness > 0)

    def _forward(self, ro, mb):
        rows = [ro.prompts[i] + ro.responses[i] for i in mb]
        resp = [len(ro.responses[i]) for i in mb]
        ids, att, pos = (t.to(self.device) for t in left_pad(rows, self.pad))
        with self._autocast():
            logits = self.model(input_ids=ids, attention_mask=att, position_ids=pos,
                                logits_to_keep=max(resp) + 1).logits
        return response_logprobs(logits, ids, resp, ro.loss_mask.shape[1], self.cfg.rollout.temperature)

    @torch.no_grad()
    def _proximal(self, ro, mbs) -> dict[int, torch.Tensor]:
        out = {}
        for mb in mbs:
            if not mb:
                self._dummy_forward(backward=False)
                continue
            lp, _ = self._forward(ro, mb)
            for j, i in enumerate(mb):
                out[i] = lp[j].cpu()
        return out

    def _dummy_forward(self, backward: bool):
        ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        with self._autocast():
            logits = self.model(input_ids=ids).logits
        if backward:
            (logits.float().sum() * 0.0).backward()
        return torch.zeros(()), {}

    def _micro_step(self, ro, adv, mb, prox, global_tokens, max_len):
        if not mb:
            return self._dummy_forward(backward=True)
        logp, ent = self._forward(ro, mb)
        dev = logp.device
        mask = ro.loss_mask[mb].to(dev)
        behav = ro.behav_logp[mb].to(dev)
        if prox:
            prox_lp = torch.stack([prox[i] for i in mb]).to(dev)
        elif self.cfg.algorithm.recompute_proximal or self.cfg.rollout.max_staleness > 0:
            prox_lp = logp.detach()
        else:
            prox_lp = None  # synchronous and not recomputed: π_prox = μ
        loss, st = policy_loss(logp, prox_lp, behav, adv[mb].to(dev), mask, self.cfg.algorithm,
                               global_tokens=global_tokens, global_seqs=float(ro.n), max_len=max_len,
                               entropy=ent)
        # FSDP averages gradients over ranks; the loss is already a share of the global mean
        (loss * self.world).backward()
        return loss.detach(), st

    def _reduce(self, stats: dict, global_tokens: float) -> dict:
        out = {}
        for k in sorted(stats):
            v = stats[k].detach().float().reshape(1).cpu()
            how = STAT_REDUCTIONS.get(k, "sum")
            dist.all_reduce(v, op=dist.ReduceOp.MAX if how == "max" else dist.ReduceOp.SUM)
            out[k] = float(v) / global_tokens if how == "mean" else float(v)
        return out

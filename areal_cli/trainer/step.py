"""One training step: this rank's shard in token-budget micro-batches, reference logprobs and
critic values, advantages on the whole batch, the decoupled PPO loss, AdamW; then the critic's
clipped value loss and its AdamW.

Rows whose every advantage is 0 (a group whose samples all got the same reward, under GRPO)
contribute exactly 0 to the policy loss and its gradient when no KL or entropy term is in the
loss: they are left out of the policy's forward and backward (``trainer.skip_zero_advantage``),
while every denominator of the loss still counts them. A step whose gradient norm is not
finite is not taken, in every dtype."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from areal_cli import faults
from areal_cli.config.choices import OptimState
from areal_cli.config.schema import RootConfig
from areal_cli.moe import aux_loss
from areal_cli.trainer import varlen as varlen_attention
from areal_cli.trainer.advantages import compute_advantages
from areal_cli.trainer.batching import (
    Rollouts,
    dummy_forward,
    from_batch,
    merge_stats,
    micro_batches,
    model_inputs,
    packed_row_tokens,
    prompt_units,
    reduce_stats,
    shard,
    to_device,
)
from areal_cli.trainer.logprobs import forward_logprobs
from areal_cli.trainer.loss import (
    POLICY_STATS,
    STAT_REDUCTIONS,
    kl_penalty,
    policy_loss,
    shape_rewards,
)
from areal_cli.trainer.loss_scale import LossScale
from areal_cli.trainer.metrics import MFU, memory_stats
from areal_cli.trainer.precompile import compiled_graphs, precompile
from areal_cli.trainer.schedule import lr_factor
from areal_cli.trainer.timing import StepClock

PACKED_ROW_TOKENS_CPU = 512
"""Token budget of a packed micro-batch on CPU (see ``StepRunner._micro_batches``)."""


PROBE_SUMS = ("logp_gap_free_sum", "routed_slots", "routing_flips")
"""algorithm.routing_probe's sums over a step's micro-batches and ranks (``StepRunner._probe``)."""


class StepRunner:
    def __init__(self, model, cfg: RootConfig, device, compute_dtype, rank: int, world: int,
                 critic=None, reference=None):
        self.model, self.cfg, self.device = model, cfg, device
        self.dtype, self.rank, self.world = compute_dtype, rank, world
        self.critic, self.reference = critic, reference
        t = cfg.trainer
        # fused: one pass over each tensor, several times cheaper on the CPU than the foreach
        # AdamW (BENCHMARKS.md "Small costs behind defaults"); the same update
        if t.optim_state == OptimState.auto:
            raise ValueError("trainer.optim_state=auto: resolve the config first "
                             "(areal_cli.config.resolve)")
        # with LoRA: the adapters alone
        trainable = [p for p in model.parameters() if p.requires_grad]
        # resolved for this device when the run was planned
        if t.optim_state == OptimState.bfloat16:
            from areal_cli.trainer.optim import AdamWBF16State

            self.opt = AdamWBF16State(trainable, lr=t.lr, weight_decay=t.weight_decay,
                                      betas=(0.9, 0.999), eps=1e-8, seed=cfg.seed)
        else:
            self.opt = torch.optim.AdamW(trainable, lr=t.lr, weight_decay=t.weight_decay,
                                         betas=(0.9, 0.999), eps=1e-8, fused=True)
        total = t.steps * cfg.algorithm.ppo_epochs  # the schedule counts optimizer steps
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_factor(s, total, t.warmup_steps, t.lr_decay, t.min_lr_ratio))
        self.packing = t.packing == "true"
        self.varlen = self.packing and varlen_attention.uses(model)
        self.scale = LossScale(compute_dtype == torch.float16)
        self.skipped_steps = 0
        # parameters whose gradient held a NaN/inf at the last skipped step
        self.nonfinite: list[str] = []
        self.mfu = MFU(model.config, device, t.peak_flops, world, frozen=t.lora.rank > 0)
        # MoE: the wrapped routers (moe.Routers); their experts forced from the engine's routing
        self.routers = getattr(model, "routers", None)
        self.replay = self.routers is not None and cfg.algorithm.routing_replay
        self.probe = self.replay and cfg.algorithm.routing_probe  # the unreplayed gap, measured
        # one row per prompt, its samples' responses after it (batching.share_prompts)
        self.share = t.shared_prompts == "true" and not self.packing and not self.replay
        self.real = None  # the last micro-batch's [rows, T] real tokens (Inputs.real)
        self.clock = StepClock(device)

    @classmethod
    def build(cls, model, model_path: Path, cfg: RootConfig, device, compute_dtype, rank: int,
              world: int) -> StepRunner:
        """The runner with the critic (gae) and the frozen reference (kl_coef > 0) it needs."""
        from areal_cli.trainer.critic import Critic
        from areal_cli.trainer.reference import Reference

        alg = cfg.algorithm
        critic = (Critic.load(model_path, cfg, device, compute_dtype, world)
                  if alg.needs_critic else None)
        t = cfg.trainer
        reference = (Reference(model_path, device, compute_dtype, t.packing == "true",
                               cfg.rollout.temperature,
                               t.logprob_chunk_tokens, t.shape_buckets)
                     if alg.needs_reference else None)
        return cls(model, cfg, device, compute_dtype, rank, world, critic=critic,
                   reference=reference)

    def train(self, batch, version: int | None = None) -> dict:
        """One batch: advantages, then ``ppo_epochs`` optimizer steps. ``version``: the policy
        version of the current weights; the tokens of sequences sampled wholly with it are compared
        with the first forward (``logp_gap_fresh``: mean |log π_θ − log μ| where both are the same
        weights)."""
        cfg, clock = self.cfg, self.clock
        clock.start()
        graphs = compiled_graphs()
        ro = from_batch(batch)
        mbs = self._micro_batches(ro)
        global_tokens = float(ro.loss_mask.sum())
        max_len = cfg.rollout.max_new_tokens * max(1, cfg.workflow.max_turns)
        lr = self.sched.get_last_lr()[0]  # the rate of this batch's (first) optimizer step
        t0 = time.perf_counter()
        clock.mark("prepare")
        ref = values = prox = None
        if self.reference:
            ref = self._all_rows(self.reference.logprobs(ro, mbs))
            clock.mark("reference")
        if self.critic:
            values = self._all_rows(self.critic.values(ro, mbs))
            clock.mark("critic_values")
        adv, returns, kl_stats = self._advantages(ro, ref, values)
        keep = self._contributing(ro, adv)
        pmbs = mbs if bool(keep.all()) else self._micro_batches(ro, keep)
        clock.mark("prepare")
        if self._needs_proximal():
            prox = self._proximal(ro, pmbs)
            clock.mark("proximal")
        gap = {}
        for epoch in range(cfg.algorithm.ppo_epochs):
            stats, loss_total, grad_norm = self._optimizer_step(ro, adv, pmbs, prox, ref,
                                                                global_tokens, max_len,
                                                                version if epoch == 0 else None)
            # every rank all-reduces both, fresh tokens or not
            if epoch == 0 and version is not None:
                gap = {k: stats.pop(k, torch.zeros((), device=self.device))  # one tensor each
                       for k in ("logp_gap_sum", "fresh_tokens") + PROBE_SUMS * self.probe}
            if self.critic:
                vstats, vnorm = self.critic.train(ro, mbs, values, returns, global_tokens, max_len)
                clock.mark("critic_train")
        elapsed = time.perf_counter() - t0
        # the "mean" stats of the loss are over these tokens
        forwarded = float(ro.loss_mask[keep].sum())
        out = reduce_stats({**stats, **gap}, STAT_REDUCTIONS, max(1.0, forwarded), self.device)
        out.update(reduce_stats(kl_stats, STAT_REDUCTIONS, global_tokens, self.device))
        fresh, gap_sum = out.pop("fresh_tokens", 0.0), out.pop("logp_gap_sum", 0.0)
        if fresh:
            out.update(logp_gap_fresh=gap_sum / fresh, fresh_tokens=int(fresh))
        if self.probe:  # algorithm.routing_probe
            free, slots, flips = (out.pop(k, 0.0) for k in PROBE_SUMS)
            if fresh:
                out["logp_gap_fresh_free"] = free / fresh
            if slots:
                out["routing_flip_fraction"] = flips / slots
        if self.critic:
            out.update(reduce_stats(vstats, STAT_REDUCTIONS, global_tokens, self.device),
                       critic_grad_norm=float(vnorm), value_mean=_masked_mean(values, ro.loss_mask))
        lt = torch.as_tensor(loss_total, dtype=torch.float32, device=self.device).reshape(1).clone()
        dist.all_reduce(lt)
        m = ro.loss_mask
        out.update(loss=float(lt) / self.world, grad_norm=float(grad_norm),
                   trained_tokens=int(global_tokens),
                   train_tokens_per_s=global_tokens / elapsed, lr=lr,
                   adv_mean=_masked_mean(adv, m),
                   adv_std=float(adv[m].std()) if m.sum() > 1 else 0.0,
                   micro_batches=len(pmbs), skipped_rows=int((~keep).sum()),
                   skipped_tokens=int(global_tokens - forwarded), skipped_steps=self.skipped_steps,
                   **self.scale.stats())
        out.update(self.mfu.stats(ro, keep, elapsed, cfg.algorithm.ppo_epochs))
        out.update(memory_stats(self.device))
        # > 0: a form precompile did not foresee
        out["compiled_graphs"] = compiled_graphs() - graphs
        clock.mark("stats")
        out.update(clock.parts())
        return out

    def precompile(self) -> tuple[list[str], float]:
        """Compile the policy's layers for every form of input this run's steps can give them
        (``trainer/precompile.py``); nothing when they are not compiled. The forms and the
        seconds."""
        if not getattr(self.model, "compiled_head", False):
            return [], 0.0
        return precompile(self, packed_row_tokens(self.device))

    def release_gradients(self) -> None:
        """Free the gradients between steps (the next step starts without them): memory for an
        engine that wakes beside this rank (``cluster.share=alternate``)."""
        self.opt.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.opt.zero_grad(set_to_none=True)

    def release_optimizer(self) -> None:
        """Free the gradients and the optimizer state (no step follows) and give the memory back."""
        import ctypes
        import gc

        self.opt.zero_grad(set_to_none=True)
        self.opt.state.clear()
        gc.collect()
        libc = ctypes.CDLL(None)
        for release, args in (("MallocExtension_ReleaseFreeMemory", ()), ("malloc_trim", (0,))):
            # tcmalloc (launcher.allocator) first; glibc keeps freed pages too
            if hasattr(libc, release):
                getattr(libc, release)(*args)
                break

    def _contributing(self, ro: Rollouts, adv: torch.Tensor) -> torch.Tensor:
        """``[N]`` bool: the rows whose policy loss and gradient can be non-zero. With no KL or
        entropy term in the loss, a row whose every advantage is 0 has objective
        ``min(r·0, clip(r)·0) = 0`` at every token, whatever the ratio: it is skipped."""
        alg = self.cfg.algorithm
        kl_in_loss = alg.kl_coef > 0 and not alg.kl_in_reward
        if not self.cfg.trainer.skip_zero_advantage or kl_in_loss or alg.entropy_coef != 0:
            return torch.ones(ro.n, dtype=torch.bool)
        return ((adv != 0) & ro.loss_mask).any(dim=1)

    def _micro_batches(self, ro: Rollouts, keep: torch.Tensor | None = None) -> list[list[int]]:
        """This rank's rows (those of ``keep``) in micro-batches; every rank runs as many (FSDP
        collectives), at least one: with every row skipped, a zero-weight dummy still gives
        every parameter a zero gradient, so AdamW steps as it would on the unskipped batch."""
        budget = self.cfg.trainer.micro_batch_tokens
        if self.packing and self.device.type != "cuda":
            # a packed row's block-diagonal mask sends CPU SDPA to its dense O(T²) path,
            # quadratic in the row's length; short rows keep it linear
            # (on GPU the micro-batch is split into rows instead: see _forward)
            budget = min(budget, PACKED_ROW_TOKENS_CPU)
        rows = [i for i in shard(ro.n, self.rank, self.world) if keep is None or keep[i]]
        # the units of a micro-batch: a row each, or the rows of one prompt (self.share), whose
        # laid-out row is the prompt once and then each response
        units = (prompt_units([ro.prompts[i] for i in rows]) if self.share
                 else [[j] for j in range(len(rows))])
        lens = [len(ro.prompts[rows[u[0]]]) + sum(len(ro.responses[rows[j]]) for j in u)
                for u in units]
        b = self.cfg.trainer.shape_buckets
        count = torch.tensor(max(1,
                                 len(micro_batches(lens, budget, packed=self.packing, buckets=b))),
                             device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return [[rows[j] for u in mb for j in units[u]]
                for mb in micro_batches(lens, budget, int(count), self.packing, b)]

    def _all_rows(self, mine: torch.Tensor) -> torch.Tensor:
        """Every rank's rows of an ``[N, L]`` tensor (each rank filled only its own; sum), on
        CPU."""
        dist.all_reduce(mine)
        return mine.cpu()

    def _advantages(self, ro: Rollouts, ref, values):
        """Advantages and returns of the whole batch, and the KL-to-reference stat when the
        KL goes into the reward (as ``kl_penalty(μ, ref)``: μ is the policy that sampled)."""
        alg, r = self.cfg.algorithm, self.cfg.rollout
        lengths = torch.tensor([len(x) for x in ro.responses], dtype=torch.float32)
        rewards = shape_rewards(ro.rewards.double(), lengths, alg, r.max_new_tokens).float()
        kl, stats = None, {}
        if ref is not None and alg.kl_in_reward:
            kl = kl_penalty(ro.behav_logp, ref, alg.kl_estimator) * ro.loss_mask
            # every rank holds all rows; reduce sums
            stats["kl_ref"] = kl.sum() / max(1, self.world)
        adv, returns = compute_advantages(rewards, ro.loss_mask, alg, group_size=ro.group_size,
                                          values=values, kl=kl, episodes=ro.episodes)
        return adv, returns, stats

    def _optimizer_step(self, ro, adv, mbs, prox, ref, global_tokens, max_len, version=None):
        stats: dict[str, torch.Tensor] = {}
        self.opt.zero_grad(set_to_none=True)
        loss_total = torch.zeros((), device=self.device)  # no host sync per micro-batch
        for mb in mbs:
            if not mb:
                dummy_forward(self.model, self.device, self.dtype, backward=True)
                if self.probe and version is not None:  # the probe's forward: the same collectives
                    dummy_forward(self.model, self.device, self.dtype, backward=False)
                self.clock.mark("empty_micro_batch")
                continue
            loss, st = self._micro_step(ro, adv, mb, prox, ref, global_tokens, max_len, version)
            loss_total += loss
            merge_stats(stats, st, STAT_REDUCTIONS)
        # no row forwarded on this rank: the same keys, as 0
        for k in POLICY_STATS + (("router_aux_loss",) if self.routers else ()):
            stats.setdefault(k, torch.zeros((), device=self.device))
        if faults.armed("grad", version):  # tests only: a NaN gradient, as an overflow leaves one
            next(p for p in self.model.parameters() if p.grad is not None).grad.fill_(float("nan"))
        self.scale.unscale_(self.model.parameters())
        # clip_grad_norm_ in its two halves, so that a non-finite norm leaves the gradients as they
        # came (the clip would multiply every one by NaN) and the parameters that carry it can be
        # named
        total = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters()
                                               if p.grad is not None])
        grad_norm = total.full_tensor() if hasattr(total, "full_tensor") else total
        finite = self.scale.update(grad_norm)  # float16 gradients that overflowed: the scale halves
        if finite and bool(torch.isfinite(grad_norm)):
            torch.nn.utils.clip_grads_with_norm_(self.model.parameters(),
                                                 self.cfg.trainer.grad_clip, total)
            self.opt.step()
            self.nonfinite = []
        else:  # an inf/NaN gradient (any dtype: a NaN reward, an overflow) would ruin the weights
            self.skipped_steps += 1
            self.nonfinite = nonfinite_grads(self.model)
        self.sched.step()
        self.clock.mark("optimizer")
        return stats, loss_total, grad_norm

    def _needs_proximal(self) -> bool:
        """A separate no-grad pass is only needed when several optimizer steps use one batch;
        with one step per batch π_prox is exactly the current weights, so the loss takes
        ``logp.detach()`` from the same forward (same numbers, a third less compute).
        ``recompute_proximal=false`` never needs it: π_prox is μ."""
        alg = self.cfg.algorithm
        return alg.ppo_epochs > 1 and alg.recompute_proximal

    def _forward(self, ro: Rollouts, mb: list[int], clock: StepClock | None = None,
                 free: bool = False):
        t = self.cfg.trainer
        # varlen only where a row holds a sequence longer than a packed row: there FlashAttention's
        # causal skipping pays; rows of short sequences run faster through masked SDPA
        # (varlen is a GPU path: the CPU, whose packed micro-batch is one row, never takes it)
        row = packed_row_tokens(self.device)
        varlen = self.varlen and row is not None and any(len(ro.prompts[i])
                                                         + len(ro.responses[i]) > row for i in mb)
        x = model_inputs(ro, mb, self.packing, device=self.device, row_tokens=row,
                         buckets=t.shape_buckets,
                         varlen=varlen, replay=self.replay, shared=self.share)
        self._route(x, free)
        if clock is not None:
            clock.mark("prepare")
        return forward_logprobs(self.model, x, self.dtype, self.cfg.rollout.temperature,
                                t.logprob_chunk_tokens, t.shape_buckets,
                                entropy_grad=self.cfg.algorithm.entropy_coef != 0, clock=clock)

    def _route(self, x, free: bool = False) -> None:
        """MoE: force the micro-batch's engine routing (kept through the backward's recomputation,
        until the next forward) and collect the router logits of a forward with gradients;
        ``free``: the routers choose (and their choices are recorded)."""
        if self.routers is None:
            return
        if free:
            self.routers.record = True
            self.routers.force(None)
        else:
            r = x.routing
            self.routers.force(None if r is None else r.reshape(-1, *r.shape[2:]))
        self.routers.collect = torch.is_grad_enabled()
        self.routers.take_collected()  # nothing left over from another forward
        self.real = x.real

    def _router_aux(self, mask: torch.Tensor, global_tokens: float):
        """The micro-batch's load-balancing loss weighted by its share of the batch's response
        tokens (the shares sum to 1 over the step), and that as a stat; ``(None, {})`` for a dense
        model."""
        if self.routers is None:
            return None, {}
        logits, chosen = self.routers.take_collected()
        self.routers.collect = False
        aux = aux_loss(logits, chosen, self.routers.experts, self.real)
        share = mask.sum() / max(1.0, global_tokens)
        coef = self.cfg.algorithm.router_aux_loss_coef
        term = coef * aux * share if coef > 0 else None
        return term, {"router_aux_loss": aux.detach() * share}

    @torch.no_grad()
    def _probe(self, ro, mb, fresh, behav) -> dict[str, torch.Tensor]:
        """algorithm.routing_probe: the micro-batch forwarded again with the trainer's own
        routing (no gradient, after the backward, so nothing replayed is disturbed): the gap of its
        logprobs on the fresh tokens, and how many (token, sparse layer) chose other experts than
        the engine's (its forced routing; positions without one are not counted)."""
        forced = self.routers.forced
        logp, _ = self._forward(ro, mb, free=True)
        chosen = self.routers.take_recorded()
        self.routers.record = False
        dev = logp.device
        out = {k: torch.zeros((), device=dev) for k in PROBE_SUMS}
        if fresh is not None:
            out["logp_gap_free_sum"] = torch.where(fresh, (logp - behav).abs(), 0.0).sum()
        if forced is not None:
            forced = forced.to(chosen.device)
            known = (forced >= 0).all(-1)  # [tokens, layers]
            differ = (forced.sort(-1).values != chosen.sort(-1).values).any(-1)
            out["routed_slots"] = known.sum().float().to(dev)
            out["routing_flips"] = (differ & known).sum().float().to(dev)
        return out

    @torch.no_grad()
    def _proximal(self, ro, mbs) -> dict[int, torch.Tensor]:
        out = {}
        for mb in mbs:
            if not mb:
                dummy_forward(self.model, self.device, self.dtype, backward=False)
                continue
            lp, _ = self._forward(ro, mb)
            for j, i in enumerate(mb):
                out[i] = lp[j].cpu()
        return out

    def _micro_step(self, ro, adv, mb, prox, ref, global_tokens, max_len, version=None):
        if not self.cfg.trainer.detect_anomaly:
            return self._micro_step_inner(ro, adv, mb, prox, ref, global_tokens, max_len, version)
        try:
            with torch.autograd.detect_anomaly(check_nan=True):
                return self._micro_step_inner(ro, adv, mb, prox, ref, global_tokens, max_len,
                                              version)
        except RuntimeError as err:
            if "nan" not in str(err).lower():
                raise
            raise RuntimeError(f"trainer.detect_anomaly: {str(err).splitlines()[0]} (the stack of "
                               "its forward is in this log above)") from err

    def _micro_step_inner(self, ro, adv, mb, prox, ref, global_tokens, max_len, version=None):
        logp, ent = self._forward(ro, mb, self.clock)
        dev = logp.device
        behav = to_device(ro.behav_logp[mb], dev)
        if prox:
            prox_lp = to_device(torch.stack([prox[i] for i in mb]), dev)
        elif self.cfg.algorithm.recompute_proximal:
            prox_lp = logp.detach()
        else:
            prox_lp = None  # π_prox = μ: the clip bounds π_θ/μ, the policy that sampled
        mask = to_device(ro.loss_mask[mb], dev)
        loss, st = policy_loss(logp, prox_lp, behav, to_device(adv[mb], dev), mask,
                               self.cfg.algorithm,
                               global_tokens=global_tokens, global_seqs=float(ro.n),
                               max_len=max_len, entropy=ent,
                               ref_logp=None if ref is None else to_device(ref[mb], dev))
        aux, aux_st = self._router_aux(mask, global_tokens)
        st.update(aux_st)
        if version is not None and ro.versions is not None:
            # a row's sampled tokens, every one of this version: the engine ran its whole context
            # with these weights (a row whose sampling went on through a weight update saw a
            # context the older weights computed, a gap no kernel or routing explains)
            current = to_device(ro.versions[mb], dev) == version
            fresh = mask & (current | ~mask).all(dim=-1, keepdim=True)
            st["logp_gap_sum"] = torch.where(fresh, (logp.detach() - behav).abs(), 0.0).sum()
            st["fresh_tokens"] = fresh.sum().float()
        else:
            fresh = None
        self.clock.mark("loss")
        # FSDP averages gradients over ranks; the loss is already a share of the global mean
        total = loss if aux is None else loss + aux  # the MoE load-balancing term
        (total * (self.world * self.scale.value)).backward()
        self.clock.mark("backward")
        if self.probe and version is not None:
            st.update(self._probe(ro, mb, fresh, behav))
        return loss.detach(), st


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(x[mask].mean()) if mask.any() else 0.0


def nonfinite_grads(model: torch.nn.Module, limit: int = 5) -> list[str]:
    """The first ``limit`` parameters (this rank's shards) whose gradient holds a NaN or an
    infinity."""
    out = []
    for name, p in model.named_parameters():
        g = p.grad
        if g is None:
            continue
        if not bool(torch.isfinite(g.to_local() if hasattr(g, "to_local") else g).all()):
            out.append(name)
            if len(out) == limit:
                break
    return out

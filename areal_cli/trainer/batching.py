"""Turn a ``Batch`` of trajectories into padded tensors and token-budget micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from areal_cli.transport.messages import Batch


@dataclass
class Rollouts:
    """The samples of a batch, response-aligned: row i = one trajectory."""

    prompts: list[list[int]]
    responses: list[list[int]]
    behav_logp: torch.Tensor  # [N, L] float32
    loss_mask: torch.Tensor  # [N, L] bool (model tokens only)
    rewards: torch.Tensor  # [N]
    group_size: int

    @property
    def n(self) -> int:
        return len(self.prompts)


def from_batch(batch: Batch) -> Rollouts:
    samples = [s for g in batch.groups for s in sorted(g.samples, key=lambda s: s.sample_index)]
    L = max(1, max(len(s.output_ids) for s in samples))
    behav = torch.zeros(len(samples), L)
    mask = torch.zeros(len(samples), L, dtype=torch.bool)
    for i, s in enumerate(samples):
        r = len(s.output_ids)
        behav[i, :r] = torch.from_numpy(s.logprobs.astype("float32"))
        mask[i, :r] = torch.from_numpy(s.loss_mask.astype(bool))
    return Rollouts(
        prompts=[s.prompt_ids.tolist() for s in samples],
        responses=[s.output_ids.tolist() for s in samples],
        behav_logp=behav, loss_mask=mask,
        rewards=torch.tensor([float(s.reward) for s in samples], dtype=torch.float32),
        group_size=len(batch.groups[0].samples))


def shard(n: int, rank: int, world: int) -> range:
    """This rank's contiguous slice of n rows (validation made n divisible by world)."""
    per = n // world
    return range(rank * per, (rank + 1) * per)


def micro_batches(lengths: list[int], budget: int, count: int | None = None) -> list[list[int]]:
    """Group row indices into micro-batches of at most ``budget`` tokens (longest first, so
    padding waste stays small); ``count`` forces at least that many (ranks must agree)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    for i in order:
        if bins and (len(bins[-1]) + 1) * lengths[bins[-1][0]] <= budget:
            bins[-1].append(i)
        else:
            bins.append([i])
    while count is not None and len(bins) < count:
        big = max(range(len(bins)), key=lambda b: len(bins[b]))
        if len(bins[big]) > 1:
            bins.append([bins[big].pop()])
        else:
            bins.append([])  # an empty micro-batch: the rank runs a zero-weight dummy
    return bins


def left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, attention mask and position ids, left-padded so every row ends at the last column
    (the response tokens of all rows then sit in the last columns: ``logits_to_keep`` works)."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    att = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = torch.tensor(r)
        att[i, T - len(r):] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    return ids, att, pos


def response_logprobs(logits: torch.Tensor, ids: torch.Tensor, resp_lens: list[int], width: int,
                      temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob and entropy of each response token, ``[n, width]`` aligned at the response start.

    ``logits`` are the last K positions of left-padded ``ids`` (K = max response + 1). All
    response positions are picked with one advanced index (one gather, one backward scatter)
    and go through a single float32 log-softmax of ``[tokens, vocab]``.
    """
    n, K = logits.shape[0], logits.shape[1]
    T = ids.shape[1]
    dev = logits.device
    lens = torch.tensor(resp_lens, device=dev)
    k = torch.arange(width, device=dev)
    valid = k[None, :] < lens[:, None]  # [n, width]
    rows = torch.arange(n, device=dev)[:, None].expand(n, width)[valid]
    cols = (K - lens - 1)[:, None] + k[None, :]  # logit column predicting response token k
    targets = ids.gather(1, ((T - lens)[:, None] + k[None, :]).clamp(max=T - 1))[valid]
    sel = logits[rows, cols[valid]].float() / temperature  # [tokens, vocab]
    logp_all = torch.log_softmax(sel, dim=-1)
    lp_flat = logp_all.gather(-1, targets[:, None])[:, 0]
    with torch.no_grad():  # entropy from the same log-softmax: no second pass over the vocabulary
        ent_flat = -(logp_all.exp() * logp_all).sum(-1)
    lp = torch.zeros(n, width, device=dev, dtype=torch.float32).masked_scatter(valid, lp_flat)
    ent = torch.zeros(n, width, device=dev, dtype=torch.float32).masked_scatter(valid, ent_flat)
    return lp, ent

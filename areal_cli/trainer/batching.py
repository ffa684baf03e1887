"""Turn a ``Batch`` of trajectories into model inputs and token-budget micro-batches.

Two layouts of a micro-batch (``trainer.packing``): packed, every sequence back to back in
one row with ``position_ids`` restarting at 0 and a block-diagonal causal mask (no padding
at all); or left-padded, one row per sequence, all responses ending at the last column.
Either way only the positions that predict response tokens reach the LM head
(``logits_to_keep``), and every response token lands at ``[row, k]`` of an ``[n, width]``
tensor aligned at the response start.

A third, for samples that share a prompt (``trainer.shared_prompts``): one row per prompt, the
prompt once and then each of its responses, with positions continuing from the prompt's end for
every response and a mask that lets each response see the prompt and itself only. Every token
attends to what it would in a row of its own, so logprobs and gradients are those of the padded
layout, for the prompt's tokens once per group instead of once per sample.

Shape buckets (``trainer.shape_buckets``): a left-padded micro-batch's rows and columns are
rounded up to a few sizes per doubling (``bucket``), with one-token dummy rows and more left
padding, so the CPU's oneDNN primitive cache and the allocator see a few recurring shapes
instead of a new one every step (each new shape kept memory, so the trainer grew step after
step). The padding is masked and no response token sits in it: the loss and its
gradient are those of the exact shape.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from areal_cli.transport.messages import Batch

PACKED_ROW_TOKENS_CUDA = 2048
"""Longest packed row on GPU: a micro-batch (``micro_batch_tokens``) is several packed rows of at
most this many tokens. The block-diagonal mask makes SDPA attend over each whole ``[T, T]``
square, so one 16k-token row spent 74% of the step in attention, while more, smaller
micro-batches are bound by the host launching kernels (benchmarks/packing.py, BENCHMARKS.md)."""


def packed_row_tokens(device: torch.device) -> int | None:
    """The longest packed row on ``device``: ``PACKED_ROW_TOKENS_CUDA`` on GPUs, None (one row) on
    the CPU."""
    return PACKED_ROW_TOKENS_CUDA if device.type == "cuda" else None


@dataclass
class Rollouts:
    """The samples of a batch, response-aligned: row i = one trajectory."""

    prompts: list[list[int]]
    responses: list[list[int]]
    behav_logp: torch.Tensor  # [N, L] float32
    loss_mask: torch.Tensor  # [N, L] bool (model tokens only)
    rewards: torch.Tensor  # [N]
    group_size: int
    versions: torch.Tensor | None = None  # [N, L] int32: policy version of each token (-1 = none)
    # [N] int64: workflow=agent, the batch-wide episode of each row
    episodes: torch.Tensor | None = None
    # (several rows may share one; ``group_size`` episodes per group); None = one episode per row
    # MoE with routing replay: each row's engine routing [positions, layers, k] (moe.py), or None
    routing: list | None = None

    @property
    def n(self) -> int:
        return len(self.prompts)


def from_batch(batch: Batch) -> Rollouts:
    samples = [s for g in batch.groups for s in sorted(g.samples, key=lambda s: s.sample_index)]
    L = max(1, max(len(s.output_ids) for s in samples))
    behav = torch.zeros(len(samples), L)
    mask = torch.zeros(len(samples), L, dtype=torch.bool)
    versions = torch.full((len(samples), L), -1, dtype=torch.int32)
    for i, s in enumerate(samples):
        r = len(s.output_ids)
        behav[i, :r] = torch.from_numpy(s.logprobs.astype("float32"))
        mask[i, :r] = torch.from_numpy(s.loss_mask.astype(bool))
        versions[i, :r] = torch.from_numpy(s.versions.astype("int32"))
    return Rollouts(
        prompts=[s.prompt_ids.tolist() for s in samples],
        responses=[s.output_ids.tolist() for s in samples],
        behav_logp=behav, loss_mask=mask,
        rewards=torch.tensor([float(s.reward) for s in samples], dtype=torch.float32),
        group_size=batch.groups[0].episodes(), versions=versions, episodes=_episode_rows(batch),
        routing=_routing_rows(samples))


def _routing_rows(samples) -> list | None:
    """Each sample's ``routed_experts`` (None where it has none), or None when no sample has one."""
    rows = [s.routed_experts if s.routed_experts.size else None for s in samples]
    return rows if any(r is not None for r in rows) else None


def _episode_rows(batch: Batch) -> torch.Tensor | None:
    """Each row's batch-wide episode index (rows in ``from_batch``'s order), or None when every
    sample is an episode of its own."""
    if all(s.episode < 0 for g in batch.groups for s in g.samples):
        return None
    rows, offset = [], 0
    for g in batch.groups:
        for s in sorted(g.samples, key=lambda s: s.sample_index):
            rows.append(offset + s.episode)
        offset += g.episodes()
    return torch.tensor(rows, dtype=torch.int64)


def shard(n: int, rank: int, world: int) -> range:
    """This rank's contiguous slice of n rows: n // world each, the first n % world ranks one more
    (an agent batch's row count varies; every other batch divides evenly)."""
    per, extra = divmod(n, world)
    start = rank * per + min(rank, extra)
    return range(start, start + per + (rank < extra))


def bucket(n: int, per_doubling: int) -> int:
    """``n`` rounded up to one of ``per_doubling`` evenly spaced sizes in each (2^k, 2^(k+1)]
    (4: 65–80 → 80, 81–96 → 96, …, 129–160 → 160); ``n`` itself when ``per_doubling`` is 0."""
    if per_doubling <= 0 or n <= 1:
        return n
    step = max(1, (1 << (n - 1).bit_length()) // (2 * per_doubling))
    return -(-n // step) * step


def micro_batches(lengths: list[int], budget: int, count: int | None = None,
                  packed: bool = False, buckets: int = 0) -> list[list[int]]:
    """Group row indices into micro-batches of at most ``budget`` tokens, longest first.

    Packed micro-batches cost the sum of their lengths; padded ones rows × the longest (the
    first, as rows come longest first), both rounded up to their ``buckets`` as ``left_pad``
    will. A sequence longer than the budget gets a micro-batch of its own. ``count`` forces
    at least that many (ranks must agree).
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    used = 0
    for i in order:
        if bins:
            cost = (used + lengths[i] if packed else
                    bucket(len(bins[-1]) + 1, buckets) * bucket(lengths[bins[-1][0]], buckets))
        if bins and cost <= budget:
            bins[-1].append(i)
            used = cost
        else:
            bins.append([i])
            used = lengths[i]
    while count is not None and len(bins) < count:
        big = max(range(len(bins)), key=lambda b: len(bins[b]), default=None)
        if big is not None and len(bins[big]) > 1:
            bins.append([bins[big].pop()])
        else:
            bins.append([])  # an empty micro-batch: the rank runs a zero-weight dummy
    return bins


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``. A host tensor bound for a GPU goes through pinned memory without
    blocking: a copy from pageable memory waits until the GPU has run everything queued before it,
    so the GPU then idles while the host builds the next micro-batch's inputs."""
    device = torch.device(device)
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@dataclass
class Inputs:
    """Model inputs of one micro-batch and where its response tokens sit in the kept logits."""

    ids: torch.Tensor  # [rows, T]
    attention_mask: torch.Tensor | None  # [rows, T] (padded), [rows, 1, T, T] bool block-diagonal
    # (packed), or None (packed, varlen: the segments below)
    position_ids: torch.Tensor  # [rows, T]
    keep: int | torch.Tensor  # logits_to_keep: last K columns (padded) or the positions (packed)
    rows: torch.Tensor  # [tokens] row in the kept logits of each response token
    cols: torch.Tensor  # [tokens] column in the kept logits (the position predicting it)
    targets: torch.Tensor  # [tokens] the response token ids
    valid: torch.Tensor  # [n, width] bool: response token k of sequence j exists
    cu_seqlens: torch.Tensor | None = None  # varlen: segment offsets over the rows flattened
    max_seqlen: int = 0  # varlen: the longest segment
    # [rows, T] bool: a token of a sequence (not padding); the MoE load-balancing loss counts these
    real: torch.Tensor | None = None
    # [rows, T, layers, k] int16 experts to force at each token (-1: routed live), or None
    routing: torch.Tensor | None = None

    def to(self, device: torch.device) -> Inputs:
        move = {k: (to_device(v, device) if torch.is_tensor(v) else v) for k,
                v in vars(self).items()}
        return Inputs(**move)

    def model_kwargs(self) -> dict:
        """The model's forward keywords for these inputs (``logits_to_keep`` included)."""
        kw = dict(input_ids=self.ids, attention_mask=self.attention_mask,
                  position_ids=self.position_ids,
                  logits_to_keep=self.keep)
        if self.cu_seqlens is not None:  # read by trainer.varlen.varlen_attention
            kw.update(cu_seq_lens_q=self.cu_seqlens, cu_seq_lens_k=self.cu_seqlens,
                      max_length_q=self.max_seqlen, max_length_k=self.max_seqlen)
        return kw


def model_inputs(ro: Rollouts, mb: list[int], packed: bool, pad: int = 0,
                 device: torch.device | None = None, row_tokens: int | None = None,
                 buckets: int = 0, varlen: bool = False, replay: bool = False,
                 shared: bool = False) -> Inputs:
    """The inputs of micro-batch ``mb`` (row indices of ``ro``), packed, left-padded or one row
    per prompt (``shared``: see ``share_prompts``), on ``device`` (a mask is built there, never
    on the host). Packed sequences go into rows of at most ``row_tokens`` tokens (None = one
    row), or one row kept apart by segment offsets instead of a mask with ``varlen``
    (``trainer.varlen``); left-padded and shared rows and columns are rounded up to ``buckets``
    (see ``bucket``). ``replay``: ``routing`` laid out as the ids from the rows' engine routings
    (``ro.routing``)."""
    prompts = [ro.prompts[i] for i in mb]
    resps = [ro.responses[i] for i in mb]
    routes = [ro.routing[i] for i in mb] if replay and ro.routing is not None else None
    if shared and routes is None and not packed:
        return share_prompts(prompts, resps, ro.loss_mask.shape[1], pad, buckets, device)
    if packed:
        return pack(prompts, resps, ro.loss_mask.shape[1], pad, device=device,
                    row_tokens=row_tokens,
                    varlen=varlen, routes=routes)
    x = left_pad(prompts, resps, ro.loss_mask.shape[1], pad, buckets, routes=routes)
    return x if device is None else x.to(device)


def lay_out_routing(routes: list, where: list[tuple[int, int]], shape: tuple[int, int]):
    """``[rows, T, layers, k]`` int16 of the sequences' routings (``routes[j]``: ``[positions,
    layers, k]`` or None) with sequence j's position 0 at ``where[j]`` = (row, column); -1 where a
    token has none (padding, a position the engine never ran)."""
    first = next(r for r in routes if r is not None)
    out = torch.full((*shape, *first.shape[1:]), -1, dtype=torch.int16)
    for (row, col), r in zip(where, routes, strict=True):
        if r is not None:
            n = min(len(r), shape[1] - col)
            out[row, col:col + n] = torch.from_numpy(r[:n].astype("int16"))
    return out


def _valid(resp_lens: list[int], width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] < torch.tensor(resp_lens)[:, None]


def pack(prompts: list[list[int]], resps: list[list[int]], width: int, pad: int = 0,
         device: torch.device | None = None, row_tokens: int | None = None,
         varlen: bool = False, routes: list | None = None) -> Inputs:
    """Sequence after sequence in a row, positions restarting at 0, attention only within a
    sequence (SDPA on CPU ignores packed ``position_ids`` alone, so the mask is explicit).

    ``row_tokens``: sequences go first-fit into rows of at most that many tokens (one longer
    sequence gets a row of its own), rows padded to the longest; the attention over a row
    costs its length squared whatever the mask, so k rows of T/k tokens cost 1/k of one row
    of T. None = one row. The ``[rows, 1, T, T]`` mask is built on ``device`` from the segment
    ids (a 16k-token row's mask is 256 MiB: built on the host and copied, it cost more than
    the step). With ``varlen`` there is no mask: ``cu_seqlens`` mark each sequence
    (``trainer.varlen``), and the sequences go into one row whatever ``row_tokens``: each attends
    over its own segment, so rows would only add padding, and a compiled layer given one row and
    then several would compile again (dynamo specialises a dimension of size 1; ``precompile``).
    Response tokens come out in (sequence, position) order, as ``valid`` expects."""
    lens = [len(p) + len(r) for p, r in zip(prompts, resps, strict=True)]
    cap = sum(lens) if varlen else row_tokens or sum(lens)
    fill: list[int] = []  # tokens in each row
    where = []  # (row, start) of each sequence
    for n in lens:
        r = next((k for k, used in enumerate(fill) if used + n <= cap), None)
        if r is None:
            fill.append(0)
            r = len(fill) - 1
        where.append((r, fill[r]))
        fill[r] += n
    R, T = len(fill), max(fill)
    ids = torch.full((R, T), pad, dtype=torch.long)
    pos = torch.zeros(R, T, dtype=torch.long)
    seg = torch.full((R, T), -1, dtype=torch.long)
    rows, keep_pos = [], []
    for j, ((r, start), p, resp) in enumerate(zip(where, prompts, resps, strict=True)):
        n = len(p) + len(resp)
        ids[r, start:start + n] = torch.tensor(p + resp)
        pos[r, start:start + n] = torch.arange(n)
        seg[r, start:start + n] = j
        rows += [r] * len(resp)
        keep_pos += range(start + len(p) - 1, start + n - 1)
    rows_t, keep_pos_t = torch.tensor(rows, dtype=torch.long), torch.tensor(keep_pos,
                                                                            dtype=torch.long)
    if R == 1:
        keep, cols = keep_pos_t, torch.arange(len(keep_pos))
    else:  # every row keeps the union of the positions any row needs
        keep = torch.unique(keep_pos_t)
        cols = torch.searchsorted(keep, keep_pos_t)
    x = Inputs(ids=ids, attention_mask=seg, position_ids=pos, keep=keep, rows=rows_t, cols=cols,
               targets=ids[rows_t, keep_pos_t + 1], valid=_valid([len(r) for r in resps], width),
               real=seg >= 0,
               routing=None if routes is None else lay_out_routing(routes, where, (R, T)))
    if device is not None:
        x = x.to(device)
    if varlen:
        from areal_cli.trainer.varlen import segments

        cu_seqlens, x.max_seqlen = segments(lens, "cpu")  # one row (cap above), no padding
        x.cu_seqlens = to_device(cu_seqlens, x.ids.device)
        x.attention_mask = None
        return x
    seg_t = x.attention_mask
    mask = torch.ones(T, T, dtype=torch.bool, device=seg_t.device).tril_()[None]
    mask = mask & (seg_t[:, :, None] == seg_t[:, None, :])
    x.attention_mask = mask[:, None]
    return x


def prompt_units(prompts: list[list[int]]) -> list[list[int]]:
    """Runs of consecutive indices of ``prompts`` whose prompts are the same tokens (a group's
    samples come one after another): the rows ``share_prompts`` lays out."""
    units: list[list[int]] = []
    for i, p in enumerate(prompts):
        if units and prompts[units[-1][0]] == p:
            units[-1].append(i)
        else:
            units.append([i])
    return units


def share_prompts(prompts: list[list[int]], resps: list[list[int]], width: int, pad: int = 0,
                  buckets: int = 0, device: torch.device | None = None) -> Inputs:
    """One row per run of samples with the same prompt (``prompt_units``): the prompt, then each
    response, right-padded. A response's positions continue from its prompt's end and it attends
    to the prompt and to its own earlier tokens, never to a sibling, so each of its logits is the
    one its own row would give; its first token is predicted by the prompt's last position, which
    every sibling shares. Response tokens come out in (sequence, position) order, as ``valid``
    expects. Rows and columns are rounded up to ``buckets``, as ``left_pad``'s are (padding
    attends only to padding and no output reads it)."""
    units = prompt_units(prompts)
    lens = [len(prompts[u[0]]) + sum(len(resps[i]) for i in u) for u in units]
    R, T = bucket(len(units), buckets), bucket(max(lens), buckets)
    ids = torch.full((R, T), pad, dtype=torch.long)
    pos = torch.zeros(R, T, dtype=torch.long)
    part = torch.full((R, T), -2, dtype=torch.long)  # -1 the prompt, k response k, -2 padding
    rows, keep_pos, targets = [], [], []
    for r, u in enumerate(units):
        p = prompts[u[0]]
        ids[r, :len(p)] = torch.tensor(p)
        pos[r, :len(p)] = torch.arange(len(p))
        part[r, :len(p)] = -1
        start = len(p)
        for k, i in enumerate(u):
            n = len(resps[i])
            ids[r, start:start + n] = torch.tensor(resps[i])
            pos[r, start:start + n] = torch.arange(len(p), len(p) + n)
            part[r, start:start + n] = k
            rows += [r] * n
            keep_pos += [len(p) - 1, *range(start, start + n - 1)][:n]
            targets += resps[i]
            start += n
    rows_t = torch.tensor(rows, dtype=torch.long)
    keep_pos_t = torch.tensor(keep_pos, dtype=torch.long)
    keep = torch.unique(keep_pos_t)  # every row keeps the union of the positions any row needs
    x = Inputs(ids=ids, attention_mask=part, position_ids=pos, keep=keep, rows=rows_t,
               cols=torch.searchsorted(keep, keep_pos_t),
               targets=torch.tensor(targets, dtype=torch.long),
               valid=_valid([len(r) for r in resps], width), real=part != -2)
    if device is not None:
        x = x.to(device)
    q, k = x.attention_mask[:, :, None], x.attention_mask[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril_()[None]
    x.attention_mask = (causal & ((q == k) | ((k == -1) & (q >= 0))))[:, None]
    return x


def left_pad(prompts: list[list[int]], resps: list[list[int]], width: int, pad: int = 0,
             buckets: int = 0, routes: list | None = None) -> Inputs:
    """One row per sequence, left-padded so every row ends at the last column: the responses
    sit in the last columns and ``logits_to_keep = max response + 1`` covers them. With
    ``buckets``, the columns are rounded up (more left padding) and so are the rows: each
    added row is a one-token sequence (a pad token in the last column) that no output reads."""
    rows = [p + r for p, r in zip(prompts, resps, strict=True)]
    n, T = len(rows), bucket(max(len(r) for r in rows), buckets)
    ids = torch.full((bucket(n, buckets), T), pad, dtype=torch.long)
    att = torch.zeros(ids.shape, dtype=torch.long)
    att[n:, -1] = 1
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = torch.tensor(r)
        att[i, T - len(r):] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    lens = torch.tensor([len(r) for r in resps])
    K = int(lens.max()) + 1
    valid = _valid(lens.tolist(), width)
    k = torch.arange(width)
    row_idx = torch.arange(n)[:, None].expand(n, width)[valid]
    cols = ((K - lens - 1)[:, None] + k[None, :])[valid]  # logit column predicting token k
    targets = ids.gather(1, ((T - lens)[:, None] + k[None, :]).clamp(max=T - 1))[valid]
    real = att.bool()
    real[n:] = False  # the bucket's dummy rows
    where = [(i, T - len(r)) for i, r in enumerate(rows)]
    return Inputs(ids=ids, attention_mask=att, position_ids=pos, keep=K, rows=row_idx, cols=cols,
                  targets=targets, valid=valid, real=real,
                  routing=None if routes is None else lay_out_routing(routes, where, ids.shape))


def autocast(device: torch.device, dtype: torch.dtype):
    """bf16 autocast over fp32 master weights; nothing for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def forward(model, x: Inputs, dtype: torch.dtype) -> torch.Tensor:
    """The kept head outputs ``[tokens, out]`` at the positions predicting response tokens
    (vocabulary logits for a policy, one value for the critic)."""
    with autocast(x.ids.device, dtype):
        out = model(**x.model_kwargs()).logits
    return out[x.rows, x.cols]


def dummy_forward(model, device: torch.device, dtype: torch.dtype, backward: bool) -> None:
    """A two-token forward (and zero-weight backward) for a rank with an empty micro-batch, so
    every rank joins the same FSDP collectives."""
    ids = torch.zeros(1, 2, dtype=torch.long, device=device)
    routers = getattr(model, "routers", None)
    if routers is not None:  # MoE: routed live, nothing collected
        routers.force(None)
        routers.collect = False
    with autocast(device, dtype):
        out = model(input_ids=ids).logits
    if backward:
        (out.float().sum() * 0.0).backward()


def to_rows(flat: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[tokens]`` in (sequence, position) order → ``[n, width]`` float32 (float64 stays), 0 where
    not valid."""
    dtype = torch.float64 if flat.dtype == torch.float64 else torch.float32
    out = torch.zeros(valid.shape, device=flat.device, dtype=dtype)
    return out.masked_scatter(valid, flat.to(dtype))


def token_logprobs(logits: torch.Tensor, x: Inputs, temperature: float) -> tuple[torch.Tensor,
                                                                                 torch.Tensor]:
    """Logprob and entropy ``[n, width]`` of each response token from the kept ``[tokens, vocab]``
    logits: one float32 log-softmax, the entropy from the same one (no second vocab pass)."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    lp = logp_all.gather(-1, x.targets[:, None])[:, 0]
    with torch.no_grad():
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return to_rows(lp, x.valid), to_rows(ent, x.valid)


def merge_stats(into: dict[str, torch.Tensor], stats: dict[str, torch.Tensor],
                how: dict[str, str]) -> None:
    """Add one micro-batch's stats into ``into`` (max for the "max" stats of ``how``)."""
    for k, v in stats.items():
        if k not in into:
            into[k] = v
        elif how.get(k) == "max":
            into[k] = torch.maximum(into[k], v)
        else:
            into[k] = into[k] + v


def reduce_stats(stats: dict[str, torch.Tensor], how: dict[str, str], global_tokens: float,
                 device: torch.device) -> dict:
    """All-reduce the merged stats over ranks; "mean" stats are divided by the batch's tokens.

    The stats are stacked into one new tensor per reduction (two collectives in all) before the
    in-place all-reduce: two keys holding the same tensor, or views of one storage, are never
    reduced into each other (a shared zero once added the fresh-token count into the logprob
    gap)."""
    out = {}
    for ops, red in ((("sum", "mean"), dist.ReduceOp.SUM), (("max",), dist.ReduceOp.MAX)):
        keys = [k for k in sorted(stats) if how.get(k, "sum") in ops]
        if not keys:
            continue
        v = torch.stack([stats[k].detach().float().reshape(()) for k in keys]).to(device)
        dist.all_reduce(v, op=red)
        for k, x in zip(keys, v.tolist(), strict=True):
            out[k] = x / global_tokens if how.get(k) == "mean" else x
    return out

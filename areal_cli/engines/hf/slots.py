"""The hf engine's decode loop on the CPU: fixed slots over one contiguous KV cache.

transformers' continuous batching packs every sequence of a step into one flat row and attends
through a mask of all queries × all cached tokens, rebuilt each step, with the KV gathered from
pages: on one CPU core, 32 sequences decoded at ~50 tokens/s where the bare forward of the same
batch does ~200 (``benchmarks/cpu_decode.py``). Here each sequence holds a row (a slot) of a
per-layer buffer ``[slots, kv_heads, columns, head_dim]``; every live row is written at one shared
column, so a step is one batched forward of the live rows over the columns they span, with each
row's own positions and a small additive mask hiding the columns before its start. A new
sequence is prefilled (left-padded with the others admitted at the same step) into the columns
just before the write column; a finished row is replaced by the last live row, so the live rows
stay ``[0, n)``; when the write column reaches the end, the live window moves to the front.

The loop runs inside ``poll`` on the caller's thread: a weight update (``paused``) never meets a
step in flight. Interruption is the paged engine's: every unfinished sequence is re-prefilled
from its prompt and the tokens it has, under the new version. Behaviour logprobs are those the
paged engine returns: log-softmax of the logits (at the temperature, after top-p), float32; a
sequence with a grammar samples from its masked logits (grammar.py).
"""

from __future__ import annotations

import collections
import contextlib
import time

import torch

from areal_cli import moe
from areal_cli.engines.base import Sampling, Sequence
from areal_cli.engines.hf.engine import HFEngine, kv_cache_tokens


def slots_fit(config) -> bool:
    """The model attends over the whole context in every layer (no sliding window: the slot loop
    builds one mask for all layers) and its logits are its head's output (no soft-capping or
    scale)."""
    types = getattr(config, "layer_types", None) or ["full_attention"]
    window = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    plain_head = all(getattr(config, k, None) is None
                     for k in ("final_logit_softcapping", "logit_scale"))
    return all(t == "full_attention" for t in types) and not window and plain_head


class SlotCache:
    """Per-layer K and V of up to ``slots`` rows; the model calls ``update`` once per layer and
    forward, for rows ``[r0, r1)``, writing at column ``w`` and reading from column ``lo``."""

    def __init__(self, layers: int, slots: int, kv_heads: int, head_dim: int, columns: int, dtype):
        # zeros, not empty: a masked column is added to -inf, and garbage bits may be NaN
        shape = (slots, kv_heads, columns, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.r0 = self.r1 = self.w = self.lo = 0

    @property
    def columns(self) -> int:
        return self.k[0].shape[2]

    def update(self, key, value, layer_idx: int, *args, **kwargs):
        q = key.shape[2]
        k, v = self.k[layer_idx], self.v[layer_idx]
        k[self.r0:self.r1, :, self.w:self.w + q] = key
        v[self.r0:self.r1, :, self.w:self.w + q] = value
        return k[self.r0:self.r1, :, self.lo:self.w + q], v[self.r0:self.r1, :, self.lo:self.w + q]

    def move(self, src: slice, dst: slice, rows: slice) -> None:
        """Copy columns ``src`` to ``dst`` of ``rows`` in every layer (overlap allowed)."""
        for t in self.k + self.v:
            t[rows, :, dst] = t[rows, :, src].clone()

    def copy_row(self, src: int, dst: int, cols: slice) -> None:
        for t in self.k + self.v:
            t[dst, :, cols] = t[src, :, cols]

    def grown(self, columns: int) -> SlotCache:
        """A copy with ``columns`` columns (the data kept at the same places)."""
        out = SlotCache.__new__(SlotCache)
        out.r0 = out.r1 = out.w = out.lo = 0
        out.k, out.v = [], []
        for src, dst in ((self.k, out.k), (self.v, out.v)):
            for t in src:
                bigger = t.new_zeros((*t.shape[:2], columns, t.shape[3]))
                bigger[:, :, : t.shape[2]] = t
                dst.append(bigger)
        return out


def sample(logits: torch.Tensor, s: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens of float32 ``logits [n, vocab]`` and their logprobs: argmax when greedy (logprob
    at temperature 1), else a draw at the temperature from the top-p nucleus (logprob within it)."""
    if s.greedy:
        logp = torch.log_softmax(logits, -1)
        tok = logp.argmax(-1)
        return tok, logp.gather(-1, tok[:, None])[:, 0]
    scores = logits / s.temperature
    if s.top_p < 1.0:
        sorted_, order = scores.sort(-1, descending=True)
        probs = sorted_.softmax(-1)
        # the tokens after the nucleus is full (the first stays)
        drop = probs.cumsum(-1) - probs > s.top_p
        scores = scores.scatter(-1, order, sorted_.masked_fill(drop, float("-inf")))
    logp = torch.log_softmax(scores, -1)
    # inverse CDF: one uniform per row against the cumulative probabilities (many times cheaper
    # than torch.multinomial on the CPU); u > 0, so a token of probability 0 is never hit
    cdf = logp.exp().cumsum(-1)
    u = (1.0 - torch.rand(len(cdf), 1)) * cdf[:, -1:]
    tok = torch.searchsorted(cdf, u)[:, 0].clamp_(max=cdf.shape[1] - 1)
    return tok, logp.gather(-1, tok[:, None])[:, 0]


class SlotEngine(HFEngine):
    """``HFEngine`` with the slot loop instead of transformers' continuous batching (CPU)."""

    def _start(self, sampling: Sampling, kv_tokens: int) -> None:
        c, slots = self._model.config, max(1, self.setup.sequences)
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        columns = max(64, kv_tokens // slots) + 64
        old = getattr(self, "cache", None)
        if old is None or old.columns != columns:
            self.cache = SlotCache(c.num_hidden_layers, slots, kv_heads, head_dim, columns,
                                   self._model.dtype)
        self.slots, self.sampling = slots, sampling
        self.rows: list[Sequence] = []  # live rows, row i = rows[i]
        self.start: list[int] = []  # first column of each live row
        self.pos: list[int] = []  # position of each live row's last token (its next input)
        # submitted, not prefilled yet
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.t = 0  # the write column of the next decode step
        self.steps = self.prefills = 0  # forwards run (benchmarks read them)
        self.manager, self._running = None, (sampling, kv_tokens)
        # MoE with routing replay: each forward's experts go to the sequences (Sequence.routing)
        self.record = self.routers is not None and self.setup.routing
        if self.routers is not None:
            self.routers.record = self.record

    def _submit_segment(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def _abort_segment(self, seq: Sequence) -> None:
        self.waiting = collections.deque(s for s in self.waiting if s is not seq)
        for i, row in enumerate(self.rows):
            if row is seq:
                return self._drop_row(i)

    def poll(self, timeout_s: float) -> list[Sequence]:
        self._check_alive()
        done, deadline = self.take_finished_during_pause(), time.monotonic() + timeout_s
        while not done:
            if self.waiting and len(self.rows) < self.slots:
                self._prefill()
            elif self.rows:
                self._decode()
            else:
                time.sleep(max(0.0, deadline - time.monotonic()))
            done += self._reap()
            if time.monotonic() >= deadline:
                break
        return done

    @torch.no_grad()
    def _prefill(self) -> None:
        """Prefill waiting sequences into new rows (as many as fit the free slots and
        engine.max_batch_tokens), right-aligned on the write column; sample their next token.
        Sequences with the same context (a group's samples of one prompt) share one row of the
        forward: the others' rows get a copy of its keys and values and sample from its logits."""
        batch: list[Sequence] = []
        first: dict[tuple, int] = {}  # context -> its first sequence's index in batch
        owner: list[int] = []  # of each sequence in batch: that index for its context
        width = 0
        while self.waiting and len(self.rows) + len(batch) < self.slots:
            head = self.waiting[0]
            key = (*head.prompt_ids, *head.output_ids)
            if key not in first:
                if first and (len(first) + 1) * max(width, len(key)) > \
                        self.setup.engine.max_batch_tokens:
                    break
                first[key] = len(batch)
                width = max(width, len(key))
            owner.append(first[key])
            batch.append(self.waiting.popleft())
        # the first of each context, then the others: rows n0 .. n0 + u run the forward
        owners = list(first.values())  # ascending: in the order they came
        row_of = {j: r for r, j in enumerate(owners)}
        order = owners + [j for j in range(len(batch)) if j not in row_of]
        batch, src = [batch[j] for j in order], [row_of[owner[j]] for j in order]
        ctx = [list(s.prompt_ids) + list(s.output_ids) for s in batch]
        if not self.rows:
            self.t = 0
        if self.t < width:  # room before the write column for the longest context
            self._shift(width - self.t)
        if self.t > self.cache.columns:
            self.cache = self.cache.grown(self.t + 64)
        n0, m, u = len(self.rows), len(batch), len(first)
        ids = torch.tensor([[0] * (width - len(x)) + x for x in ctx[:u]])
        pad = torch.tensor([width - len(x) for x in ctx[:u]])
        cols = torch.arange(width)
        keep = (cols[None, None, :] <= cols[None, :, None]) & (cols[None, None, :] >= pad[:, None,
                                                                                          None])
        # a padding query sees itself: no all-masked row
        keep |= torch.eye(width, dtype=torch.bool)[None]
        mask = torch.zeros(keep.shape, dtype=self._model.dtype).masked_fill_(~keep,
                                                                             float("-inf"))[:, None]
        positions = (cols[None, :] - pad[:, None]).clamp_(min=0)
        self.cache.r0, self.cache.r1 = n0, n0 + u
        self.cache.w = self.cache.lo = self.t - width
        logits = self._forward(ids, mask, positions)
        for j in range(u, m):  # a copy of the owner's keys and values
            self.cache.copy_row(n0 + src[j], n0 + j, slice(self.t - width, self.t))
        if self.record:  # a re-prefill writes every position again (the latest forward's experts)
            routed = self._routed(u, width)
            for j, seq in enumerate(batch):
                seq.routing = list(routed[src[j], int(pad[src[j]]):])
        self.rows += batch
        self.start += [self.t - len(x) for x in ctx]
        self.pos += [len(x) for x in ctx]
        self._emit(range(n0, n0 + m), logits[src])
        self.prefills += 1

    @torch.no_grad()
    def _decode(self) -> None:
        """One token for every live row."""
        self._make_room(1)
        n, lo = len(self.rows), min(self.start)
        starts = torch.tensor(self.start)
        cols = torch.arange(lo, self.t + 1)
        mask = torch.zeros((n, 1, 1, len(cols)), dtype=self._model.dtype)
        mask.masked_fill_((cols[None, :] < starts[:, None])[:, None, None], float("-inf"))
        ids = torch.tensor([[s.output_ids[-1]] for s in self.rows])
        self.cache.r0, self.cache.r1, self.cache.w, self.cache.lo = 0, n, self.t, lo
        logits = self._forward(ids, mask, torch.tensor(self.pos)[:, None])
        if self.record:  # the input token's experts: position pos of each row
            for seq, r in zip(self.rows, self._routed(n, 1)[:, 0], strict=True):
                seq.routing.append(r)
        self.t += 1
        self.pos = [p + 1 for p in self.pos]
        self._emit(range(n), logits)
        self.steps += 1

    def _forward(self, ids, mask, positions) -> torch.Tensor:
        """float32 logits of each row's last position: the decoder, then the head on that position
        alone, made contiguous (on the strided slice a prefill's head copied its weight per row)."""
        hidden = self._model.get_decoder()(input_ids=ids, attention_mask=mask,
                                           position_ids=positions,
                                           cache=self.cache, use_cache=True).last_hidden_state
        return self._model.get_output_embeddings()(hidden[:, -1].contiguous()).float()

    def _routed(self, rows: int, columns: int):
        """The last forward's experts as numpy ``[rows, columns, sparse layers, top-k]``."""
        r = self.routers
        got = r.take_recorded().reshape(rows, columns, r.layers, r.k)
        return got.numpy().astype(moe.routing_dtype(r.experts))

    def _emit(self, rows: range, logits: torch.Tensor) -> None:
        # a constrained row samples from the tokens its grammar allows (grammar.py)
        seqs = [self.rows[i] for i in rows]
        self.grammars.apply([s.rid for s in seqs], logits,
                            [s.max_new_tokens - len(s.output_ids) for s in seqs])
        tok, logp = sample(logits, self.sampling)
        for i, t, lp in zip(rows, tok.tolist(), logp.tolist(), strict=True):
            seq = self.rows[i]
            self.grammars.consume(seq.rid, t)
            seq.output_ids.append(t)
            seq.logprobs.append(lp)
            seq.versions.append(self.version)

    def _reap(self) -> list[Sequence]:
        """Take out the rows that finished (end of sequence or budget spent); the last live row
        moves into each freed slot."""
        done = []
        for i in reversed(range(len(self.rows))):
            seq = self.rows[i]
            stop = not seq.ignore_eos and seq.output_ids[-1] in self.eos
            if stop or len(seq.output_ids) >= seq.max_new_tokens:
                done.append(self._finish(seq))
                self._drop_row(i)
        return done

    def _drop_row(self, i: int) -> None:
        last = len(self.rows) - 1
        if i != last:
            self.cache.copy_row(last, i, slice(self.start[last], self.t))
            for lst in (self.rows, self.start, self.pos):
                lst[i] = lst[last]
        for lst in (self.rows, self.start, self.pos):
            lst.pop()

    def _shift(self, delta: int) -> None:
        """Move every live row's columns by ``delta`` (the cache grows if they would not fit)."""
        if self.rows:
            lo = min(self.start)
            if self.t + delta + 1 > self.cache.columns:
                self.cache = self.cache.grown(self.t + delta + 1 + 64)
            self.cache.move(slice(lo, self.t), slice(lo + delta, self.t + delta),
                            slice(0, len(self.rows)))
            self.start = [s + delta for s in self.start]
        self.t += delta

    def _make_room(self, q: int) -> None:
        """``q`` free columns from the write column: the live window moves to the front, and the
        cache grows when even that is not enough."""
        if self.t + q <= self.cache.columns:
            return
        self._shift(-min(self.start)) if self.rows else setattr(self, "t", 0)
        if self.t + q > self.cache.columns:
            self.cache = self.cache.grown(self.t + q + 64)

    @contextlib.contextmanager
    def paused(self, version: int):
        self._check_alive()
        t0 = time.perf_counter()
        timings: dict = {}
        yield timings  # the caller loads the weights; no step runs meanwhile (the loop is in poll)
        interrupted = list(self.rows) + list(self.waiting)
        self.rows, self.start, self.pos, self.t = [], [], [], 0
        self.waiting.clear()
        bad = self._nonfinite_weights()
        if bad:
            self._failed = (f"the weights of version {version} are not finite ({len(bad)} tensors: "
                            f"{', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}); generation "
                            "stopped")
            raise RuntimeError(self._failed)
        self.version = version
        for seq in interrupted:
            if len(seq.output_ids) >= seq.max_new_tokens:  # nothing left to generate
                self._finished_during_pause.append(self._finish(seq))
                continue
            seq.segments += 1
            self.waiting.append(seq)
        timings.update(pause_s=time.perf_counter() - t0, pause_wait_s=0.0,
                       interrupted=len(interrupted))

    def configure(self, sampling: Sampling, context: int) -> None:
        if self.seqs:
            raise RuntimeError(f"configure() with {len(self.seqs)} sequences in flight")
        self._start(sampling,
                    kv_cache_tokens(self.setup.engine, self.setup.sequences, context, None))

    def _check_alive(self) -> None:
        if self._failed is not None:
            raise RuntimeError(self._failed)

    def _stop(self) -> None:
        self.rows, self.waiting = [], collections.deque()

"""The grammar masks (grammar.py) as a logits processor of transformers' continuous batching: the
paged path of the hf engine (a GPU, or engine.hf.cpu_batching=paged).

Before each step the batch's requests are prepared (``prepare_tensor_args``): each request with a
grammar catches its matcher up with the tokens it has (the engine's sequence up to its segment, then
the segment's own), and its allowed tokens go into a row of a mask bank; the step's argument names
each logits row's bank row (-1: not constrained). In the step (``__call__``) the rows are masked
before temperature and top-p. This needs each step's tokens before the next step is prepared, so
the engine starts the loop without asynchronous batching.
"""

from __future__ import annotations

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
)

from areal_cli.engines.hf.grammar import Grammars


class CBGrammar(ContinuousBatchingLogitsProcessor):
    """Masks the logits rows of constrained requests; ``segment`` is the engine's table of its
    requests (request id → (the sequence's id, its output length at the segment's start)) and
    ``seqs`` its sequences."""

    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, grammars: Grammars, segment: dict, seqs: dict, vocab: int, device):
        self.grammars, self.segment, self.seqs = grammars, segment, seqs
        self.bank = torch.ones((16, vocab), dtype=torch.bool, device=device)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(-1)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        rows = []
        for future in requests_with_new_token:
            state = future.state
            entry = self.segment.get(state.request_id)
            seq = self.seqs.get(entry[0]) if entry else None
            if seq is None or not seq.grammar:
                rows.append(-1)
                continue
            # the tokens of the sequence so far: those before this segment (stable while it runs),
            # then the segment's own
            made = list(seq.output_ids[:entry[1]]) + list(state.generated_tokens)
            self.grammars.catch_up(seq.rid, made)
            allowed = self.grammars.allowed(seq.rid, self.bank.shape[1],
                                            seq.max_new_tokens - len(made))
            n = sum(r >= 0 for r in rows)
            if n >= len(self.bank):  # grows before any step reads it
                self.bank = torch.ones((2 * n, self.bank.shape[1]), dtype=torch.bool,
                                       device=self.bank.device)
            self.bank[n] = allowed.to(self.bank.device)
            rows.append(n)
        return torch.tensor(rows, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        index = tensor_arg[: scores.shape[0]].long()
        allowed = self.bank[index.clamp(min=0)] | (index < 0)[:, None]
        return scores.masked_fill(~allowed[:, : scores.shape[1]], float("-inf"))


def install(manager, processor: CBGrammar) -> None:
    """Put ``processor`` first in ``manager``'s logits processors (before temperature and top-p),
    before the manager starts (its input buffers are sized from the list then)."""
    procs = manager.logit_processor
    procs.logits_processor.insert(0, processor)
    procs.tensors_required += 1
    procs.do_processing = True

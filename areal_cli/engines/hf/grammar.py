"""Grammar-constrained decoding for the hf engine: each sequence with a grammar
(``Sequence.grammar``, a Lark grammar in llguidance's dialect) gets an llguidance matcher, and
every step its row of the logits is masked to the tokens the grammar allows next, before
sampling; the sampled token then advances the matcher.

The behaviour logprob of a constrained token is therefore of the masked distribution (renormalised
over the allowed tokens), which the trainer does not recompute: docs/agents.md says how such tokens
are trained. A matcher lives with its sequence across a weight update (the sequence continues from
the tokens it has; the matcher has consumed them). Once the grammar is complete the matcher allows
only the end-of-sequence token, so a constrained sequence ends there.

``Grammars`` serves the slot loop (``apply`` before sampling, ``consume`` after); ``CBGrammar`` is
the same masks as a logits processor of transformers' continuous batching (the paged path).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Hashable

import numpy as np
import torch

INSTALL = "pip install 'areal-cli[agents]' (llguidance)"


def _llguidance():
    try:
        import llguidance
        import llguidance.hf
    except ImportError as err:
        raise ValueError(f"a constrained request needs llguidance: {INSTALL}") from err
    return llguidance


@functools.lru_cache(maxsize=4)
def _ll_tokenizer(model_path: str):
    """llguidance's view of the model's tokenizer (built once per model: about a second)."""
    from transformers import AutoTokenizer

    return _llguidance().hf.from_tokenizer(AutoTokenizer.from_pretrained(model_path))


class Grammars:
    """The matchers of the sequences being generated under a grammar, keyed by the caller's id."""

    def __init__(self, model_path, eos: set[int]):
        self.model_path, self.eos = model_path, eos
        self._tokenizer = None  # llguidance's view of the model's tokenizer (on first use)
        self.matchers: dict[Hashable, list] = {}  # key → [its matcher, tokens it has consumed]
        self.lock = threading.Lock()  # the paged loop's thread and the caller's share the table
        self.mask_s = 0.0  # time spent computing and applying masks (benchmarks read it)
        self.masked = 0  # rows masked so far

    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = _ll_tokenizer(str(self.model_path))
        return self._tokenizer

    def start(self, key: Hashable, grammar: str) -> None:
        """A matcher for ``key`` at the start of ``grammar``; ValueError naming its error."""
        llg = _llguidance()
        matcher = llg.LLMatcher(self.tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"the request's grammar is not valid: {matcher.get_error()}")
        with self.lock:
            self.matchers[key] = [matcher, 0]

    def forget(self, key: Hashable) -> None:
        with self.lock:
            self.matchers.pop(key, None)

    def allowed(self, key: Hashable, vocab: int) -> torch.Tensor | None:
        """The tokens the grammar of ``key`` allows next, as a bool row of ``vocab`` (the logits'
        width: ids past the tokenizer's are never allowed); None when ``key`` has no grammar."""
        with self.lock:
            entry = self.matchers.get(key)
        if entry is None:
            return None
        matcher = entry[0]
        # one bit per token, little-endian within each 32-bit word
        words = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(words, bitorder="little")[:vocab].astype(bool)
        row = torch.zeros(vocab, dtype=torch.bool)
        row[: len(bits)] = torch.from_numpy(bits)
        return row

    def apply(self, keys: list[Hashable], logits: torch.Tensor) -> None:
        """Mask ``logits [len(keys), vocab]`` in place: the rows of keys with a grammar keep only
        their allowed tokens (-inf elsewhere)."""
        if not self.matchers:
            return
        t0 = time.perf_counter()
        for i, key in enumerate(keys):
            row = self.allowed(key, logits.shape[-1])
            if row is not None:
                logits[i].masked_fill_(~row.to(logits.device), float("-inf"))
                self.masked += 1
        self.mask_s += time.perf_counter() - t0

    def consume(self, key: Hashable, token: int) -> None:
        """Advance ``key``'s matcher by the token sampled from its mask (the end-of-sequence token
        ends it: nothing follows)."""
        with self.lock:
            entry = self.matchers.get(key)
        if entry is None:
            return
        entry[1] += 1
        if token not in self.eos:
            ok = entry[0].consume_token(token)
            assert ok, f"a token sampled under the mask was refused: {entry[0].get_error()}"

    def catch_up(self, key: Hashable, tokens: list[int]) -> None:
        """Advance ``key``'s matcher by the tokens of ``tokens`` (all of its sequence's so far) it
        has not consumed yet."""
        with self.lock:
            entry = self.matchers.get(key)
        for token in tokens[entry[1]:] if entry is not None else []:
            self.consume(key, token)

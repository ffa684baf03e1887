"""Grammar-constrained decoding for the hf engine: each sequence with a grammar
(``Sequence.grammar``, a Lark grammar in llguidance's dialect) gets an llguidance matcher, and
every step its row of the logits is masked to the tokens the grammar allows next, before
sampling; the sampled token then advances the matcher. Within ``CLOSE_AT`` tokens of its budget
a constrained sequence is steered to close: of the allowed tokens, only those that end a string
(then those that end an array or an object) stay, where there are any, so that a reply ends
complete rather than cut; one still longer than its budget ends with finish_reason "length".

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


CLOSE_AT = 16
"""A constrained sequence with this many tokens of its budget left is steered to close (``_steer``)
so that its reply ends complete rather than cut by the budget."""
TEMPLATES = 64  # compiled grammars kept (a matcher per sequence is a copy of its grammar's)


@functools.lru_cache(maxsize=4)
def _ll_tokenizer(model_path: str):
    """llguidance's view of the model's tokenizer (built once per model: about a second), and the
    two classes of tokens that close JSON: those starting with a quote (they end a string) and
    those starting with a closing bracket or brace (they end an array or object)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    closers = [np.array([bool(p) and p[0] in chars for p in pieces], dtype=bool)
               for chars in ('"', "}]")]
    return _llguidance().hf.from_tokenizer(tok), closers


class Grammars:
    """The matchers of the sequences being generated under a grammar, keyed by the caller's id."""

    def __init__(self, model_path, eos: set[int]):
        self.model_path, self.eos = model_path, eos
        self._tokenizer = None  # llguidance's view of the model's tokenizer (on first use)
        self.matchers: dict[Hashable, list] = {}  # key → [its matcher, tokens it has consumed]
        self.templates: dict[str, object] = {}  # grammar text → its compiled matcher, unused
        self.lock = threading.Lock()  # the paged loop's thread and the caller's share the table
        self.mask_s = 0.0  # time spent computing and applying masks (benchmarks read it)
        self.masked = 0  # rows masked so far

    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = _ll_tokenizer(str(self.model_path))
        return self._tokenizer

    def start(self, key: Hashable, grammar: str) -> None:
        """A matcher for ``key`` at the start of ``grammar`` (a copy of its compiled matcher);
        ValueError naming the grammar's error."""
        template = self.templates.get(grammar)
        if template is None:
            template = _llguidance().LLMatcher(self.tokenizer()[0], grammar, log_level=0)
            if template.is_error():
                raise ValueError(f"the request's grammar is not valid: {template.get_error()}")
            if len(self.templates) >= TEMPLATES:
                self.templates.pop(next(iter(self.templates)))
            self.templates[grammar] = template
        with self.lock:
            self.matchers[key] = [template.deep_copy(), 0]

    def forget(self, key: Hashable) -> None:
        with self.lock:
            self.matchers.pop(key, None)

    def allowed(self, key: Hashable, vocab: int, left: int) -> torch.Tensor | None:
        """The tokens the grammar of ``key`` allows next, as a bool row of ``vocab`` (the logits'
        width: ids past the tokenizer's are never allowed), steered to close with ``left`` tokens
        of the budget left; None when ``key`` has no grammar."""
        with self.lock:
            entry = self.matchers.get(key)
        if entry is None:
            return None
        t0 = time.perf_counter()
        row = np.zeros(vocab, dtype=bool)
        self._fill(entry[0], row, left)
        self.masked += 1
        self.mask_s += time.perf_counter() - t0
        return torch.from_numpy(row)

    def apply(self, keys: list[Hashable], logits: torch.Tensor, left: list[int]) -> None:
        """Mask ``logits [len(keys), vocab]`` in place: the rows of keys with a grammar keep only
        their allowed tokens (-inf elsewhere); ``left``: each row's budget left. The masks are
        unpacked in numpy and applied in one torch op: a small op per row costs milliseconds on a
        busy CPU (thread-pool wake-ups)."""
        with self.lock:
            entries = [(i, self.matchers.get(k)) for i, k in enumerate(keys)]
        entries = [(i, e[0]) for i, e in entries if e is not None]
        if not entries:
            return
        t0 = time.perf_counter()
        allowed = np.ones(tuple(logits.shape), dtype=bool)
        for i, matcher in entries:
            self._fill(matcher, allowed[i], left[i])
        logits.masked_fill_(torch.from_numpy(~allowed).to(logits.device), float("-inf"))
        self.masked += len(entries)
        self.mask_s += time.perf_counter() - t0

    def _fill(self, matcher, row: np.ndarray, left: int) -> None:
        _unpack(matcher, row)
        if left <= CLOSE_AT:
            _steer(row, self.tokenizer()[1])

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


def _steer(row: np.ndarray, closers: list[np.ndarray]) -> None:
    """Keep, of the allowed tokens in ``row``, the first class of ``closers`` any of them is in (a
    quote before a bracket: a string ends first); all of them where none is (the grammar forces
    what comes next: a literal, a required key)."""
    for cls in closers:
        hit = row[: len(cls)] & cls[: len(row)]
        if hit.any():
            row[: len(hit)] = hit
            row[len(hit):] = False
            return


def _unpack(matcher, row: np.ndarray) -> None:
    """``row`` (bool, the logits' width) ← the tokens ``matcher`` allows next: llguidance's bitmask
    holds one bit per token, little-endian within each 32-bit word."""
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8),
                         bitorder="little")
    width = min(len(row), len(bits))
    row[:width] = bits[:width]
    row[width:] = False

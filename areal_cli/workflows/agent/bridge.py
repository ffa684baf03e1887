"""The hand-off between the agent endpoint's event loop and the rollout worker's main loop.

The engine belongs to the worker's main thread (it submits, polls and pauses it for weight
updates). The endpoint's handlers run in an asyncio loop on a thread of their own: a handler
``await``s ``generate``, which queues the request; the main thread's ``pump`` submits queued
requests to the engine, and ``resolve`` hands each finished sequence back to the loop. A request
waits through a weight update like any other sequence: it keeps its tokens and each token its
version (the engine's interruption).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
from dataclasses import dataclass

from areal_cli.engines.base import Engine, Sequence


@dataclass(frozen=True)
class CallId:
    """The engine request of one choice of one endpoint call."""

    number: int

    def __str__(self) -> str:
        return f"agent-{self.number}"


class EngineBridge:
    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop):
        self.engine, self.loop = engine, loop
        self.pending: queue.SimpleQueue = queue.SimpleQueue()  # (Sequence, future) from the loop
        self.waiting: dict[CallId, asyncio.Future] = {}  # main thread only
        # requests whose handler stopped waiting (its client went away, its episode timed out)
        self.cancelled: queue.SimpleQueue = queue.SimpleQueue()
        self.aborted = 0  # such requests stopped in (or before) the engine
        self.numbers = itertools.count()

    async def generate(self, prompt_ids: list[int], max_new_tokens: int,
                       top_logprobs: int = 0, grammar: str = "") -> Sequence:
        """Generate one continuation of ``prompt_ids`` (called in the endpoint's loop), with
        ``top_logprobs`` alternatives per token (an engine that returns them), under ``grammar``
        when one is given (``Sequence.grammar``)."""
        fut = self.loop.create_future()
        rid = CallId(next(self.numbers))
        seq = Sequence(rid, list(prompt_ids), max_new_tokens, top_logprobs=top_logprobs,
                       grammar=grammar)
        self.pending.put((seq, fut))
        try:
            return await fut
        except asyncio.CancelledError:
            self.cancelled.put(rid)  # nobody waits for it: the main thread stops it
            raise

    def pump(self) -> int:
        """Stop the requests nobody waits for any more, then submit every queued request to the
        engine (main thread); how many were submitted."""
        dropped = set()
        while True:
            try:
                dropped.add(self.cancelled.get_nowait())
            except queue.Empty:
                break
        n = 0
        while True:
            try:
                seq, fut = self.pending.get_nowait()
            except queue.Empty:
                break
            if seq.rid in dropped:
                self.aborted += 1
                continue
            self.waiting[seq.rid] = fut
            self.engine.submit(seq)
            n += 1
        stop = [rid for rid in dropped if self.waiting.pop(rid, None) is not None]
        self.aborted += len(self.engine.abort(stop)) if stop else 0
        return n

    def resolve(self, seq: Sequence) -> None:
        """Hand a finished sequence back to the handler awaiting it (main thread)."""
        fut = self.waiting.pop(seq.rid, None)
        if fut is not None:
            self.loop.call_soon_threadsafe(_settle, fut, seq)

    def in_flight(self) -> int:
        return len(self.waiting) + self.pending.qsize()


def _settle(fut: asyncio.Future, seq: Sequence) -> None:
    if not fut.done():  # a handler cancelled (its episode timed out) no longer waits
        fut.set_result(seq)

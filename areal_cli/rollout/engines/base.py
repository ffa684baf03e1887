"""The generation engine interface every rollout worker drives (hf, vllm).

Token in, token out: an engine takes prompt token ids and returns generated token ids with
the behaviour logprob and the policy version of every token. A weight update interrupts
generation: unfinished sequences continue under the new weights from the tokens they have.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field


@dataclass
class Sequence:
    """One generation request and everything produced for it so far."""

    rid: Hashable  # the caller's id of this request (workflows.TurnId, evaluator.EvalId), returned as given;
    # its str() is unique in the engine
    prompt_ids: list[int]  # the context given to the engine
    max_new_tokens: int  # budget of this request
    output_ids: list[int] = field(default_factory=list)  # generated tokens
    logprobs: list[float] = field(default_factory=list)  # behaviour logprob per generated token
    versions: list[int] = field(default_factory=list)  # policy version per generated token
    finish_reason: str = ""  # "" while running; then "stop" | "length"
    segments: int = 1  # engine requests this sequence took (1 + interruptions)
    ignore_eos: bool = False  # generate max_new_tokens tokens whatever they are (length profiles)

    def segment_id(self) -> str:
        """The engine's request id of this sequence's current segment (``<rid>#<segment>``): an engine
        maps it back to the sequence through its own table, never by parsing it."""
        return f"{self.rid}#{self.segments}"


class Engine(ABC):
    """What a rollout worker needs from a generation engine."""

    version: int = 0  # policy version of the weights now loaded
    seqs: dict  # rid → Sequence, for every sequence not finished yet

    def submit(self, seq: Sequence) -> None:
        """Start generating ``seq`` (non-blocking)."""
        self.seqs[seq.rid] = seq
        self._submit_segment(seq)

    @abstractmethod
    def _submit_segment(self, seq: Sequence) -> None:
        """Hand the engine ``seq``'s prompt plus the tokens it has so far (a new request)."""

    @abstractmethod
    def poll(self, timeout_s: float) -> list[Sequence]:
        """Sequences finished since the last call; waits at most ``timeout_s`` for the first."""

    @abstractmethod
    def update_weights(self, version: int, load: Callable[[], dict]) -> dict:
        """Pause, run ``load()`` (which fills the weights in place), drop KV computed under the old
        weights, continue unfinished sequences under ``version``; returns timings."""

    @property
    @abstractmethod
    def model(self):
        """The torch module whose parameters ``load()`` fills (hf); None for engines that
        receive weights themselves (vllm)."""

    @abstractmethod
    def close(self) -> None:
        """Stop generating and free the engine."""

    def in_flight(self) -> int:
        return len(self.seqs)

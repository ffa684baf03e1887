"""The generation engine interface every rollout worker drives (hf, vllm): what an engine is built
from (``EngineSetup``) and what it does (``Engine``).

Token in, token out: an engine takes prompt token ids and returns generated token ids with
the behaviour logprob and the policy version of every token. A weight update interrupts
generation: unfinished sequences continue under the new weights from the tokens they have.
An engine owns its weight intake: built with a ``WeightSource`` it holds the receiving end of
its weight transfer, and ``update_weights(version)`` receives the trainer's next broadcast.

A rollout worker's setup names a ``WeightSource`` (trainer rank 0's weight group), so its engine
joins that group when it is built and ``update_weights(version)`` receives from it; the
evaluator's has none (its weights never change). No torch here.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from areal_cli.config.schema import EngineConfig, RootConfig


@dataclass(frozen=True)
class Sampling:
    """How every request submitted from now on is sampled."""

    temperature: float
    """Sampling temperature; 0 = greedy (argmax; a tiny temperature is not greedy)."""
    top_p: float = 1.0
    """Nucleus sampling (1.0 = off); ignored when greedy."""

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass(frozen=True)
class WeightSource:
    """Trainer rank 0's weight group, which a rollout worker's engine joins when it is built."""

    cfg: RootConfig
    """The run's config: rollout.workers, weights.*, engine.* and launcher.peer_timeout_s size the
    group."""
    host: str
    """Trainer rank 0's weights host (endpoints.json ``weights_host``)."""
    port: int
    """Its port (endpoints.json ``weights_port``)."""
    store: str = ""
    """The group's FileStore in the run directory (endpoints.json ``weights_store``; local runs)."""


@dataclass(frozen=True)
class EngineSetup:
    """Everything ``factory.make_engine`` builds an engine from."""

    engine: EngineConfig
    """engine.* of the run (or of ``areal eval``)."""
    model_path: str | Path
    """A Hugging Face model directory."""
    eos_token_id: int | list[int]
    """The tokenizer's end of sequence (hf; vLLM reads its own)."""
    sampling: Sampling
    """Sampling of the first requests; ``Engine.configure`` changes it."""
    sequences: int
    """Sequences generating at once (hf: sizes the KV cache when engine.kv_cache_tokens is 0)."""
    context: int = 0
    """Tokens of one sequence, prompt and generation (hf: sizes the KV cache with ``sequences``)."""
    seed: int = 0
    """The run's seed (vLLM samples with seed · 1000 + index)."""
    index: int = 0
    """Rollout worker index (its rank in the weight group); 0 for the evaluator."""
    device: str = ""
    """hf: a torch device; "" = the current GPU if there is one, else the CPU."""
    weights: WeightSource | None = None
    """Where ``update_weights`` receives from; None = weights that never change (evaluation)."""
    routing: bool = False
    """MoE: record the experts each token was routed to (``Sequence.routing``; routing replay)."""


@dataclass
class Sequence:
    """One generation request and everything produced for it so far."""

    # the caller's id of this request (workflows.turns.TurnId, eval.runner.EvalId), returned as
    # given;
    rid: Hashable
    # its str() is unique in the engine
    prompt_ids: list[int]  # the context given to the engine
    max_new_tokens: int  # budget of this request
    output_ids: list[int] = field(default_factory=list)  # generated tokens
    logprobs: list[float] = field(default_factory=list)  # behaviour logprob per generated token
    versions: list[int] = field(default_factory=list)  # policy version per generated token
    finish_reason: str = ""  # "" while running; then "stop" | "length"
    segments: int = 1  # engine requests this sequence took (1 + interruptions)
    ignore_eos: bool = False  # generate max_new_tokens tokens whatever they are (length profiles)
    top_logprobs: int = 0  # alternatives wanted per generated token (Engine.top_logprobs at most)
    top: list = field(default_factory=list)  # per generated token: [(id, logprob)], best first
    # MoE, EngineSetup.routing: per context position the engine ran (prompt, then output), its
    # experts [sparse layers, top-k] (numpy) from the last forward over it (areal_cli/moe.py)
    routing: list = field(default_factory=list)
    # a Lark grammar (llguidance's dialect) the generated text must follow: each token is sampled
    # from the tokens it allows (its logprob of that masked distribution); "" = unconstrained
    grammar: str = ""

    def segment_id(self) -> str:
        """The engine's request id of this sequence's current segment (``<rid>#<segment>``): an
        engine maps it back to the sequence through its own table, never by parsing it."""
        return f"{self.rid}#{self.segments}"


class Engine(ABC):
    """What a rollout worker and the evaluator need from a generation engine."""

    version: int = 0  # policy version of the weights now loaded
    seqs: dict  # rid → Sequence, for every sequence not finished yet
    receiver = None  # the receiving end of the weight transfer (None: the weights never change)
    top_logprobs: int = 0  # alternatives per generated token it can return (0: the sampled one's)

    def submit(self, seq: Sequence) -> None:
        """Start generating ``seq`` (non-blocking)."""
        self.seqs[seq.rid] = seq
        self._submit_segment(seq)

    @abstractmethod
    def _submit_segment(self, seq: Sequence) -> None:
        """Hand the engine ``seq``'s prompt plus the tokens it has so far (a new request)."""

    def abort(self, rids) -> list[Sequence]:
        """Stop generating the unfinished sequences among ``rids`` and forget them: ``poll`` never
        returns them. They come back as they are (the tokens they have), for the caller's
        accounting."""
        out = []
        for rid in rids:
            seq = self.seqs.pop(rid, None)
            if seq is not None:
                self._abort_segment(seq)
                out.append(seq)
        return out

    @abstractmethod
    def _abort_segment(self, seq: Sequence) -> None:
        """Cancel ``seq``'s current request in the engine (``seqs`` no longer holds it)."""

    @abstractmethod
    def poll(self, timeout_s: float) -> list[Sequence]:
        """Sequences finished since the last call; waits at most ``timeout_s`` for the first."""

    @abstractmethod
    def configure(self, sampling: Sampling, context: int) -> None:
        """Sample the requests submitted from now on with ``sampling``, for sequences of up to
        ``context`` tokens (hf sizes its KV cache for them); only while no sequence is in flight."""

    @abstractmethod
    def paused(self, version: int) -> contextlib.AbstractContextManager[dict]:
        """Pause generation; the body loads new weights (in place) and may add its timings to the
        dict it is given; on exit drop KV computed under the old weights and continue unfinished
        sequences under ``version``, adding the pause's own timings."""

    def update_weights(self, version: int) -> dict:
        """Receive the trainer's broadcast of ``version`` through this engine's receiver, paused;
        returns timings (weight_recv_s, weight_load_s, pause_s, pause_wait_s, interrupted, ...)."""
        if self.receiver is None:
            raise RuntimeError("this engine was built without a weight source "
                               "(EngineSetup.weights): it has no weights to receive")
        with self.paused(version) as timings:
            timings.update(self.receiver.receive(version))
        return timings

    def begin_update(self, version: int) -> None:
        """Start taking in ``version``; the worker goes on polling until ``update_ready``, then
        calls
        ``finish_update``. Here (an engine that receives in the pause) nothing starts until then."""
        self._next_version = version

    def update_ready(self) -> bool:
        """Whether ``finish_update`` would not wait for the wire."""
        return True

    def finish_update(self) -> dict:
        """The update begun by ``begin_update``, applied: ``update_weights``' timings."""
        return self.update_weights(self._next_version)

    def sleep(self) -> dict:
        """Stop generating until ``wake`` (cluster.share=alternate: the trainer takes the device),
        freeing what the engine can; unfinished sequences are kept and continue after the next
        update. Returns timings (``sleep_s``, ``freed_bytes``). Here: nothing is freed; the worker
        only stops stepping the engine."""
        return {}

    def wake(self) -> dict:
        """Take back what ``sleep`` freed, before the update that follows it; timings
        (``wake_s``)."""
        return {}

    def weights_digest(self) -> str:
        """sha256 of the weights as received (weights.verify); "" where they cannot be read here."""
        return self.receiver.digest() if self.receiver is not None else ""

    @abstractmethod
    def close(self) -> None:
        """Stop generating and free the engine (and its receiver)."""

    def in_flight(self) -> int:
        return len(self.seqs)


def merge_routing(into: list, routing: list) -> None:
    """A request's routing (``Sequence.routing``, from context position 0) over a trajectory's
    (``into``, the same positions: the request's context is a prefix of the trajectory): its
    positions are written again, the latest forward's experts winning."""
    into[:len(routing)] = routing


def routing_array(routing: list) -> np.ndarray:
    """A trajectory's routing as ``Sample.routed_experts`` (an empty array when it has none)."""
    return np.stack(routing) if routing else np.zeros(0, np.uint8)


"""What an engine is built from: the same ``EngineSetup`` for a rollout worker and the evaluator.

A rollout worker's setup names a ``WeightSource`` (trainer rank 0's weight group), so its engine
joins that group when it is built and ``update_weights(version)`` receives from it; the
evaluator's has none (its weights never change). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    """The run's config: rollout.workers, weights.*, engine.* and launcher.peer_timeout_s size the group."""
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

"""MoE routing from vLLM, for routing replay (``algorithm.routing_replay``, ``areal_cli/moe.py``).

With ``enable_return_routed_experts`` vLLM records the top-k experts of every token it runs, per
decoder layer, in a buffer beside its KV cache (a prefix-cache hit reads the rows the request that
computed those blocks wrote: under areal's per-version cache salt, rows of the same weights), and
hands a finished request's rows over as ``CompletionOutput.routed_experts``: ``[prompt + output - 1
positions, decoder layers, top-k]`` (the last sampled token never ran). ``Routing.of`` turns that
into ``Sequence.routing``: one ``[sparse layers, top-k]`` row per position, as the hf engine
records it. Each request of a sequence (a re-prefill after a weight update) runs its whole context
again, so the last request's rows are those of the last forward over every position.
"""

from __future__ import annotations

import numpy as np

from areal_cli import moe


class Routing:
    """The routing layout of vLLM's model (its transformers config ``hf_config``)."""

    def __init__(self, hf_config):
        self.layers = hf_config.num_hidden_layers  # vLLM keeps a column per decoder layer
        self.sparse = moe.sparse_layers(hf_config)  # the columns a routing on the wire keeps
        self.k = moe.top_k(hf_config)
        self.dtype = moe.routing_dtype(moe.experts_of(hf_config))

    @classmethod
    def of_model(cls, hf_config) -> Routing | None:
        """The layout of an MoE model; None for a dense one (nothing to record)."""
        return cls(hf_config) if moe.sparse_layers(hf_config) else None

    def of(self, routed, positions: int) -> list[np.ndarray]:
        """``Sequence.routing`` of a finished request whose context and output span ``positions``
        (prompt + output - 1) from vLLM's ``routed_experts`` (None: vLLM returned none, and the
        trainer routes those tokens itself)."""
        if routed is None:
            return []
        routed = np.asarray(routed)
        if routed.shape != (positions, self.layers, self.k):
            raise RuntimeError(f"vLLM returned routed experts of shape {list(routed.shape)} for a "
                               f"request of {positions} positions run ([positions, "
                               f"{self.layers} layers, top-{self.k}] expected); set "
                               "algorithm.routing_replay=false to train without them")
        return list(routed[:, self.sparse].astype(self.dtype))

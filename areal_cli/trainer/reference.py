"""The frozen reference policy of the KL term: the initial weights, FSDP-sharded like the actor
(same ``build_policy``), no gradients, no optimizer; it only answers ``ref_logp``."""

from __future__ import annotations

from pathlib import Path

import torch

from areal_cli.trainer.batching import Rollouts, dummy_forward, model_inputs, packed_row_tokens
from areal_cli.trainer.logprobs import forward_logprobs
from areal_cli.trainer.model import build_policy


class Reference:
    def __init__(self, model_path: Path, device: torch.device, compute_dtype: torch.dtype,
                 packing: bool, temperature: float, chunk: int, buckets: int = 0):
        self.model = build_policy(model_path, device, compute_dtype, activation_checkpointing=False)
        self.model.requires_grad_(False)
        self.model.eval()
        self.device, self.dtype = device, compute_dtype
        self.packing, self.temperature = packing, temperature
        self.chunk, self.buckets = chunk, buckets

    @torch.no_grad()
    def logprobs(self, ro: Rollouts, mbs: list[list[int]]) -> torch.Tensor:
        """``[N, L]`` reference logprobs of this rank's rows (the rows of ``mbs``), 0 elsewhere.
        Every rank runs one forward per micro-batch, empty ones included (FSDP collectives)."""
        out = torch.zeros(ro.loss_mask.shape, device=self.device)
        for mb in mbs:
            if not mb:
                dummy_forward(self.model, self.device, self.dtype, backward=False)
                continue
            # as the policy's forward packs them (StepRunner._forward): rows of at most a packed row
            # on GPUs, the mask built on the GPU (one row of a whole micro-batch with its [T, T]
            # mask built on the host was the square of the micro-batch in memory and time)
            x = model_inputs(ro, mb, self.packing, device=self.device,
                             row_tokens=packed_row_tokens(self.device),
                             buckets=self.buckets)
            lp, _ = forward_logprobs(self.model, x, self.dtype, self.temperature, self.chunk,
                                     self.buckets)
            out[mb] = lp
        return out

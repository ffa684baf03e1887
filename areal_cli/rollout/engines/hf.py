"""The embedded engine: transformers continuous batching (paged KV cache), CPU or GPU.

Interruptible: on a weight update the generation loop is paused at a step boundary, the
weights are loaded in place, every unfinished request is cancelled (its KV was computed
under the old weights) and resubmitted with its prompt plus the tokens it has so far, so it
continues — re-prefilled — under the new version. Block (prefix) sharing is off so no KV of
old weights is ever reused.

Around the load: on an accelerator the loop computes on a stream of its own while ``load()``
fills the weights on the caller's, so the device is synchronized before the loop resumes; the
new weights are checked to be finite (a NaN weight otherwise surfaces as a device-side assert
in sampling, which kills the process without naming the cause). Every unfinished request is
cancelled, so the scheduler's "block new requests" flag (set when it offloads a request under
cache pressure, cleared only when some request finishes) is cleared: with no active request
left nothing would ever clear it and the resubmitted requests would wait forever.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch

from areal_cli.rollout.engines.base import Engine, Sequence

log = logging.getLogger(__name__)


def engine_dtype(name: str, device: torch.device) -> torch.dtype:
    """The torch dtype of a resolved engine.dtype (config/resolve.py made "auto" concrete)."""
    if name == "auto":
        raise ValueError("engine.dtype=auto: resolve the config first (areal_cli.config.resolve)")
    return getattr(torch, name)


class HFEngine(Engine):
    def __init__(self, model_path, device: torch.device, dtype: torch.dtype, **engine):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype,
                                                     attn_implementation="sdpa").to(device)
        model.requires_grad_(False)
        self._start(model, **engine)

    def _start(self, model, *, temperature: float, top_p: float, max_batch_tokens: int,
               kv_cache_tokens: int, page_size: int, eos_token_id, greedy: bool = False) -> None:
        """Start the continuous-batching loop on ``model``: sampling at ``temperature`` (rollouts),
        or argmax when ``greedy`` (evaluation; a tiny temperature is not greedy)."""
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.device, self._model = model.device, model
        if greedy:
            sampling = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        gen = GenerationConfig(**sampling, eos_token_id=eos_token_id, pad_token_id=eos_token_id,
                               max_new_tokens=1 << 20)
        cb = ContinuousBatchingConfig(
            num_blocks=max(16, math.ceil(kv_cache_tokens / page_size)), page_size=page_size,
            max_batch_tokens=max_batch_tokens, return_logprobs=True, allow_block_sharing=False)
        self.eos = set([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        self.manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        self.manager.start()
        self.seqs: dict = {}  # rid → sequence
        self.segment: dict[str, tuple] = {}  # engine request id (Sequence.segment_id) → (rid, output length at start)
        self.version = 0
        self._finished_during_pause: list[Sequence] = []
        self._failed: str | None = None  # why generation was stopped (non-finite weights)

    @property
    def model(self):
        return self._model

    def _submit_segment(self, seq: Sequence) -> None:
        req = seq.segment_id()
        self.segment[req] = (seq.rid, len(seq.output_ids))
        remaining = seq.max_new_tokens - len(seq.output_ids)
        got = self.manager.add_request(list(seq.prompt_ids) + list(seq.output_ids), request_id=req,
                                       max_new_tokens=remaining, streaming=True,
                                       eos_token_id=-1 if seq.ignore_eos else None)
        if got is None:
            raise RuntimeError("the continuous batching manager refused a request (it is stopping)")

    def poll(self, timeout_s: float) -> list[Sequence]:
        self._check_alive()
        done, deadline = self.take_finished_during_pause(), time.monotonic() + timeout_s
        while True:
            wait = max(0.0, deadline - time.monotonic()) if not done else 0.0
            out = self.manager.get_result(timeout=wait) if wait > 0 else self._get_nowait()
            if out is None:
                return done
            seq = self._apply(out)
            if seq is not None:
                done.append(seq)

    def _get_nowait(self):
        q = self.manager.output_router.output_queue
        return None if q.empty() else q.get_nowait()

    def _apply(self, out) -> Sequence | None:
        """Fold one streamed output into its sequence; the sequence when it just finished."""
        if out.request_id not in self.segment:
            return None  # a cancelled segment still draining
        rid, start = self.segment[out.request_id]
        seq = self.seqs[rid]
        if out.error:
            raise RuntimeError(f"generation failed for {rid}: {out.error}")
        new = list(out.generated_tokens)
        del seq.output_ids[start:], seq.logprobs[start:], seq.versions[start:]
        seq.output_ids += new
        seq.logprobs += list(out.logprobs)[: len(new)]
        seq.versions += [self.version] * len(new)
        if not out.is_finished():
            return None
        del self.segment[out.request_id]
        return self._finish(seq)

    def _finish(self, seq: Sequence) -> Sequence:
        del self.seqs[seq.rid]
        last = seq.output_ids[-1] if seq.output_ids else None
        seq.finish_reason = "stop" if last in self.eos and not seq.ignore_eos else "length"
        return seq

    def update_weights(self, version: int, load: Callable[[], dict]) -> dict:
        self._check_alive()
        t0 = time.perf_counter()
        with self.manager.pause():
            paused = time.perf_counter()
            while (out := self._get_nowait()) is not None:  # tokens made under the old weights
                seq = self._apply(out)
                if seq is not None:
                    self._finished_during_pause.append(seq)
            timings = load()
            self._synchronize()  # the loop's compute stream must see the whole load
            scheduler = self.manager.batch_processor.scheduler
            for req in list(self.segment):
                scheduler.set_request_cancellation(req)
            scheduler.block_new_requests = False  # no request is left active to clear it
            bad = self._nonfinite_weights()
            if bad:  # nothing is resubmitted: the loop stays idle instead of sampling from NaN
                self.segment.clear()
                self._failed = (f"the weights of version {version} are not finite ({len(bad)} tensors: "
                                f"{', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}); generation stopped")
                raise RuntimeError(self._failed)
            self.version = version
            for req, (rid, _start) in list(self.segment.items()):
                del self.segment[req]
                seq = self.seqs[rid]
                if len(seq.output_ids) >= seq.max_new_tokens:  # nothing left to generate
                    self._finished_during_pause.append(self._finish(seq))
                    continue
                seq.segments += 1
                self._submit_segment(seq)
        timings.update(pause_s=time.perf_counter() - t0, pause_wait_s=paused - t0,
                       interrupted=len(self.seqs))
        return timings

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type != "cpu":
            torch.accelerator.synchronize(self.device)

    @torch.no_grad()
    def _nonfinite_weights(self) -> list[str]:
        """Names of the parameters holding a NaN or an infinity: a NaN or an infinity makes a
        tensor's norm non-finite. One fused multi-tensor norm and one sync (on 2 CPU cores ~25 ms
        for 108M bf16 weights, where ``isfinite`` takes 5 s)."""
        named = [(n, p) for n, p in self._model.named_parameters() if p.numel()]
        norms = torch._foreach_norm([p for _, p in named])
        ok = torch.stack([x.float() for x in norms]).isfinite().tolist()
        return [n for (n, _), good in zip(named, ok, strict=True) if not good]

    def take_finished_during_pause(self) -> list[Sequence]:
        out, self._finished_during_pause = self._finished_during_pause, []
        return out

    def _check_alive(self) -> None:
        if self._failed is not None:
            raise RuntimeError(self._failed)
        err = self.manager.background_thread_status.fatal_error
        if err is not None or not self.manager.is_running():
            raise RuntimeError(f"the generation loop stopped: {err!r}")

    def close(self) -> None:
        try:
            self.manager.stop(block=True, timeout=5, hard_stop=True)
        except RuntimeError as err:
            log.warning("engine stop: %s", err)

"""The embedded engine: transformers continuous batching (paged KV cache), on a GPU and with
engine.hf.cpu_batching=paged (the CPU's default is the slot loop, slots.py; select.py chooses).

Interruptible: on a weight update the generation loop is paused at a step boundary, the
weights are loaded in place, every unfinished request is cancelled (its KV was computed
under the old weights) and resubmitted with its prompt plus the tokens it has so far, so it
continues — re-prefilled — under the new version. Block (prefix) sharing is off so no KV of
old weights is ever reused.

Weights arrive through areal's bucketed broadcast (transport/weights.py ``WeightReceiver``, built
here when the engine has a weight source). Around the load: on an accelerator the loop computes
on a stream of its own while the receiver fills the weights on the caller's, so the device is
synchronized before the loop resumes; the new weights are checked to be finite (a NaN weight
otherwise surfaces as a device-side assert in sampling, which kills the process without naming the
cause). Every unfinished request is cancelled, so the scheduler's "block new requests" flag (set
when it offloads a request under cache pressure, cleared only when some request finishes) is
cleared: with no active request left nothing would ever clear it and the resubmitted requests would
wait forever.

A sequence with a grammar (``Sequence.grammar``) samples from the logits its grammar allows
(grammar.py; a logits processor of the loop here, grammar_cb.py).

The KV cache is sized here (``kv_cache_tokens``): transformers fixes it, and the sampling, when
its batching loop starts, so ``configure`` starts a new loop on the same model when either changes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable

import torch

from areal_cli import moe
from areal_cli.config.resolve import bucket_bytes
from areal_cli.config.schema import EngineConfig, RootConfig
from areal_cli.engines.base import Engine, EngineSetup, Sampling, Sequence, WeightSource
from areal_cli.engines.hf.grammar import Grammars

log = logging.getLogger(__name__)


def engine_dtype(name: str) -> torch.dtype:
    """The torch dtype of a resolved engine.dtype (config/resolve.py made "auto" concrete)."""
    if name == "auto":
        raise ValueError("engine.dtype=auto: resolve the config first (areal_cli.config.resolve)")
    return getattr(torch, name)


def engine_device(name: str) -> torch.device:
    """``EngineSetup.device`` resolved: "" = the current GPU if there is one, else the CPU."""
    if name:
        return torch.device(name)
    return torch.device(f"cuda:{torch.cuda.current_device()}"
                        if torch.cuda.is_available() else "cpu")


def kv_cache_tokens(e: EngineConfig, sequences: int, context: int, limit: int | None) -> int:
    """The KV cache in tokens: engine.kv_cache_tokens, or ``sequences`` × the pages of ``context``
    tokens plus one; at most ``limit`` (on a GPU: ``kv_tokens_that_fit``)."""
    kv = e.kv_cache_tokens or sequences * (-(-context // e.page_size) + 1) * e.page_size
    return kv if limit is None else min(kv, limit)


def kv_tokens_that_fit(model_path, device, dtype, fraction: float) -> int:
    """KV cache tokens that fit in ``fraction`` of the GPU's free memory, less the weights
    (estimated from the config: on a shared GPU the trainer keeps the rest)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_path)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    elem = torch.tensor([], dtype=dtype).element_size()
    per_token = 2 * c.num_hidden_layers * kv_heads * head_dim * elem
    free, _total = torch.cuda.mem_get_info(device)
    weights = (12 * c.num_hidden_layers * c.hidden_size ** 2 * elem
               + c.vocab_size * c.hidden_size * elem)
    return max(4096, int((free * fraction - weights) // per_token))


class HFEngine(Engine):
    def __init__(self, setup: EngineSetup, doing: Callable[[str], None]):
        from transformers import AutoModelForCausalLM

        doing("loading the model")
        e = setup.engine
        self.setup, self.device = setup, engine_device(setup.device)
        # measured before the model loads: a share of the GPU's free memory, less the weights
        self._kv_limit = (kv_tokens_that_fit(setup.model_path, self.device, engine_dtype(e.dtype),
                                             e.gpu_memory_utilization)
                          if self.device.type == "cuda" else None)
        model = AutoModelForCausalLM.from_pretrained(setup.model_path, dtype=engine_dtype(e.dtype),
                                                     attn_implementation="sdpa",
                                                     **moe.load_kwargs(setup.model_path)
                                                     ).to(self.device)
        model.requires_grad_(False)
        # MoE: the routers wrapped; the slot loop records each token's experts (routing replay)
        self.routers = moe.Routers.install(model)
        self._model, self.manager, self._running = model, None, None
        eos = setup.eos_token_id
        self.eos = set([eos] if isinstance(eos, int) else eos)
        self.seqs: dict = {}  # rid → sequence
        # engine request id (Sequence.segment_id) → (rid, output length at start)
        self.segment: dict[str, tuple] = {}
        self.version = 0
        # the matchers of sequences generated under a grammar (Sequence.grammar)
        self.grammars = Grammars(setup.model_path, self.eos)
        self._finished_during_pause: list[Sequence] = []
        self._failed: str | None = None  # why generation was stopped (non-finite weights)
        self._start(setup.sampling,
                    kv_cache_tokens(e, setup.sequences, setup.context, self._kv_limit))
        if setup.weights is not None:
            doing("joining the weight broadcast group")
            self.receiver = weight_receiver(model, setup.weights, setup.index)

    @property
    def model(self):
        """The torch module generating (its parameters are what the receiver fills)."""
        return self._model

    def configure(self, sampling: Sampling, context: int) -> None:
        """A new batching loop when the sampling or the KV cache size changes (transformers fixes
        both when its loop starts); the model stays loaded."""
        if self.seqs:
            raise RuntimeError(f"configure() with {len(self.seqs)} sequences in flight")
        kv = kv_cache_tokens(self.setup.engine, self.setup.sequences, context, self._kv_limit)
        if self._running != (sampling, kv):
            self._stop()
            self._start(sampling, kv)

    def _start(self, sampling: Sampling, kv_tokens: int) -> None:
        """Start the continuous-batching loop: sampling at its temperature, or argmax when
        greedy."""
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        e, eos = self.setup.engine, self.setup.eos_token_id
        if sampling.greedy:
            params = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            params = dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=0)
        gen = GenerationConfig(**params, eos_token_id=eos, pad_token_id=eos, max_new_tokens=1 << 20)
        cb = ContinuousBatchingConfig(
            num_blocks=max(16, math.ceil(kv_tokens / e.page_size)), page_size=e.page_size,
            max_batch_tokens=e.max_batch_tokens, return_logprobs=True, allow_block_sharing=False,
            # a grammar's mask of the next step needs this step's tokens (grammar_cb.py)
            use_async_batching=False)
        self.manager = self._model.init_continuous_batching(generation_config=gen,
                                                            continuous_batching_config=cb)
        from areal_cli.engines.hf.grammar_cb import CBGrammar, install

        install(self.manager, CBGrammar(self.grammars, self.segment, self.seqs,
                                        self._model.config.get_text_config().vocab_size,
                                        self.device))
        self.manager.start()
        self._running = (sampling, kv_tokens)

    def submit(self, seq: Sequence) -> None:
        if seq.grammar:
            self.grammars.start(seq.rid, seq.grammar)
        super().submit(seq)

    def abort(self, rids) -> list[Sequence]:
        out = super().abort(rids)
        for seq in out:
            self.grammars.forget(seq.rid)
        return out

    def _submit_segment(self, seq: Sequence) -> None:
        req = seq.segment_id()
        self.segment[req] = (seq.rid, len(seq.output_ids))
        remaining = seq.max_new_tokens - len(seq.output_ids)
        got = self.manager.add_request(list(seq.prompt_ids) + list(seq.output_ids), request_id=req,
                                       max_new_tokens=remaining, streaming=True,
                                       eos_token_id=-1 if seq.ignore_eos else None)
        if got is None:
            raise RuntimeError("the continuous batching manager refused a request (it is stopping)")

    def _abort_segment(self, seq: Sequence) -> None:
        req = seq.segment_id()
        # outputs still on their way are dropped by _apply
        if self.segment.pop(req, None) is not None:
            self.manager.cancel_request(req)

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
        self.grammars.forget(seq.rid)
        last = seq.output_ids[-1] if seq.output_ids else None
        seq.finish_reason = "stop" if last in self.eos and not seq.ignore_eos else "length"
        return seq

    @contextlib.contextmanager
    def paused(self, version: int):
        self._check_alive()
        t0 = time.perf_counter()
        with self.manager.pause():
            paused = time.perf_counter()
            while (out := self._get_nowait()) is not None:  # tokens made under the old weights
                seq = self._apply(out)
                if seq is not None:
                    self._finished_during_pause.append(seq)
            timings: dict = {}
            yield timings  # the caller loads the weights
            self._synchronize()  # the loop's compute stream must see the whole load
            scheduler = self.manager.batch_processor.scheduler
            for req in list(self.segment):
                scheduler.set_request_cancellation(req)
            scheduler.block_new_requests = False  # no request is left active to clear it
            bad = self._nonfinite_weights()
            if bad:  # nothing is resubmitted: the loop stays idle instead of sampling from NaN
                self.segment.clear()
                self._failed = (f"the weights of version {version} are not finite ({len(bad)} "
                                f"tensors: {', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}); "
                                "generation stopped")
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

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type != "cpu":
            torch.accelerator.synchronize(self.device)

    @torch.no_grad()
    def _nonfinite_weights(self) -> list[str]:
        """Names of the parameters holding a NaN or an infinity: a NaN or an infinity makes a
        tensor's norm non-finite. One fused multi-tensor norm and one sync (on the CPU a small
        fraction of what ``isfinite`` over every tensor costs)."""
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

    def _stop(self) -> None:
        if self.manager is None:
            return
        try:
            self.manager.stop(block=True, timeout=5, hard_stop=True)
        except RuntimeError as err:
            log.warning("engine stop: %s", err)
        self.manager, self._running = None, None

    def close(self) -> None:
        self._stop()
        if self.receiver is not None:
            self.receiver.close()


def weight_receiver(model, source: WeightSource, index: int):
    """This rollout worker's end of areal's bucketed broadcast (transport/weights.py): rank 1 +
    index of the trainer's weight group, loading into ``model`` in place; with LoRA the adapter,
    merged into the weights and verified (``adapter.MergedAdapter``)."""
    from areal_cli import lora
    from areal_cli.transport.weights import WeightReceiver

    cfg, w = source.cfg, source.cfg.weights  # resolved when the run was planned
    if lora.sends_adapter(cfg):
        from areal_cli.engines.adapter import MergedAdapter

        return MergedAdapter(model, source, index)
    return WeightReceiver(model, source.host, source.port, 1 + index, 1 + cfg.rollout.workers,
                          str(w.backend),
                          getattr(torch, w.dtype), bucket_bytes(w),
                          timeout_s=cfg.launcher.peer_timeout_s,
                          store_path=source.store)


def make_sender(cfg: RootConfig, host: str, port: int, model, device: torch.device,
                store: str = ""):
    """Trainer rank 0's end of the bucketed broadcast: rank 0 of a group of 1 + rollout.workers;
    what it carries is ``lora.update_specs`` (every parameter, the adapter, or the merged weights);
    ``store``: the group's FileStore (local runs)."""
    from areal_cli.engines.adapter import broadcast_sender

    # twice the heartbeat limit (inside): a rollout worker that stopped answering is named by the
    # controller (no heartbeat), not reported as this broadcast's timeout
    return broadcast_sender(cfg, host, port, model, device, store)


ENGINE = HFEngine

"""The vLLM engine (GPU): one ``vllm.LLM`` per rollout worker, driven step by step.

Token ids in, token ids out. Requests go to the LLM's ``LLMEngine`` with ``add_request`` and
come back as deltas from ``step()``, so the worker's loop stays single-threaded and a weight
update can land between two engine steps.

Behaviour logprobs are vLLM's *processed* logprobs (``logprobs_mode="processed_logprobs"``):
the log-softmax of the logits after temperature (and top-p), i.e. of the distribution the
token was sampled from — what the trainer recomputes as ``log_softmax(logits / T)``. vLLM's
default, raw logprobs, are of the temperature-1 distribution and disagree whenever T ≠ 1.

Interruptible: on a weight update (``engine.vllm.pause_mode=abort``) every unfinished request is
aborted, the new weights are swapped in (``engine.weight_update=inplace``: received behind
generation into a staging copy through areal's bucketed broadcast, ``engines/vllm/inplace.py``;
``reload``: vLLM's own NCCL transfer and layer-wise reload, ``engines/vllm/weights.py``), and each
sequence is resubmitted as prompt + the tokens it has so far — re-prefilled under the new version,
exactly as the hf engine does. A sequence under a grammar (``Sequence.grammar``: vLLM's structured
outputs, its llguidance backend) starts again from its prompt instead, since vLLM's grammar state
begins at a request's first token. Every request carries its weight version as vLLM's
``cache_salt``, so the prefix cache never serves KV of other weights to it (requests of one version
still share their prompts' blocks) and is never reset (a reset walks every block of the cache while
generation is held).
``engine.vllm.pause_mode=keep`` (the default) skips the abort: sequences keep their old-weight KV
and go on under the new weights, each token recording the version that sampled it. The receiving end
is built here when the engine has a weight source, from ``updates.py``, which holds the trainer's
end too (``make_sender``). vLLM sizes its own KV cache (engine.gpu_memory_utilization of the GPU).

Verified: after an in-place update that changed the weights (the receiver compares fingerprints of
the received and the live weights on every GPU rank), vLLM's prompt logprobs of a fixed probe
sequence must differ from the previous version's, else ``WeightSyncError`` stops the run: an engine
that kept sampling from the previous policy while the trainer believes it is on-policy is the
failure this catches. The probe is a request like the others, answered while the worker goes on (a
full engine queues it behind its requests; it is never waited for), and its verdict comes with the
next update's timings.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from areal_cli import lora, moe
from areal_cli.engines.base import Engine, EngineSetup, Sampling, Sequence
from areal_cli.engines.vllm.args import llm_kwargs, structured_outputs
from areal_cli.engines.vllm.routing import Routing
from areal_cli.engines.vllm.spec import SPEC
from areal_cli.engines.vllm.updates import VLLMAdapter, make_sender, weight_receiver
from areal_cli.runtime import short_gil_switch

__all__ = ["ENGINE", "make_sender"]

log = logging.getLogger(__name__)


def import_vllm():
    """vLLM or a ValueError that names the extra to install."""
    SPEC.require()
    import vllm

    return vllm


PROBE_WAIT_S = 10.0
"""How long the probe under the weights before the first in-place update is waited for (it queues
behind the requests vLLM could not yet schedule); past it the first version goes uncompared. Later
probes are never waited for."""

def prompt_logprobs(ids: list[int], out):
    """log π(ids[t] | ids[:t]) for t ≥ 1 from the finished output ``out`` of a request for the
    prompt ``ids`` with prompt logprobs (the first prompt token has none)."""
    import torch

    return torch.tensor([lp[t].logprob for t,
                         lp in zip(ids[1:], out.prompt_logprobs[1:], strict=True)])


class VLLMEngine(Engine):
    top_logprobs = 20  # vLLM's max_logprobs: alternatives per token a request may ask for
    routing: Routing | None = None  # MoE with routing replay: the layout of vLLM's routed experts

    def __init__(self, setup: EngineSetup, doing: Callable[[str], None]):
        vllm = import_vllm()

        doing("loading the model")
        # vLLM's output thread decodes the engine's outputs beside this loop; at the default 5 ms
        # switch interval each call of the loop into vLLM (abort, add_request) can wait for the GIL
        # that long
        short_gil_switch()
        self.engine_cfg = setup.engine
        adapter = setup.weights is not None and lora.sends_adapter(setup.weights.cfg)
        rank = setup.weights.cfg.trainer.lora.rank if adapter else 0
        run = setup.weights.cfg if setup.weights is not None else None
        self.sleep_mode = run is not None and run.cluster.share == "alternate"
        routing = setup.routing and moe.is_moe(setup.model_path)
        self.llm = vllm.LLM(model=str(setup.model_path),
                            **llm_kwargs(setup.engine, setup.seed, setup.index, rank,
                                         sleep_mode=self.sleep_mode, routing=routing))
        self.routing = (Routing.of_model(self.llm.llm_engine.model_config.hf_config)
                        if routing else None)
        # the policy's adapter once one was loaded (VLLMAdapter); None = the base model
        self.lora_request = None
        # in-place updates' verification, from the first update on: the probe's ids, the probe
        # request in flight (its id, version and whether that update changed the weights) and the
        # verdicts not yet reported
        self._weights_check, self._probe, self._probing, self._verdict = None, [], None, {}
        # engine steps taken (an update's steps_behind: those while it was received)
        self._steps = 0
        self._probes = 0  # probe requests waited for (their ids)
        # the update begun and not yet finished: its version, whether it is verified, when it began,
        # the steps then
        self._next_version, self._verified, self._behind_since, self._steps_at = -1, False, 0.0, 0
        self.core = self.llm.llm_engine
        self.configure(setup.sampling, setup.context)
        tok = self.llm.get_tokenizer()
        eos = self.llm.llm_engine.model_config.hf_config.eos_token_id
        self.eos = {tok.eos_token_id} | set([eos] if isinstance(eos, int) else (eos or []))
        self.seqs: dict = {}  # rid → sequence
        self.segment: dict = {}  # engine request id (Sequence.segment_id) → rid
        self.version = 0
        self._done: list[Sequence] = []  # finished outside poll (at a resubmit)
        self._slept = False  # asleep since the last update: its sequences wait to be resubmitted
        # time with requests in flight, since the last update
        self._busy_s, self._busy_since = 0.0, None
        if adapter:
            doing("joining the weight broadcast group (LoRA adapters)")
            self.receiver = VLLMAdapter(self, setup.model_path, setup.weights, setup.index)
        elif setup.weights is not None:
            doing("joining the weight broadcast group")
            self.receiver = weight_receiver(self.llm, setup.model_path, setup.weights, setup.index)

    def configure(self, sampling: Sampling, context: int) -> None:
        """The SamplingParams of the next requests (``max_tokens`` and ``ignore_eos`` per request):
        one sample, its processed logprob, token ids only (random-weight benchmarks sample ids that
        a smaller tokenizer cannot decode; nothing here decodes), output as deltas. Greedy is
        temperature 0 (vLLM then decodes argmax, ignoring top_p). ``context``: vLLM sizes its own
        KV."""
        vllm = import_vllm()
        from vllm.sampling_params import RequestOutputKind

        temperature, top_p = (0.0, 1.0) if sampling.greedy else (sampling.temperature,
                                                                 sampling.top_p)
        self._params = lambda n, ignore_eos=False, top=0, grammar="": vllm.SamplingParams(
            n=1, temperature=temperature, top_p=top_p, top_k=0, max_tokens=n, logprobs=top,
            detokenize=False, output_kind=RequestOutputKind.DELTA, ignore_eos=ignore_eos,
            structured_outputs=structured_outputs(grammar))

    def _submit_segment(self, seq: Sequence) -> None:
        remaining = seq.max_new_tokens - len(seq.output_ids)
        stopped = bool(seq.output_ids) and seq.output_ids[-1] in self.eos and not seq.ignore_eos
        if stopped or remaining <= 0:
            self._finish(seq, "stop" if stopped else "length")
            self._done.append(seq)
            return
        if seq.grammar and seq.output_ids:  # vLLM's grammar starts at the request's first token
            del seq.output_ids[:], seq.logprobs[:], seq.versions[:]
            remaining = seq.max_new_tokens
        req = seq.segment_id()
        self.segment[req] = seq.rid
        ids = list(seq.prompt_ids) + list(seq.output_ids)
        self.core.add_request(req, self._prompt(ids),
                              self._params(remaining, seq.ignore_eos, seq.top_logprobs,
                                           seq.grammar),
                              lora_request=self.lora_request)
        if self._busy_since is None:
            self._busy_since = time.perf_counter()

    def _abort_segment(self, seq: Sequence) -> None:
        req = seq.segment_id()
        # outputs still on their way are dropped by _apply
        if self.segment.pop(req, None) is not None:
            self.core.abort_request([req])

    def _prompt(self, ids: list[int]) -> dict:
        """A request's prompt, salted with the weight version: its blocks are cached and found only
        among requests of the same weights."""
        return {"prompt_token_ids": ids, "cache_salt": f"areal-w{self.version}"}

    def poll(self, timeout_s: float) -> list[Sequence]:
        done, self._done = self._done, []
        deadline = time.perf_counter() + timeout_s
        while not done and (self.segment or self._probing) and time.perf_counter() < deadline:
            done += self._advance()
        if not self.segment and not self._probing:
            self._mark_idle()
            if not done:
                time.sleep(max(0.0, deadline - time.perf_counter()))
        return done

    def probe_logprobs(self, ids: list[int], wait_s: float = 120.0, required: bool = True):
        """log π(ids[t] | ids[:t]) for t ≥ 1 under the current weights and adapter: a one-token
        request with prompt logprobs, stepped here; outputs of other requests stepped meanwhile are
        kept. Not answered within ``wait_s`` (queued behind requests a full KV cache holds):
        RuntimeError, or None where not ``required``."""
        self._probes += 1
        rid = f"areal-probe-{self._probes}"
        self.core.add_request(rid, self._prompt(list(ids)), self._probe_params(),
                              lora_request=self.lora_request)
        deadline = time.perf_counter() + wait_s
        while time.perf_counter() < deadline:
            for out in self._step():
                if out.request_id == rid and out.finished:
                    return prompt_logprobs(ids, out)
                seq = self._apply(out) if out.request_id != rid else None
                if seq is not None:
                    self._done.append(seq)
        self.core.abort_request([rid])
        if required:
            raise RuntimeError(f"vLLM did not answer the weight-update probe within {wait_s:.0f} s")
        return None

    def _step(self) -> list:
        """One step of vLLM's engine: its outputs."""
        self._steps += 1
        return self.core.step()

    def _advance(self) -> list[Sequence]:
        """One step of vLLM's engine, folded into the sequences: those that finished."""
        return [seq for seq in map(self._apply, self._step()) if seq is not None]

    def _probe_params(self):
        """A probe request: one token, the prompt's logprobs (of the distribution at temperature
        1)."""
        vllm = import_vllm()
        from vllm.sampling_params import RequestOutputKind

        return vllm.SamplingParams(n=1, temperature=1.0, max_tokens=1, prompt_logprobs=0,
                                   detokenize=False,
                                   output_kind=RequestOutputKind.FINAL_ONLY)

    def _apply(self, out) -> Sequence | None:
        """Fold one delta output into its sequence; the sequence when it just finished."""
        rid = self.segment.get(out.request_id)
        if rid is None:
            if self._probing is not None and out.request_id == self._probing[0] and out.finished:
                self._probed(out)
            return None  # an aborted segment, or the probe
        seq, c = self.seqs[rid], out.outputs[0]
        new, lps = list(c.token_ids), c.logprobs or []
        if len(lps) > len(new):
            # vLLM 0.26 can hand a delta output the request's cumulative logprobs (seen with
            # 8k-token requests: 0 new tokens, 6202 logprobs); the new tokens' logprobs are the last
            # ones
            lps = lps[len(lps) - len(new):]
        if len(lps) != len(new):
            raise RuntimeError(f"vLLM returned {len(new)} tokens but {len(lps)} logprobs for {rid}")
        seq.output_ids += new
        seq.logprobs += [float(lp[t].logprob) for t, lp in zip(new, lps, strict=True)]
        if seq.top_logprobs:  # vLLM gives the k best and the sampled token: the k best, best first
            seq.top += [sorted(((a, float(x.logprob)) for a, x in lp.items()),
                               key=lambda p: -p[1])[:seq.top_logprobs] for lp in lps]
        seq.versions += [self.version] * len(new)
        if not out.finished:
            return None
        del self.segment[out.request_id]
        if self.routing is not None:  # this request ran the whole context: every position's rows
            seq.routing = self.routing.of(getattr(c, "routed_experts", None),
                                          len(seq.prompt_ids) + len(seq.output_ids) - 1)
        self._finish(seq, "stop" if c.finish_reason == "stop" else "length")
        return seq

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.seqs.pop(seq.rid, None)

    def _mark_idle(self) -> None:
        if self._busy_since is not None:
            self._busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None

    @contextlib.contextmanager
    def paused(self, version: int):
        t0 = time.perf_counter()
        abort = self.engine_cfg.vllm.pause_mode == "abort"
        if abort:
            self._abort_running()
        self._mark_idle()
        paused = time.perf_counter()
        timings: dict = {}
        yield timings  # the caller loads the weights
        loaded = time.perf_counter()
        self.version = version  # the salt of every request from now on (``_prompt``)
        if abort or self._slept:  # each sequence without a request of its own continues
            live = set(self.segment.values())
            for seq in [s for s in self.seqs.values() if s.rid not in live]:
                seq.segments += 1
                self._submit_segment(seq)
        self._slept = False
        timings.update(pause_s=time.perf_counter() - t0, pause_wait_s=paused - t0,
                       resume_s=time.perf_counter() - loaded, interrupted=len(self.seqs),
                       gen_busy_s=self._busy_s)
        self._busy_s = 0.0

    def _abort_running(self) -> None:
        """Abort every running request; their sequences stay in ``seqs``, to be resubmitted."""
        if self.segment:
            self.core.abort_request(list(self.segment))
            self.segment.clear()

    def sleep(self) -> dict:
        """vLLM's sleep, level 1: its KV cache freed, its weights copied to host memory. The
        running requests are aborted first; their sequences continue after the next update
        (``paused``)."""
        import torch

        t0 = time.perf_counter()
        if not self.sleep_mode:
            return {}  # built without it: the worker only stops stepping it
        self._abort_running()
        self._mark_idle()
        free = torch.cuda.mem_get_info()[0]
        self.core.sleep(level=1)
        self._slept = True
        return {"sleep_s": time.perf_counter() - t0,
                "freed_bytes": torch.cuda.mem_get_info()[0] - free}

    def wake(self) -> dict:
        t0 = time.perf_counter()
        if self.sleep_mode and self.core.is_sleeping():
            self.core.wake_up()
        return {"wake_s": time.perf_counter() - t0}

    def update_weights(self, version: int) -> dict:
        """As ``Engine.update_weights``; a staged receiver takes the update in while this engine
        keeps stepping its requests (sequences that finish meanwhile are kept for ``poll``), and the
        pause is only the swap. ``pause_total_s``: the time generation was held. An in-place update
        is then verified (``_verify``): its timings carry the verdict on the previous version's. The
        rollout worker calls the three parts itself (``begin_update``, ``update_ready``,
        ``finish_update``) and goes on starting groups and sending results between them."""
        self.begin_update(version)
        while not self.update_ready():
            if self.segment or self._probing:
                self._done += self._advance()  # for the next poll
            else:
                time.sleep(0.001)
        return self.finish_update()

    def begin_update(self, version: int) -> None:
        """The probe before the first in-place update (waited for, once), then a staged receiver
        starts taking ``version`` in behind generation (an unstaged one receives in
        ``finish_update``)."""
        self._next_version, self._verified = version, self._probe_before(version)
        self._behind_since, self._steps_at = time.perf_counter(), self._steps
        if self.receiver is not None and getattr(self.receiver, "background", False):
            self.receiver.begin()

    def update_ready(self) -> bool:
        if self.receiver is None or not getattr(self.receiver, "background", False):
            return True
        # a read of the receiving threads' signal files, no call into vLLM
        return self.receiver.done()

    def finish_update(self) -> dict:
        timings = self._receive(self._next_version)
        if self._verified:
            timings.update(self._verify(self._next_version, timings))
        return timings

    @contextlib.contextmanager
    def _swap(self, version: int):
        """``paused`` for the swap to ``version``; a probe still unanswered then (vLLM had no room
        for it since the last update) is withdrawn, and that version goes unchecked: answered after
        the swap, it would be of the new weights."""
        if self._probing is not None:
            rid, probed, _, _ = self._probing
            self.core.abort_request([rid])
            self._probing = None
            self._verdict = {"probe_version": probed, "probe_skipped": 1}
            log.warning("weights v%d: vLLM did not reach the probe before the next update (its "
                        "queue is full); that version is not verified", probed)
        with self.paused(version) as timings:
            yield timings

    def _probe_before(self, version: int) -> bool:
        """Whether this update is verified (its receiver says whether it changed the weights: in
        place); the probe's logprobs under the weights before the first update are taken here."""
        if not getattr(self.receiver, "reports_change", False):
            return False
        from areal_cli.engines.adapter import ProbeCheck, probe_ids

        if self._weights_check is None:
            self._weights_check = ProbeCheck("weights")
            self._probe = probe_ids(self.core.model_config.get_vocab_size())
            before = self.probe_logprobs(self._probe, PROBE_WAIT_S, required=False)
            if before is not None:
                self._weights_check.check(version - 1, before, changed=False)
        return True

    def _verify(self, version: int, timings: dict) -> dict:
        """Submit the probe of ``version``, a request like the others, once the pause is over;
        returns
        ``weights_unchanged`` of this update and the verdict on the previous one (``probe_version``,
        ``probe_logp_change`` or ``probe_skipped``, ``probe_s``: submission to answer). The answer
        is checked where it arrives (``_probed``)."""
        changed = bool(timings["weights_changed"])
        out, self._verdict = {"weights_unchanged": int(not changed), **self._verdict}, {}
        rid = f"areal-probe-v{version}"
        self.core.add_request(rid, self._prompt(list(self._probe)), self._probe_params(),
                              lora_request=self.lora_request)
        self._probing = (rid, version, changed, time.perf_counter())
        return out

    def _probed(self, out) -> None:
        """The probe's answer: an update that changed the weights must have changed the engine's
        logprobs of it; WeightSyncError, which stops the run, where they did not (the engine would
        go on sampling from the previous policy). The next version is compared with the last one
        answered."""
        _, version, changed, since = self._probing
        self._probing = None
        verdict = self._weights_check.check(version, prompt_logprobs(self._probe, out), changed)
        self._verdict = {"probe_version": version,
                         "probe_logp_change": verdict["probe_logp_change"],
                         "probe_s": time.perf_counter() - since}

    def _receive(self, version: int) -> dict:
        if self.receiver is None:
            return super().update_weights(version)  # which says what is missing
        if not getattr(self.receiver, "background", False):
            with self._swap(version) as timings:
                timings.update(self.receiver.receive(version))
            return timings
        behind = time.perf_counter() - self._behind_since
        with self._swap(version) as timings:
            timings.update(self.receiver.apply())
        timings.update(weight_behind_s=behind, steps_behind=self._steps - self._steps_at,
                       pause_total_s=timings["pause_s"])
        return timings

    def close(self) -> None:
        if self.segment:
            self.core.abort_request(list(self.segment))
        shutdown = getattr(self.core, "engine_core", None)
        if shutdown is not None and hasattr(shutdown, "shutdown"):
            shutdown.shutdown()
        if self.receiver is not None:
            self.receiver.close()


ENGINE = VLLMEngine

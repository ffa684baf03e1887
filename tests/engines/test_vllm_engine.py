"""The vLLM engine's bookkeeping (deltas, interruption, versions) against a fake LLMEngine on
the CPU; a real vLLM run where vLLM and a GPU are present."""

from __future__ import annotations

import types

import pytest

from areal_cli.config.schema import EngineConfig, RootConfig
from areal_cli.engines.base import Sequence
from areal_cli.engines.vllm.args import llm_kwargs
from areal_cli.engines.vllm.engine import VLLMEngine
from areal_cli.runconfig.autos import resolve_engine


class FakeCore:
    """Emits one token per step per request: token = 100 + position, logprob = -0.1 · version. A
    request with ``prompt_logprobs`` (a probe) gets them from ``prompt_lp(ids)``; ``full=True``: no
    new probe is scheduled (vLLM's queue behind requests that fill the engine)."""

    def __init__(self):
        self.requests, self.aborted, self.version, self.params, self.salts = {}, [], 0, {}, {}
        self.prompt_lp, self.full = None, False

    def add_request(self, req, prompt, params, lora_request=None):
        self.requests[req] = [list(prompt["prompt_token_ids"]), params.max_tokens, 0]
        self.params[req], self.salts[req] = params, prompt.get("cache_salt")

    def step(self):
        outs = []
        for req, r in list(self.requests.items()):
            ids, budget, made = r
            probe = getattr(self.params[req], "prompt_logprobs", None) is not None
            if probe and self.full:
                continue
            tok = 100 + len(ids)
            r[0], r[2] = ids + [tok], made + 1
            done = r[2] >= budget
            lp = {tok: types.SimpleNamespace(logprob=-0.1 * self.version)}
            comp = types.SimpleNamespace(token_ids=[tok], logprobs=[lp],
                                         finish_reason="length" if done else None)
            out = types.SimpleNamespace(request_id=req, outputs=[comp], finished=done)
            if probe:
                out.prompt_logprobs = [None] + [{t: types.SimpleNamespace(logprob=float(v))}
                                                for t,
                                                v in zip(ids[1:], self.prompt_lp(ids), strict=True)]
            outs.append(out)
            if done:
                del self.requests[req]
        return outs

    def abort_request(self, ids):
        self.aborted += ids
        for i in ids:
            self.requests.pop(i, None)


def never_reset():
    raise AssertionError("the prefix cache is salted by weight version; a reset would hold "
                         "generation")


def fake_engine(pause_mode: str = "abort") -> VLLMEngine:
    eng = VLLMEngine.__new__(VLLMEngine)
    eng.engine_cfg, eng.core = EngineConfig(name="vllm"), FakeCore()
    eng.engine_cfg.vllm.pause_mode, eng._slept = pause_mode, False
    eng.llm = types.SimpleNamespace(reset_prefix_cache=never_reset)
    eng._params = lambda n, ignore_eos=False, top=0, grammar="": types.SimpleNamespace(
        max_tokens=n, ignore_eos=ignore_eos, logprobs=top, grammar=grammar)
    eng.eos, eng.seqs, eng.segment, eng.version, eng._done = {0}, {}, {}, 0, []
    eng._busy_s, eng._busy_since, eng.lora_request = 0.0, None, None
    eng._weights_check, eng._probe, eng._probing = None, [], None
    eng._verdict, eng._steps, eng._probes = {}, 0, 0
    eng._probe_params = lambda: types.SimpleNamespace(max_tokens=1, ignore_eos=False,
                                                      prompt_logprobs=0)
    return eng


def test_interrupted_sequence_continues_from_its_tokens_under_the_new_version():
    eng = fake_engine()
    eng.submit(Sequence("a", [1, 2], max_new_tokens=5))
    for _ in range(2):  # two engine steps, then the weights change
        for out in eng.core.step():
            assert eng._apply(out) is None
    made = len(eng.seqs["a"].output_ids)
    assert made == 2
    with eng.paused(1) as timings:
        eng.core.version = 1
    assert eng.core.aborted == ["a#1"] and timings["interrupted"] == 1
    # resubmitted as prompt + tokens so far, with the remaining budget
    ids, budget, _ = eng.core.requests["a#2"]
    assert ids == [1, 2] + eng.seqs["a"].output_ids and budget == 5 - made
    # the prefix cache is keyed by weight version: the new segment cannot reuse the old weights' KV
    assert eng.core.salts == {"a#1": "areal-w0", "a#2": "areal-w1"}
    done = []
    while not done:
        done = eng.poll(0.01)
    seq = done[0]
    assert seq.output_ids == [102, 103, 104, 105, 106]  # one continuous sequence
    assert seq.versions == [0] * made + [1] * (5 - made)
    assert seq.logprobs == [0.0] * made + [-0.1] * (5 - made)
    assert seq.segments == 2 and seq.finish_reason == "length" and eng.in_flight() == 0


def test_with_pause_mode_keep_a_sequence_goes_on_in_its_request_under_the_new_version():
    """The default: nothing is aborted or resubmitted; the tokens after the swap are the new
    version's (their logprobs too), in the same request."""
    eng = fake_engine("keep")
    assert EngineConfig(name="vllm").vllm.pause_mode == "keep"
    eng.submit(Sequence("a", [1, 2], max_new_tokens=5))
    for _ in range(2):
        for out in eng.core.step():
            assert eng._apply(out) is None
    with eng.paused(1) as timings:
        eng.core.version = 1
    assert eng.core.aborted == [] and list(eng.core.requests) == ["a#1"]
    assert timings["interrupted"] == 1
    done = []
    while not done:
        done = eng.poll(0.01)
    seq = done[0]
    assert seq.versions == [0, 0, 1, 1, 1] and len(seq.output_ids) == 5
    assert seq.logprobs[:2] == [0.0, 0.0] and seq.logprobs[2:] == pytest.approx([-0.1] * 3)


def test_an_interrupted_sequence_under_a_grammar_starts_again_from_its_prompt():
    """vLLM's grammar state begins at a request's first token: a constrained sequence is not
    continued from its tokens (they would be prompt to a grammar at its start) but restarted."""
    eng = fake_engine()
    eng.submit(Sequence("a", [1, 2], max_new_tokens=5, grammar="start: \"x\""))
    for out in eng.core.step():
        eng._apply(out)
    assert len(eng.seqs["a"].output_ids) == 1
    with eng.paused(1):
        eng.core.version = 1
    ids, budget, _ = eng.core.requests["a#2"]
    assert ids == [1, 2] and budget == 5 and eng.core.params["a#2"].grammar == "start: \"x\""
    done = []
    while not done:
        done = eng.poll(0.01)
    assert done[0].versions == [1] * 5 and len(done[0].output_ids) == 5


def test_an_aborted_sequence_leaves_vllm_and_its_late_outputs_are_dropped():
    eng = fake_engine()
    eng.submit(Sequence("a", [1, 2], max_new_tokens=5))
    eng.submit(Sequence("b", [1, 2], max_new_tokens=3))
    late = eng.core.step()  # outputs of both, not yet folded in when "a" is aborted
    gone = eng.abort(["a", "missing"])
    assert [s.rid for s in gone] == ["a"]
    assert eng.core.aborted == ["a#1"] and "a#1" not in eng.core.requests
    assert [eng._apply(out) for out in late] == [None, None] and gone[0].output_ids == []
    done = []
    while eng.in_flight():
        done += eng.poll(0.01)
    assert [s.rid for s in done] == ["b"] and len(done[0].output_ids) == 3


def test_sequence_that_hit_eos_before_the_pause_is_not_resubmitted():
    eng = fake_engine()
    seq = Sequence("b", [1], max_new_tokens=8, output_ids=[5, 0], logprobs=[-1.0, -1.0],
                   versions=[0, 0])
    eng.seqs["b"], eng.segment["b#1"] = seq, "b"
    with eng.paused(1):
        pass
    assert "b#2" not in eng.core.requests
    assert eng.poll(0.0) == [seq] and seq.finish_reason == "stop"


def test_ignore_eos_sequence_continues_past_eos_after_an_update():
    """Length profiles (random weights): an EOS token does not end a sequence that ignores EOS;
    its next segment asks vLLM to ignore EOS too."""
    eng = fake_engine()
    seq = Sequence("c", [1], max_new_tokens=8, output_ids=[5, 0], logprobs=[-1.0, -1.0],
                   versions=[0, 0],
                   ignore_eos=True)
    eng.seqs["c"], eng.segment["c#1"] = seq, "c"
    with eng.paused(1):
        pass
    ids, budget, _ = eng.core.requests["c#2"]
    assert ids == [1, 5, 0] and budget == 6 and eng.core.params["c#2"].ignore_eos
    assert eng.poll(0.0) == []


def test_a_delta_carrying_cumulative_logprobs_keeps_only_the_new_tokens_logprobs():
    """vLLM 0.26 sometimes puts the request's cumulative logprobs on a delta output (0 new tokens,
    thousands of logprobs): the sequence takes the new tokens' logprobs, the last ones."""
    eng = fake_engine()
    seq = Sequence("d", [1], max_new_tokens=8, output_ids=[5, 6], logprobs=[-1.0, -2.0],
                   versions=[0, 0])
    eng.seqs["d"], eng.segment["d#1"] = seq, "d"
    lp = [{t: types.SimpleNamespace(logprob=-float(t))} for t in (5, 6, 7)]
    comp = types.SimpleNamespace(token_ids=[7], logprobs=lp, finish_reason=None)
    assert eng._apply(types.SimpleNamespace(request_id="d#1", outputs=[comp],
                                            finished=False)) is None
    assert seq.output_ids == [5, 6, 7] and seq.logprobs == [-1.0, -2.0, -7.0]
    comp = types.SimpleNamespace(token_ids=[], logprobs=lp, finish_reason="length")
    assert eng._apply(types.SimpleNamespace(request_id="d#1", outputs=[comp], finished=True)) is seq
    assert seq.output_ids == [5, 6, 7] and seq.logprobs == [-1.0, -2.0,
                                                            -7.0] and seq.finish_reason == "length"


def test_alternatives_asked_for_are_the_k_best_of_what_vllm_returns():
    """A sequence asking top_logprobs=2: its request asks vLLM for 2, and of what vLLM returns per
    token (the 2 best and the sampled token) it keeps the 2 best, best first."""
    eng = fake_engine()
    eng.submit(Sequence("t", [1], max_new_tokens=2, top_logprobs=2))
    assert eng.core.params["t#1"].logprobs == 2
    lp = {7: types.SimpleNamespace(logprob=-3.0), 4: types.SimpleNamespace(logprob=-0.5),
          9: types.SimpleNamespace(logprob=-1.5)}
    comp = types.SimpleNamespace(token_ids=[7], logprobs=[lp], finish_reason=None)
    eng._apply(types.SimpleNamespace(request_id="t#1", outputs=[comp], finished=False))
    seq = eng.seqs["t"]
    assert seq.logprobs == [-3.0] and seq.top == [[(4, -0.5), (9, -1.5)]]


def test_llm_kwargs_ask_for_processed_logprobs_and_nccl_transfer():
    cfg = RootConfig()
    cfg.engine.name = "vllm"
    with pytest.raises(ValueError,
                       match="engine.dtype, engine.weight_update, engine.lora_merge, "
                             "engine.lm_head_fp32=auto: resolve"):
        llm_kwargs(cfg.engine, cfg.seed, 1)
    cfg.engine = resolve_engine(cfg.engine, updates=False)  # an engine no weights reach: reload
    kw = llm_kwargs(cfg.engine, cfg.seed, 1)
    assert kw["logprobs_mode"] == "processed_logprobs"  # logprobs at the sampling temperature
    assert kw["weight_transfer_config"] == {"backend": "nccl"} and kw["dtype"] == "bfloat16"
    assert kw["hf_overrides"] == {"head_dtype": "float32"}  # lm_head_fp32=auto is on with vllm
    assert "disable_log_stats" not in kw  # vllm.LLM's default: no stats
    # Sequence.grammar is llguidance's Lark: vLLM's guidance backend compiles it
    assert kw["structured_outputs_config"] == {"backend": "guidance"}
    cfg.engine.vllm.log_stats = True
    assert llm_kwargs(cfg.engine, cfg.seed, 1)["disable_log_stats"] is False
    assert "enable_sleep_mode" not in llm_kwargs(cfg.engine, cfg.seed, 1)
    assert llm_kwargs(cfg.engine, cfg.seed, 1, sleep_mode=True)["enable_sleep_mode"] is True


def test_inplace_updates_use_areals_worker_extension_and_head_can_stay_bf16():
    cfg = RootConfig()
    cfg.engine.weight_update, cfg.engine.lm_head_fp32 = "inplace", "false"
    cfg.engine = resolve_engine(cfg.engine)
    kw = llm_kwargs(cfg.engine, cfg.seed, 0)
    assert "weight_transfer_config" not in kw and "hf_overrides" not in kw
    # vLLM imports it by name in its workers
    module, name = kw["worker_extension_cls"].rsplit(".", 1)
    import importlib

    assert hasattr(importlib.import_module(module), name)


def hide_vllm(monkeypatch) -> None:
    """``import vllm`` fails for the rest of the test, as where it is not installed."""
    import builtins

    real = builtins.__import__

    def no_vllm(name, *a, **k):
        if name == "vllm":
            raise ImportError("No module named 'vllm'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_vllm)


def test_missing_vllm_names_the_extra(monkeypatch):
    hide_vllm(monkeypatch)
    from areal_cli.engines.vllm.engine import import_vllm

    with pytest.raises(ValueError, match=r"areal-cli\[vllm\]"):
        import_vllm()


def _gpu_vllm() -> str:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM is not installed (pip install 'areal-cli[vllm]')"
    import torch

    return "" if torch.cuda.is_available() else "vLLM needs a GPU"


@pytest.mark.skipif(bool(_gpu_vllm()), reason=_gpu_vllm() or "runs")
def test_real_vllm_generates_with_logprobs(tiny_model):
    cfg = RootConfig()
    cfg.engine.name = "vllm"
    cfg.engine.vllm.enforce_eager, cfg.engine.gpu_memory_utilization = True, 0.2
    cfg.engine.vllm.max_model_len = 512
    cfg.engine = resolve_engine(cfg.engine, updates=False)
    from areal_cli.engines.base import EngineSetup, Sampling
    from areal_cli.engines.factory import make_engine

    eng = make_engine(EngineSetup(cfg.engine, tiny_model, 2, Sampling(1.0), sequences=8))
    try:
        eng.submit(Sequence("x", [1, 2, 3], max_new_tokens=8, top_logprobs=3))
        done = []
        while not done:
            done = eng.poll(1.0)
        assert len(done[0].output_ids) == len(done[0].logprobs) == len(done[0].versions) > 0
        assert all(lp <= 0 for lp in done[0].logprobs)
        # 3 alternatives per token, best first: the sampled token's logprob is at most the best
        assert len(done[0].top) == len(done[0].output_ids)
        for alts, lp in zip(done[0].top, done[0].logprobs, strict=True):
            assert len(alts) == 3 and alts[0][1] >= alts[1][1] >= alts[2][1] >= -1e30
            assert lp <= alts[0][1] + 1e-6
    finally:
        eng.close()


class LocalIntake:
    """``InplaceReceiver``'s calls without the RPC: a real ``StagedUpdate`` over gloo in this
    process."""

    def __init__(self, staged, verified: bool = False):
        self.staged, self.reports_change = staged, verified
        self.background = staged.staged

    def begin(self):
        self.staged.begin()

    def done(self):
        return self.staged.done()

    def apply(self):
        return self.staged.apply()

    def receive(self, version: int = -1):
        self.begin()
        return self.apply()


def test_staged_update_keeps_generating_during_the_receive_and_holds_only_the_swap():
    import threading

    import torch

    from tests.engines.test_vllm_inplace import _ends

    trainer, tx, live, staged = _ends(staged=True)
    eng = fake_engine()
    eng.receiver = LocalIntake(staged)
    # a budget no receive outlasts: the fake core steps without pause (10,000 tokens once ran out
    # before the broadcast ended on an idle machine)
    eng.submit(Sequence("a", [1, 2], max_new_tokens=10**9))
    tx.prepare(iter(trainer.named_parameters()))
    sent = threading.Thread(target=lambda: (time_to_generate(eng), tx.broadcast()))
    sent.start()
    timings = eng.update_weights(1)
    sent.join()
    seq = eng.seqs["a"]
    # tokens came while the update was on its way, under the old version; the rest follows under the
    # new
    assert timings["steps_behind"] > 0 and seq.versions.count(0) >= timings["steps_behind"]
    assert timings["pause_total_s"] == timings["pause_s"] < timings["weight_behind_s"]
    assert eng.version == 1 and eng.core.aborted == ["a#1"] and "a#2" in eng.core.requests
    for name, p in trainer.named_parameters():
        assert torch.equal(live[name], p.detach().to(torch.bfloat16))
    staged.close()


def time_to_generate(eng) -> None:
    """Hold the broadcast back until the engine has stepped its request a few times meanwhile."""
    import time

    deadline = time.monotonic() + 30
    while len(eng.seqs["a"].output_ids) < 5 and time.monotonic() < deadline:
        time.sleep(0.001)


def verified_engine(staged: bool, engine_reads_weights: bool | None):
    """A fake engine over a real ``StagedUpdate`` whose probe logprobs are a function of the live
    weights (as a real engine's forward is), or stay as they were (an engine that never reads the
    new weights); None: the weights are read, but vLLM's queue never reaches a probe (the first,
    waited for, included)."""
    import torch

    from tests.engines.test_vllm_inplace import _ends

    trainer, tx, live, rx = _ends(staged=staged)
    eng = fake_engine()
    eng.receiver = LocalIntake(rx, verified=True)
    eng.core.model_config = types.SimpleNamespace(get_vocab_size=lambda: 1000)
    frozen = None

    def logprobs(ids):
        nonlocal frozen
        total = sum(float(p.detach().float().sum()) for p in live.values())
        now = torch.linspace(-1.0, -0.1, len(ids) - 1) * (1.0 + total)
        if not engine_reads_weights and engine_reads_weights is not None:
            frozen = now if frozen is None else frozen
            return frozen
        return now

    eng.core.prompt_lp = logprobs
    eng.core.full = engine_reads_weights is None

    def update(version: int) -> dict:
        import threading

        tx.prepare(iter(trainer.named_parameters()))
        sent = threading.Thread(target=tx.broadcast)
        sent.start()
        try:
            return eng.update_weights(version)
        finally:
            sent.join()

    return eng, trainer, update, rx


def answered(eng) -> None:
    """Step the engine until its probe is answered (what the worker's polling does between
    updates)."""
    for _ in range(5):
        eng.poll(0.001)
    assert eng._probing is None


@pytest.mark.parametrize("staged", [True, False])
def test_an_in_place_update_is_verified_by_the_probe_and_an_unchanged_one_is_named(staged):
    import torch

    eng, trainer, update, rx = verified_engine(staged, engine_reads_weights=True)
    first = update(1)
    assert (first["weights_changed"] == 1 and first["weights_unchanged"] == 0
            and "probe_version" not in first)
    assert eng._probing is not None  # submitted, not waited for: the worker goes on meanwhile
    answered(eng)
    again = update(2)  # the trainer's weights did not move (a skipped step): reported, not an error
    assert again["weights_changed"] == 0 and again["weights_unchanged"] == 1
    # the verdict on version 1
    assert again["probe_version"] == 1 and again["probe_logp_change"] > 0
    answered(eng)
    with torch.no_grad():
        next(trainer.parameters()).mul_(2.0)
    third = update(3)
    assert third["probe_version"] == 2 and third["probe_logp_change"] == 0
    answered(eng)
    assert eng._verdict["probe_version"] == 3 and eng._verdict["probe_logp_change"] > 0
    rx.close()


@pytest.mark.parametrize("staged", [True, False])
def test_an_update_the_engine_does_not_see_stops_with_the_version_named(staged):
    from areal_cli.engines.adapter import WeightSyncError

    eng, trainer, update, rx = verified_engine(staged, engine_reads_weights=False)
    update(1)
    with pytest.raises(WeightSyncError,
                       match="update to version 1: the weights changed but the engine's logprobs"):
        answered(eng)
    rx.close()


def test_a_probe_that_vllm_has_no_room_for_is_withdrawn_at_the_next_update_and_never_waited_for(
        monkeypatch):
    import time

    from areal_cli.engines.vllm import engine as vllm_engine

    # the one probe waited for: before the first update
    monkeypatch.setattr(vllm_engine, "PROBE_WAIT_S", 0.2)
    eng, trainer, update, rx = verified_engine(staged=True, engine_reads_weights=None)
    assert update(1)["weights_changed"] == 1
    eng.poll(0.01)
    t0 = time.perf_counter()
    got = update(2)
    assert time.perf_counter() - t0 < 5.0  # no wait for the probe (it was 10 s per update)
    assert (got["probe_version"] == 1 and got["probe_skipped"] == 1
            and "probe_logp_change" not in got)
    assert "areal-probe-v1" in eng.core.aborted and eng._probing[0] == "areal-probe-v2"
    rx.close()


def test_a_finished_moe_request_takes_vllms_routed_experts_of_its_sparse_layers(tmp_path):
    """vLLM returns ``[prompt + output - 1, decoder layers, top-k]`` at the end of a request (here
    layer 0 dense: Qwen2-MoE's decoder_sparse_step=2); the sequence keeps the sparse layers' rows
    in the wire dtype, and a re-prefilled segment's rows replace the whole context's."""
    import numpy as np
    from transformers import Qwen2MoeConfig

    from areal_cli.engines.vllm.routing import Routing

    cfg = Qwen2MoeConfig(num_hidden_layers=4, decoder_sparse_step=2, num_experts=8,
                         num_experts_per_tok=2)
    eng = fake_engine()
    eng.routing = Routing.of_model(cfg)
    assert eng.routing.sparse == [1, 3] and Routing.of_model(Qwen2MoeConfig(num_experts=0)) is None
    eng.submit(Sequence("r", [1, 2, 3], max_new_tokens=2))
    routed = np.arange(4 * 4 * 2, dtype=np.uint8).reshape(4, 4, 2)  # 3 prompt + 2 output - 1
    comp = types.SimpleNamespace(token_ids=[7], logprobs=[{7: types.SimpleNamespace(logprob=-1.)}],
                                 finish_reason=None)
    eng._apply(types.SimpleNamespace(request_id="r#1", outputs=[comp], finished=False))
    assert eng.seqs["r"].routing == []  # vLLM hands them over at the end only
    comp = types.SimpleNamespace(token_ids=[8], logprobs=[{8: types.SimpleNamespace(logprob=-1.)}],
                                 finish_reason="length", routed_experts=routed)
    seq = eng._apply(types.SimpleNamespace(request_id="r#1", outputs=[comp], finished=True))
    assert len(seq.routing) == 4 and all(r.shape == (2, 2) for r in seq.routing)
    assert np.array_equal(np.stack(seq.routing), routed[:, [1, 3]])
    assert seq.routing[0].dtype == np.uint8  # 8 experts: one byte on the wire
    short = Routing.of_model(cfg)
    with pytest.raises(RuntimeError,
                       match="shape \\[3, 4, 2\\].*4 positions.*routing_replay=false"):
        short.of(routed[:3], 4)
    assert short.of(None, 4) == []  # none returned: the trainer routes those tokens itself


def test_routed_experts_are_asked_of_vllm_only_with_routing():
    cfg = RootConfig()
    cfg.engine.name = "vllm"
    cfg.engine = resolve_engine(cfg.engine, updates=False)
    assert "enable_return_routed_experts" not in llm_kwargs(cfg.engine, cfg.seed, 1)
    assert llm_kwargs(cfg.engine, cfg.seed, 1, routing=True)["enable_return_routed_experts"]

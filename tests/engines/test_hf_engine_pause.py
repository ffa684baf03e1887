"""The embedded engine's weight-update pause (paged loop), at its edges: cache pressure (the
scheduler holding back new requests), weights that are not finite, a sequence whose budget is spent,
and KV cache and input buffers full of garbage (what an accelerator's fresh or recycled memory may
hold)."""

from __future__ import annotations

import math
import random
import time

import pytest
import torch
from conftest import hf_engine

from areal_cli.engines.base import Sequence


def _engine(path, **kw):
    """The paged loop (transformers' continuous batching: the GPU's, and
    engine.hf.cpu_batching=paged); the slot loop's edges: test_slots.py."""
    return hf_engine(path, cpu_batching="paged", **kw)


def _processor(eng):
    """The batch processor (the loop thread creates it when it starts)."""
    deadline = time.monotonic() + 30
    while eng.manager.batch_processor is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return eng.manager.batch_processor


def _poll_until(eng, cond, timeout_s: float, done: list[Sequence] | None = None) -> list[Sequence]:
    """Poll into ``done`` (a new list unless given) until ``cond(done)`` or the timeout."""
    done, deadline = [] if done is None else done, time.monotonic() + timeout_s
    while not cond(done) and time.monotonic() < deadline:
        done += eng.poll(0.002)
    return done


def test_update_while_the_scheduler_holds_back_new_requests_does_not_stall(tiny_model):
    # 12 sequences x 44 tokens need 36 pages of 16, the cache has 16: the scheduler offloads a
    # request and then admits no waiting request until some request finishes. The update
    # cancels every active request, so none would ever finish: the resubmitted ones must be let in.
    # eos_token_id=-1 is transformers' "no EOS": no sequence can finish before its 40 tokens.
    eng = _engine(tiny_model, max_batch_tokens=64, kv_cache_tokens=256, page_size=16,
                  eos_token_id=-1)
    for i in range(12):
        eng.submit(Sequence(f"s{i}", [1, 500 + i, 600, 700], max_new_tokens=40))
    scheduler = _processor(eng).scheduler
    done = _poll_until(eng, lambda _: scheduler.block_new_requests, 30)
    held_back = []
    with eng.paused(1) as stats:
        held_back.append(scheduler.block_new_requests)
    assert held_back == [True] and not done and stats["interrupted"] == 12
    _poll_until(eng, lambda d: len(d) == 12, 30, done)
    eng.close()
    assert len(done) == 12, f"{12 - len(done)} sequences never finished after the update"
    assert all(len(s.output_ids) == len(s.logprobs) == len(s.versions) == 40 for s in done)
    assert all(math.isfinite(x) for s in done for x in s.logprobs)


def test_nonfinite_weights_stop_generation_with_a_named_error(tiny_model):
    eng = _engine(tiny_model)
    for i in range(4):
        eng.submit(Sequence(f"s{i}", [1, 9690, 198, 504 + i], max_new_tokens=200))
    _poll_until(eng, lambda _: any(len(s.output_ids) >= 2 for s in eng.seqs.values()), 30)
    name = "model.layers.0.mlp.down_proj.weight"

    with pytest.raises(RuntimeError,
                       match=f"version 1 are not finite.*{name}"), eng.paused(1), torch.no_grad():
        eng.model.get_parameter(name)[0, 0] = float("nan")
    time.sleep(0.3)  # the loop must not have sampled from the NaN weights
    assert eng.manager.is_running() and eng.manager.background_thread_status.fatal_error is None
    with pytest.raises(RuntimeError, match="not finite"):
        eng.poll(0.01)
    eng.close()


def test_a_sequence_with_no_budget_left_is_finished_not_resubmitted(tiny_model):
    eng = _engine(tiny_model)
    for i in range(3):
        eng.submit(Sequence(f"s{i}", [1, 9690, 198, 504 + i], max_new_tokens=300))
    _poll_until(eng, lambda _: all(len(s.output_ids) >= 3 for s in eng.seqs.values()), 30)
    spent = {}

    with eng.paused(1):  # as if s0 had just generated its last token
        seq = eng.seqs["s0"]
        seq.max_new_tokens = len(seq.output_ids)
        spent["tokens"] = list(seq.output_ids)
    done = eng.poll(0.0)
    eng.close()
    assert [s.rid for s in done] == ["s0"]
    s = done[0]
    assert s.finish_reason == "length" and s.segments == 1 and s.output_ids == spent["tokens"]


def test_garbage_in_the_kv_cache_and_input_buffers_is_never_read(tiny_model, monkeypatch):
    """A GPU's memory is not zeroed: the cache starts as NaN here, every block freed (finished,
    cancelled, offloaded requests) is refilled with NaN, and the static input buffers are filled
    with garbage before each batch. Under chunked prefill, cache pressure and repeated
    cancel-and-resubmit updates, not one logprob may be NaN."""
    from transformers.generation.continuous_batching import input_outputs
    from transformers.generation.continuous_batching.cache_allocators import cache_allocator

    free_blocks = cache_allocator.CacheAllocator.free_blocks

    def free_and_poison(self, request_id, no_cache=False):
        ids = list(self.block_table.get(request_id, []))
        free_blocks(self, request_id, no_cache)
        if ids:
            self._copy_view[torch.tensor(ids)] = 255  # all bits set: NaN as float32

    prepare = input_outputs.ContinuousBatchingIOs.prepare_batch_tensors

    def poison_and_prepare(self, *args, **kwargs):
        with torch.no_grad():
            for mask in (self.attention_mask or {}).values():
                mask.fill_(float("nan"))
            self._bulk_input_tensor[: self.static_inputs].fill_(987654)
            self.write_index_storage.fill_(1 << 40)
            self.read_index_storage.fill_(1 << 40)
            self.output_ids.fill_(-7)
        return prepare(self, *args, **kwargs)

    monkeypatch.setattr(cache_allocator.CacheAllocator, "free_blocks", free_and_poison)
    monkeypatch.setattr(input_outputs.ContinuousBatchingIOs, "prepare_batch_tensors",
                        poison_and_prepare)
    eng = _engine(tiny_model, max_batch_tokens=32, kv_cache_tokens=512, page_size=16)
    _processor(eng).cache.cache_tensor.fill_(255)  # before any request: no KV is written yet
    rng = random.Random(0)

    def submit(n, start):
        for i in range(start, start + n):
            prompt = [1] + [rng.randrange(3, 40000) for _ in range(rng.randrange(3, 30))]
            eng.submit(Sequence(f"s{i}", prompt, max_new_tokens=rng.randrange(1, 30)))

    submit(30, 0)
    done, interrupted = [], 0
    for version in range(1, 4):
        _poll_until(eng, lambda _: False, 0.05 * version, done)
        submit(5, 25 + 5 * version)
        with eng.paused(version) as stats:
            pass
        interrupted += stats["interrupted"]
    _poll_until(eng, lambda d: len(d) == 45, 60, done)
    eng.close()
    assert len(done) == 45 and interrupted > 0
    assert all(len(s.output_ids) == len(s.logprobs) <= s.max_new_tokens for s in done)
    assert all(math.isfinite(x) for s in done for x in s.logprobs)

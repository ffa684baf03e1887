"""In-place intake of the vLLM engine (engines/vllm/inplace.py) on the CPU: areal's bucketed
broadcast (gloo, trainer and engine ends in two threads) received behind the live weights, which
change only at
``apply``; the routing of checkpoint tensors into the engine's fused parameters. vLLM's own weight
loaders and GPU worker are exercised on a GPU (benchmarks/device/vllm_update.py)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from areal_cli.engines.vllm.inplace import StagedUpdate, route, routes, shadow, staging_choice
from areal_cli.transport.weights import ParamSpec, WeightSender, new_group, param_specs
from tests.transport.test_weights import free_port, small_model


def _ends(staged: bool, bucket: int = 300, trainer=None, live=None, signal: str | None = None):
    """(trainer model, sender, engine parameters, the engine's StagedUpdate) joined on loopback; by
    default the small model, the engine's copy zeroed."""
    if trainer is None:
        trainer, engine = small_model(torch.float32), small_model(torch.bfloat16)
        with torch.no_grad():
            for p in engine.parameters():
                p.zero_()
        live = dict(engine.named_parameters())
    port, box = free_port(), {}

    def join():
        box["store"], pg = new_group("127.0.0.1", port, 1, 2, "gloo", 30)
        box["rx"] = StagedUpdate(param_specs(trainer), live, pg, "gloo", torch.bfloat16, bucket,
                                 torch.device("cpu"), staged, signal)

    t = threading.Thread(target=join)
    t.start()
    tx = WeightSender(param_specs(trainer), "127.0.0.1", port, 2, "gloo", torch.device("cpu"),
                      torch.bfloat16,
                      bucket, timeout_s=30)
    t.join()
    return trainer, tx, live, box["rx"]


def _send(trainer, tx, rx) -> dict:
    """One update of the trainer's weights, received and applied; apply's timings."""
    tx.prepare(iter(trainer.named_parameters()))
    rx.begin()
    sent = threading.Thread(target=tx.broadcast)
    sent.start()
    out = rx.apply()
    sent.join()
    return out


def test_staged_update_is_received_behind_the_live_weights_and_swapped_at_apply():
    trainer, tx, live, rx = _ends(staged=True)
    assert len(rx.loader.buckets) > 1  # several buckets, two slots
    tx.prepare(iter(trainer.named_parameters()))
    rx.begin()
    assert not rx.done()  # the receiving thread waits for the wire
    sent = threading.Thread(target=tx.broadcast)
    sent.start()
    # "generation" goes on reading the live weights meanwhile: still the old ones
    while not rx.done():
        assert all(not p.any() for p in live.values())
    sent.join()
    assert all(not p.any() for p in live.values())
    out = rx.apply()
    assert set(out) == {"weight_recv_s", "weight_load_s", "weight_swap_s", "weights_changed"}
    assert out["weights_changed"] == 1
    for name, p in trainer.named_parameters():
        assert torch.equal(live[name], p.detach().to(torch.bfloat16))  # bit-exact in the wire dtype
    with pytest.raises(RuntimeError, match="apply before begin"):
        rx.apply()
    rx.close()


def test_direct_update_is_received_by_apply_into_the_live_weights():
    trainer, tx, live, rx = _ends(staged=False)
    assert rx.shadows == {}  # no second copy
    tx.prepare(iter(trainer.named_parameters()))
    rx.begin()
    assert rx.done()  # nothing in the background: apply receives
    sent = threading.Thread(target=tx.broadcast)
    sent.start()
    out = rx.apply()
    sent.join()
    assert out["weight_swap_s"] == 0.0
    for name, p in trainer.named_parameters():
        assert torch.equal(live[name], p.detach().to(torch.bfloat16))
    rx.close()


@pytest.mark.parametrize("staged", [True, False])
def test_apply_says_whether_the_update_changed_the_weights(staged):
    trainer, tx, live, rx = _ends(staged=staged)

    def update():
        return _send(trainer, tx, rx)["weights_changed"]

    assert update() == 1  # zeros → the trainer's weights
    assert update() == 0  # the same weights again: nothing for the engine's outputs to show
    with torch.no_grad():
        next(trainer.parameters())[0, 0] += 1.0  # one element of one tensor
    assert update() == 1
    rx.close()


@pytest.mark.parametrize("staged", [True, False])
def test_unchanged_weights_read_unchanged_where_the_engine_pads_a_parameter(staged):
    """vLLM pads its vocabulary to a multiple of 64; its loader writes the real rows only. Weights
    the engine already has (the trainer skipped its first step) must not count as a change, or the
    probe check would stop a healthy run."""
    trainer = torch.nn.Sequential(torch.nn.Embedding(10, 4))

    def padded_rows_loader(param, tensor):
        param.data[: tensor.shape[0]].copy_(tensor)

    table = torch.nn.Parameter(torch.full((16, 4), 7.0, dtype=torch.bfloat16), requires_grad=False)
    # the engine starts from the trainer's weights, as both load one checkpoint
    with torch.no_grad():
        table[:10] = trainer[0].weight.to(torch.bfloat16)
    table.weight_loader = padded_rows_loader
    trainer, tx, live, rx = _ends(staged, 1 << 20, trainer, {"0.weight": table})

    def update():
        return _send(trainer, tx, rx)["weights_changed"]

    # the first update, after a skipped step: the engine already has these weights
    assert update() == 0
    with torch.no_grad():
        trainer[0].weight[3] += 1.0
    assert update() == 1 and update() == 0
    # padding untouched
    assert torch.equal(table.data[10:], torch.full((6, 4), 7.0, dtype=torch.bfloat16))
    rx.close()


def test_fingerprint_sees_one_element_moved_by_one_unit_in_the_last_place():
    from areal_cli.engines.vllm.inplace import fingerprint

    same_width = {2: torch.int16, 4: torch.int32}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        # a whole number of 32-bit words, and an odd count of 16-bit values
        for shape in ((64, 32), (7, 5)):
            a = torch.randn(*shape).to(dtype)
            b = a.clone()
            # also a view at an offset
            assert torch.equal(fingerprint([a, a[1:4]]), fingerprint([b, b[1:4]]))
            b.view(same_width[b.element_size()])[3, 4] += 1  # the next representable value
            assert not torch.equal(a, b) and not torch.equal(fingerprint([a]),
                                                             fingerprint([b])), (dtype, shape)


def test_checkpoint_tensors_route_into_the_engines_fused_parameters():
    layer = "model.layers.3"
    assert route(f"{layer}.self_attn.k_proj.weight") == (f"{layer}.self_attn.qkv_proj.weight", "k")
    assert route(f"{layer}.self_attn.q_proj.bias") == (f"{layer}.self_attn.qkv_proj.bias", "q")
    assert route(f"{layer}.mlp.up_proj.weight") == (f"{layer}.mlp.gate_up_proj.weight", 1)
    assert route(f"{layer}.mlp.down_proj.weight") == (f"{layer}.mlp.down_proj.weight", None)
    assert route("model.norm.weight") == ("model.norm.weight", None)
    specs = [ParamSpec(f"{layer}.self_attn.{m}.weight", (4, 4), 16)
             for m in ("q_proj", "k_proj", "v_proj")]
    fused = {f"{layer}.self_attn.qkv_proj.weight": torch.zeros(12, 4)}
    assert set(routes(specs, fused).values()) == {(f"{layer}.self_attn.qkv_proj.weight", s)
                                                  for s in "qkv"}
    with pytest.raises(ValueError, match="nothing sent to .*o_proj.*engine.weight_update=reload"):
        routes(specs, {**fused, f"{layer}.self_attn.o_proj.weight": torch.zeros(4, 4)})
    with pytest.raises(ValueError, match="no engine parameter for .*q_proj"):
        routes(specs, {f"{layer}.self_attn.q_proj.weight": torch.zeros(4, 4)})
    # a checkpoint with tied embeddings (no lm_head tensor) into an engine whose model keeps its own
    # head (vLLM's OLMoE): nothing would ever load the head, and the message says so
    with pytest.raises(ValueError, match="ties lm_head to embed_tokens.*tie_word_embeddings=false"):
        routes(specs, {**fused, "lm_head.weight": torch.zeros(4, 4)})


class Sharded(torch.nn.Parameter):
    """A parameter class carrying its own loading attributes, as vLLM's do."""


def test_shadow_keeps_the_parameter_class_and_its_loading_attributes_over_new_memory():
    p = Sharded(torch.ones(3, 2), requires_grad=False)
    p.output_dim, p.weight_loader = 0, lambda param, w, shard=None: param.data.copy_(w)
    s = shadow(p)
    assert type(s) is Sharded and s.output_dim == 0 and s.weight_loader is p.weight_loader
    assert s.shape == p.shape and s.data_ptr() != p.data_ptr()
    # the loader writes into the shadow, never the live one
    s.weight_loader(s, torch.full((3, 2), 7.0))
    assert torch.equal(p, torch.ones(3, 2)) and torch.equal(s, torch.full((3, 2), 7.0))


def test_tensor_parallel_ranks_stage_only_with_staged_tp():
    fits, short = (lambda: (True, "fits")), (lambda: (False, "too little memory"))
    assert staging_choice(1, {"staging": True}, fits) == (True, "fits")
    assert staging_choice(1, {"staging": True}, short) == (False, "too little memory")
    assert staging_choice(1, {"staging": False}, fits)[0] is False
    staged, why = staging_choice(2, {"staging": True}, fits)
    # the default at TP > 1: received in the pause
    assert not staged and "engine.vllm.staged_tp=false" in why
    assert staging_choice(2, {"staging": True, "staged_tp": True}, fits) == (True, "fits")
    # memory still decides
    assert staging_choice(4, {"staging": True, "staged_tp": True}, short)[0] is False


def test_the_engine_process_switches_the_gil_often_only_while_a_staged_update_is_received():
    import sys

    from areal_cli.engines.vllm.inplace import InplaceWorker
    from areal_cli.runtime import SWITCH_INTERVAL_S

    trainer, tx, live, rx = _ends(staged=True)
    worker = InplaceWorker()  # its methods as vLLM's worker runs them, with this intake
    worker.areal_weights = rx
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)  # Python's default, as in vLLM's engine process
        tx.prepare(iter(trainer.named_parameters()))
        worker.areal_weights_begin()
        # the receiving thread gets the GIL after each bucket
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S
        sent = threading.Thread(target=tx.broadcast)
        sent.start()
        worker.areal_weights_apply()
        sent.join()
        assert sys.getswitchinterval() == 0.005  # the engine's own threads, outside a receive
    finally:
        sys.setswitchinterval(before)
        rx.close()


def test_the_receiving_thread_signals_each_finished_receive_through_a_file(tmp_path):
    from areal_cli.engines.vllm.inplace import receives_finished

    signal = str(tmp_path / "received.1")
    trainer, tx, live, rx2 = _ends(staged=True, signal=signal)
    assert receives_finished(signal) == 0
    for n in (1, 2):
        tx.prepare(iter(trainer.named_parameters()))
        rx2.begin()
        sent = threading.Thread(target=tx.broadcast)
        sent.start()
        deadline = time.monotonic() + 30
        while receives_finished(signal) < n and time.monotonic() < deadline:
            time.sleep(0.001)
        # the file is written as the receive ends, just before its future is marked done
        while not rx2.done() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert receives_finished(signal) == n and rx2.done()
        rx2.apply()
        sent.join()
    rx2.close()
    assert receives_finished(signal) == 0  # removed with the intake


class EngineWorker:
    """vLLM's GPU worker as ``InplaceWorker`` sees it (vLLM does not run on the CPU): its model and
    its place in the engine's tensor parallel group."""

    def __init__(self, model: torch.nn.Module):
        from types import SimpleNamespace

        self.model = model
        self.vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(world_size=1, rank=0))

    def get_model(self) -> torch.nn.Module:
        return self.model


def test_the_rollout_workers_receiver_sees_a_staged_update_done_from_the_threads_signal_file():
    from types import SimpleNamespace

    from areal_cli.engines.vllm.inplace import InplaceWorker
    from areal_cli.engines.vllm.weights import InplaceReceiver, WireSpec

    class Worker(EngineWorker, InplaceWorker):
        pass

    trainer, engine = small_model(torch.float32), small_model(torch.bfloat16)
    with torch.no_grad():
        for p in engine.parameters():
            p.zero_()
    worker = Worker(engine)
    calls: list[str] = []
    llm = SimpleNamespace(collective_rpc=lambda name, kwargs=None: calls.append(name) or [
        getattr(worker, name)(**(kwargs or {}))])
    specs = param_specs(trainer)
    spec = WireSpec([s.name for s in specs], ["bfloat16"] * len(specs),
                    [list(s.shape) for s in specs])
    port, box = free_port(), {}
    plan = dict(host="127.0.0.1", port=port, store="", rank_offset=1, world_size=2, backend="gloo",
                wire_dtype="bfloat16", bucket_bytes=300, timeout_s=30, staging=True,
                staged_tp=False)
    joining = threading.Thread(target=lambda: box.update(rx=InplaceReceiver(llm, spec, plan)))
    joining.start()
    tx = WeightSender(specs, "127.0.0.1", port, 2, "gloo", torch.device("cpu"), torch.bfloat16, 300,
                      timeout_s=30)
    joining.join()
    rx = box["rx"]
    assert rx.background  # staged: the engine generates between begin and apply
    tx.prepare(iter(trainer.named_parameters()))
    rx.begin()
    assert not rx.done()  # the trainer has not sent
    sent = threading.Thread(target=tx.broadcast)
    sent.start()
    deadline = time.monotonic() + 30
    while not rx.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    # waited on the file: no call into the engine
    assert rx.done() and calls[-1] == "areal_weights_begin"
    got = rx.apply()
    sent.join()
    assert got["weights_changed"] == 1
    for name, p in trainer.named_parameters():
        assert torch.equal(dict(engine.named_parameters())[name], p.detach().to(torch.bfloat16))
    worker.areal_weights_close()
    rx.close()

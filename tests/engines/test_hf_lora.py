"""LoRA updates into the embedded engine, for real (gloo broadcast on loopback, the tiny model): an
update that changes the adapter changes the engine's logprobs, exactly as the merged weights dictate;
an update that leaves the adapter as it was is reported as a zero delta; a sync forced to do nothing
(``AREAL_FAULT=adapter@v``, ``AREAL_FAULT_MODE=skip``) is caught and named."""

from __future__ import annotations

import socket
import threading

import pytest
import torch
from conftest import hf_engine

from areal_cli import faults, lora
from areal_cli.engines.adapter import AdapterSyncError
from areal_cli.engines.base import WeightSource
from areal_cli.engines.factory import make_sender
from areal_cli.runconfig.autos import resolve
from areal_cli.runconfig.compose import compose


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forward_logprobs(model, ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def update_in_thread(eng, tx, trainer, version: int, timeout_s: float = 60) -> dict:
    """Send ``trainer``'s adapter as ``version`` while ``eng`` receives it on a thread of its own:
    ``{"timings": ...}``, or ``{"error": AdapterSyncError}`` when the engine's verification failed."""
    box: dict = {}

    def run():
        try:
            box["timings"] = eng.update_weights(version)
        except AdapterSyncError as err:
            box["error"] = err

    t = threading.Thread(target=run)
    t.start()
    tx.prepare(lora.adapter_items(iter(trainer.named_parameters())))
    tx.broadcast()
    t.join(timeout_s)
    return box


def test_adapter_updates_change_the_engines_logprobs_and_a_noop_sync_is_named(tiny_model, monkeypatch):
    from transformers import AutoModelForCausalLM

    cfg = resolve(compose(["trainer.lora.rank=4", "trainer.lora.alpha=8", "weights.bucket_mb=1",
                           "launcher.peer_timeout_s=30"]))
    trainer = lora.inject(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), cfg.trainer.lora)
    port, box = free_port(), {}
    t = threading.Thread(target=lambda: box.setdefault("eng", hf_engine(
        tiny_model, weights=WeightSource(cfg, "127.0.0.1", port))))
    t.start()
    tx = make_sender(cfg, "127.0.0.1", port, trainer, torch.device("cpu"))
    t.join(60)
    eng = box["eng"]
    ids = [1, 9690, 198, 504, 30, 28, 77, 1200, 9, 45]
    try:
        before = _forward_logprobs(eng.model, ids)
        got = update_in_thread(eng, tx, trainer, 1)  # a fresh adapter: random A, B = 0, so B @ A moves nothing
        assert "error" not in got and got["timings"]["adapter_delta_zero"] == 1
        torch.manual_seed(1)
        with torch.no_grad():
            for n, p in trainer.named_parameters():
                if "lora_B" in n:
                    p.normal_(std=0.05)
        got = update_in_thread(eng, tx, trainer, 2)
        assert "error" not in got, got
        assert got["timings"]["adapter_delta_zero"] == 0 and got["timings"]["probe_logp_change"] > 0
        after = _forward_logprobs(eng.model, ids)
        assert (after - before).abs().max() > 1e-3  # the engine now samples from another policy ...
        trainer.eval()
        torch.testing.assert_close(after, _forward_logprobs(trainer, ids), atol=1e-4, rtol=1e-4)  # ... the trainer's

        got = update_in_thread(eng, tx, trainer, 3)  # the adapter did not change (a step that moved nothing)
        assert "error" not in got and got["timings"]["adapter_delta_zero"] == 1
        assert got["timings"]["probe_logp_change"] == 0.0

        with torch.no_grad():
            for n, p in trainer.named_parameters():
                if "lora_B" in n:
                    p.add_(0.01)
        monkeypatch.setattr(faults, "_SPEC", "adapter@4")
        monkeypatch.setenv("AREAL_FAULT_MODE", "skip")
        got = update_in_thread(eng, tx, trainer, 4)
        assert isinstance(got.get("error"), AdapterSyncError), got
        assert "version 4" in str(got["error"]) and "did not take effect" in str(got["error"])
    finally:
        eng.close()
        tx.close()


@pytest.mark.parametrize("merge", [False, True])
def test_update_specs_match_both_ends(tiny_model, merge):
    """What the trainer sends is what the engine expects: the adapter (A, B per layer, the engine derives
    them from its plain model), or the merged weights in the plain model's own order."""
    from transformers import AutoModelForCausalLM

    from areal_cli.transport.weights import param_specs

    cfg = resolve(compose(["trainer.lora.rank=4", f"engine.lora_merge={str(merge).lower()}"]))
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    adapted = lora.inject(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), cfg.trainer.lora)
    want = param_specs(plain) if merge else lora.adapter_specs(plain, cfg.trainer.lora)
    assert lora.update_specs(adapted, cfg) == want

"""LoRA with engine=vllm: vLLM's LoRA settings, and, where vLLM and a GPU are present, the real
thing: an adapter update (areal's broadcast over gloo, loaded through vLLM's LoRA API from tmpfs)
changes the engine's logprobs as the merged weights dictate; an unchanged adapter is a zero delta; a
sync forced to do nothing (``AREAL_FAULT=adapter@v``, ``AREAL_FAULT_MODE=skip``) is caught and
named."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from areal_cli.config.schema import RootConfig
from areal_cli.engines.vllm.args import llm_kwargs, vllm_lora_rank
from areal_cli.engines.vllm.updates import engine_dtype, sender_specs
from areal_cli.runconfig.autos import resolve_engine
from tests.engines.test_hf_lora import update_in_thread
from tests.engines.test_vllm_engine import _gpu_vllm


def test_llm_kwargs_enable_lora_at_a_rank_vllm_accepts():
    cfg = RootConfig()
    cfg.engine.name = "vllm"
    cfg.engine = resolve_engine(cfg.engine, updates=False)
    kw = llm_kwargs(cfg.engine, 0, 0, lora_rank=12)
    assert kw["enable_lora"] and kw["max_lora_rank"] == 16 and kw["max_loras"] == 1
    assert "weight_transfer_config" not in kw  # the base weights never change
    assert vllm_lora_rank(1) == 1 and vllm_lora_rank(300) == 320
    with pytest.raises(ValueError, match="engine.lora_merge=true"):
        vllm_lora_rank(600)


def test_merged_updates_to_vllm_name_the_plain_parameters(tiny_model):
    """engine.lora_merge=true: vLLM's transfer is planned from the merged plain parameters (names
    and shapes of the model without adapters), not from the adapted model's base_layer / lora_A
    names."""
    import torch
    from transformers import AutoModelForCausalLM

    from areal_cli import lora

    cfg = RootConfig()
    cfg.engine.name, cfg.engine.lora_merge, cfg.trainer.lora.rank = "vllm", "true", 4
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    adapted = lora.inject(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32),
                          cfg.trainer.lora)
    want = [(n, list(p.shape)) for n, p in plain.named_parameters()]
    assert sender_specs(adapted, cfg) == want
    cfg.trainer.lora.rank = 0
    assert sender_specs(plain, cfg) == want
    assert engine_dtype(cfg.engine) == torch.bfloat16  # "auto"


def test_adapter_saved_in_the_engine_dtype_loads_back(tmp_path):
    import torch
    from safetensors.torch import load_file

    from areal_cli import lora
    from areal_cli.config.schema import LoraConfig

    a = torch.randn(4, 64)
    lora.save_adapter(tmp_path, iter([("model.layers.0.self_attn.q_proj.lora_A.weight", a)]),
                      LoraConfig(rank=4), "base", dtype=torch.bfloat16)
    got = load_file(str(tmp_path / "adapter_model.safetensors"))
    t = got["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert t.dtype == torch.bfloat16 and torch.equal(t, a.to(torch.bfloat16))
    assert lora.saved_rank(tmp_path) == 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(bool(_gpu_vllm()), reason=_gpu_vllm() or "runs")
def test_real_vllm_adapter_updates_are_loaded_and_verified(tiny_model, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from areal_cli import faults, lora
    from areal_cli.config.resolve import Placement
    from areal_cli.engines.adapter import AdapterSyncError, probe_ids
    from areal_cli.engines.base import EngineSetup, Sampling, WeightSource
    from areal_cli.engines.factory import make_engine, make_sender
    from areal_cli.runconfig.autos import resolve
    from areal_cli.runconfig.compose import compose

    cfg = resolve(compose(["engine=vllm", "trainer.lora.rank=8", "trainer.lora.alpha=16",
                           "engine.lora_merge=false",
                           "weights.backend=gloo", "engine.vllm.enforce_eager=true",
                           "engine.gpu_memory_utilization=0.2",
                           "engine.vllm.max_model_len=512", "launcher.peer_timeout_s=120"]),
                  # as the launcher resolves it: no "auto" left
                  Placement(model_path=Path(tiny_model)))
    trainer = lora.inject(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32),
                          cfg.trainer.lora)
    port, box = _free_port(), {}
    setup = EngineSetup(cfg.engine, tiny_model, 2, Sampling(1.0), sequences=8,
                        weights=WeightSource(cfg, "127.0.0.1", port))

    # an engine that fails to start fails the test at once, with its own error
    def start(key, make):
        try:
            box[key] = make()
        except BaseException as err:  # noqa: BLE001 (handed to the test's thread below)
            box[f"{key}_error"] = err

    threads = [threading.Thread(target=start, args=("eng", lambda: make_engine(setup)),
                                daemon=True),
               threading.Thread(target=start,
                                args=("tx", lambda: make_sender(cfg, "127.0.0.1", port, trainer,
                                                                             torch.device("cpu"))),
                                daemon=True)]
    for t in threads:
        t.start()
    threads[0].join(600)
    if "eng_error" in box:
        raise box["eng_error"]
    threads[1].join(300)
    if "tx_error" in box:
        raise box["tx_error"]
    eng, tx = box["eng"], box["tx"]

    def update(version):
        return update_in_thread(eng, tx, trainer, version, timeout_s=300)

    ids = probe_ids(trainer.config.vocab_size)
    try:
        base = eng.probe_logprobs(ids)
        with torch.no_grad():
            for n, p in trainer.named_parameters():
                if "lora_B" in n:
                    p.normal_(std=0.05)
        got = update(1)
        assert "error" not in got and got["timings"]["adapter_delta_zero"] == 0
        after = eng.probe_logprobs(ids)
        assert (after - base).abs().max() > 1e-2
        trainer.eval()
        with torch.no_grad():
            want = torch.log_softmax(trainer(input_ids=torch.tensor([ids])).logits[0, :-1].float(),
                                     -1)
        want = want.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        assert (after - want).abs().mean() < 0.05  # bf16 engine vs float32 trainer
        got = update(2)
        assert "error" not in got and got["timings"]["adapter_delta_zero"] == 1
        with torch.no_grad():
            for n, p in trainer.named_parameters():
                if "lora_B" in n:
                    p.add_(0.02)
        monkeypatch.setattr(faults, "_SPEC", "adapter@3")
        monkeypatch.setenv("AREAL_FAULT_MODE", "skip")
        got = update(3)
        assert isinstance(got.get("error"), AdapterSyncError) and "version 3" in str(got["error"])
    finally:
        eng.close()
        tx.close()

"""The weight broadcast (gloo on the CPU, two ranks in two threads) and its layouts."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import free_port

from areal_cli.config.resolve import Placement
from areal_cli.config.schema import RootConfig
from areal_cli.launcher.devices import device_map, shares_rank0_gpu
from areal_cli.runconfig.autos import resolve, resolve_engine
from areal_cli.transport.weights import WeightReceiver, WeightSender, param_specs


def small_model(dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 8)).to(dtype)


@pytest.mark.parametrize("staged", [True, False])
def test_updates_arrive_bit_exact_in_several_buckets(staged):
    trainer, engine = small_model(torch.float32), small_model(torch.bfloat16)
    with torch.no_grad():
        for p in engine.parameters():
            p.zero_()
    port, bucket = free_port(), 300  # bytes: one bucket per parameter
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("rx", WeightReceiver(
        engine, "127.0.0.1", port, 1, 2, "gloo", torch.bfloat16, bucket, timeout_s=30)))
    t.start()
    tx = WeightSender(param_specs(trainer), "127.0.0.1", port, 2, "gloo", torch.device("cpu"),
                      torch.bfloat16,
                      bucket, timeout_s=30, staged=staged)
    t.join()
    rx = box["rx"]
    assert len(tx.buckets) == len(rx.buckets) == 4
    for update in range(2):
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(0.5 + update)
        got: dict = {}
        t = threading.Thread(target=lambda got=got: got.update(rx.receive()))
        t.start()
        sent = {**tx.prepare(iter(trainer.named_parameters())), **tx.broadcast()}
        t.join()
        assert sent["weight_transfer_s"] > 0 and got["weight_recv_s"] > 0
        for (name, a), b in zip(trainer.named_parameters(), engine.parameters(), strict=True):
            assert torch.equal(a.to(torch.bfloat16), b), f"{name} differs after update {update}"


def test_weight_order_mismatch_is_an_error():
    trainer = small_model(torch.float32)
    port = free_port()
    t = threading.Thread(target=lambda: WeightReceiver(small_model(torch.bfloat16), "127.0.0.1",
                                                       port, 1, 2,
                                                       "gloo", torch.bfloat16, 1 << 20,
                                                       timeout_s=30))
    t.start()
    tx = WeightSender(param_specs(trainer), "127.0.0.1", port, 2, "gloo", torch.device("cpu"),
                      torch.bfloat16,
                      1 << 20, timeout_s=30)
    t.join()
    with pytest.raises(RuntimeError, match="weight order"):
        tx.prepare(reversed(list(trainer.named_parameters())))


def test_one_gpu_run_sends_weights_through_cuda_ipc_for_either_engine():
    for name in ("hf", "vllm"):
        cfg = RootConfig()
        cfg.engine.name = name
        devices = device_map(cfg, gpus=[0])
        assert devices == {"rollout": [0], "trainer": [0]}
        assert shares_rank0_gpu(cfg, devices)
        assert resolve(cfg, Placement(trainer_gpu=True, shared_gpu=True)).weights.backend == "ipc"
    cfg = RootConfig()
    assert not shares_rank0_gpu(cfg, device_map(cfg, gpus=[0, 1]))
    # between the two GPUs
    assert resolve(cfg, Placement(trainer_gpu=True)).weights.backend == "nccl"


def test_float32_head_gives_float32_logits_of_the_rounded_weights(tiny_model):
    from transformers import AutoModelForCausalLM

    from areal_cli.trainer.model import float32_head

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16)
    ids = torch.tensor([[1, 2, 3, 4]])
    float32_head(model)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    h = out.hidden_states[-1]
    want = h.float() @ model.get_output_embeddings().weight.float().T
    assert out.logits.dtype == torch.float32
    torch.testing.assert_close(out.logits, want)
    cfg = RootConfig()
    assert resolve_engine(cfg.engine).lm_head_fp32 == "false"  # auto: off with hf
    cfg.engine.name = "vllm"
    assert resolve_engine(cfg.engine).lm_head_fp32 == "true"  # on with vllm


def test_auto_weight_update_is_inplace_where_the_fused_layout_is_known_at_any_tp(tiny_model,
                                                                                 tmp_path):
    from transformers import AutoConfig

    from areal_cli.engines.vllm.weights import choose_weight_update

    assert choose_weight_update("auto", tiny_model, 1)[0] == "inplace"  # SmolLM2 is a Llama
    mode, why = choose_weight_update("auto", tiny_model, 2)
    assert mode == "inplace" and "tensor_parallel_size=2" in why
    assert choose_weight_update("reload", tiny_model, 1)[0] == "reload"
    other = AutoConfig.from_pretrained(tiny_model)
    other.architectures = ["GPT2LMHeadModel"]
    other.save_pretrained(tmp_path)
    assert choose_weight_update("auto", tmp_path, 1)[0] == "reload"

"""The weight broadcast through CUDA IPC between two processes on one GPU (weights.backend=ipc):
bit-exact in several buckets, into the hf engine's parameters (WeightReceiver) and into a staging
copy swapped in afterwards (StagedUpdate, vLLM's intake)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from conftest import free_port

from areal_cli.transport.weights import WeightSender, param_specs

BUCKET = 1024  # bytes: four buckets per update



def small_model(dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 16)).to(dtype)


def receiver(port: int, staged: bool, updates: int, out) -> None:
    """A second process on GPU 0: receives ``updates`` updates, puts each one's weights on ``out``
    (as the CPU sees them) with its timings."""
    from areal_cli.engines.vllm.inplace import StagedUpdate
    from areal_cli.transport.weights import WeightReceiver, new_group

    torch.cuda.set_device(0)
    engine = small_model(torch.bfloat16).cuda()
    with torch.no_grad():
        for p in engine.parameters():
            p.zero_()
    if staged:
        _, pg = new_group("127.0.0.1", port, 1, 2, "ipc", 60)
        live = dict(engine.named_parameters())
        rx = StagedUpdate(param_specs(engine), live, pg, "ipc", torch.bfloat16, BUCKET,
                          torch.device("cuda", 0), staged=True)
    else:
        rx = WeightReceiver(engine, "127.0.0.1", port, 1, 2, "ipc", torch.bfloat16, BUCKET,
                            timeout_s=60)
    for _ in range(updates):
        if staged:
            rx.begin()
            timings = rx.apply()
        else:
            timings = rx.receive()
        out.put(({n: p.detach().cpu() for n, p in engine.named_parameters()}, timings))
    rx.close() if staged else None


@pytest.mark.parametrize("staged", [False, True])
def test_updates_arrive_bit_exact_through_cuda_ipc(staged):
    ctx = mp.get_context("spawn")
    out, port, updates = ctx.Queue(), free_port(), 3
    proc = ctx.Process(target=receiver, args=(port, staged, updates, out))
    proc.start()
    device = torch.device("cuda", 0)
    trainer = small_model(torch.float32).to(device)
    tx = WeightSender(param_specs(trainer), "127.0.0.1", port, 2, "ipc", device, torch.bfloat16,
                      BUCKET, timeout_s=60, staged=True)
    assert len(tx.buckets) == 4
    try:
        for update in range(updates):
            with torch.no_grad():
                for p in trainer.parameters():
                    p.add_(0.5 + update)
            sent = {**tx.prepare(iter(trainer.named_parameters())), **tx.broadcast()}
            got, timings = out.get(timeout=60)
            assert sent["weight_transfer_s"] > 0 and timings["weight_recv_s"] > 0
            if staged:
                assert timings["weights_changed"] == 1
            for name, p in trainer.named_parameters():
                assert torch.equal(p.detach().to(torch.bfloat16).cpu(), got[name]), (
                    f"{name} differs after update {update}")
    finally:
        tx.close()
        proc.join(timeout=60)
    assert proc.exitcode == 0

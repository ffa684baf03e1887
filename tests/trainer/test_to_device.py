"""Host tensors reach the GPU through pinned memory without blocking the host
(trainer/batching.py)."""

from __future__ import annotations

import time

import pytest
import torch

from areal_cli.trainer.batching import to_device


def test_a_cpu_target_returns_the_same_values():
    t = torch.arange(10)
    out = to_device(t, "cpu")
    assert torch.equal(out, t) and out.device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_copy_to_the_gpu_does_not_wait_for_the_kernels_queued_before_it():
    t = torch.arange(1 << 20)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time queued on the current stream
    t0 = time.perf_counter()
    out = to_device(t, "cuda")
    returned = time.perf_counter() - t0
    assert returned < 0.2, f"the host waited {returned:.2f} s for the GPU"
    assert torch.equal(out.cpu(), t)  # the values, once the stream got there

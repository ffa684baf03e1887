"""Model FLOPs of a hand-counted tiny config, MFU against a given peak, peak memory metrics."""

from __future__ import annotations

import types

import pytest
import torch
from helpers import config, init_gloo, make_batch, plain_model

from areal_cli.trainer.batching import from_batch
from areal_cli.trainer.metrics import flop_terms, peak_flops, sequence_flops
from areal_cli.trainer.model import build_policy
from areal_cli.trainer.step import StepRunner

TINY = types.SimpleNamespace(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2,
                             head_dim=16, intermediate_size=128, vocab_size=49152)


def test_flops_of_the_tiny_config_by_hand():
    # one layer's matmul weights: q and o 64·(4·16) = 4096 each, k and v 64·(2·16) = 2048 each,
    # MLP 3·64·128 = 24576: 36864. body = 6·2·36864 = 442368 per token;
    # attention = 12·2·(4·16) = 1536 per token per token of context; head = 6·49152·64 = 18874368
    assert flop_terms(TINY) == (442368.0, 1536.0, 18874368.0)
    # a 10-token sequence whose last 4 tokens are the response:
    # (442368 + 1536·10)·10 + 18874368·4 = 4577280 + 75497472 = 80074752
    assert sequence_flops(flop_terms(TINY), 10, 4) == 80074752.0


def test_peak_flops_table_and_override():
    assert peak_flops(torch.device("cpu"), 0.0) is None
    assert peak_flops(torch.device("cpu"), 2e12) == 2e12


def test_step_reports_mfu_and_peak_memory(tiny_model):
    init_gloo()
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=12,
                       rewards=[1.0, 0.0, 1.0, 1.0])
    metrics = {}
    for peak in (0.0, 1e9):
        cfg = config(f"trainer.peak_flops={peak}")
        torch.manual_seed(0)
        model = build_policy(tiny_model, torch.device("cpu"), torch.float32,
                             activation_checkpointing=False)
        runner = StepRunner.build(model, tiny_model, cfg, torch.device("cpu"), torch.float32,
                                  rank=0, world=1)
        metrics[peak] = runner.train(batch)
    assert "mfu" not in metrics[0.0] and "peak_gpu_mem_gb" not in metrics[0.0]
    m = metrics[1e9]
    # only the mixed group (rows 0 and 1) was trained: its model FLOPs over the step's time
    ro = from_batch(batch)
    flops = sum(sequence_flops(flop_terms(runner.model.config),
                               len(ro.prompts[i]) + len(ro.responses[i]),
                               len(ro.responses[i])) for i in (0, 1))
    assert m["skipped_rows"] == 2
    seconds = m["trained_tokens"] / m["train_tokens_per_s"]  # the step's time
    assert m["mfu"] == pytest.approx(flops / seconds / 1e9, rel=1e-9)
    assert m["model_tflops_per_s"] == pytest.approx(flops / seconds / 1e12, rel=1e-9)
    assert 0 < m["mfu"] and 0.05 < m["peak_rss_gb"] < 64

"""trainer.activation_checkpointing=auto: the per-rank memory estimate against peaks measured on
H200s (random weights, BENCHMARKS "Trainer throughput"), and what resolve picks from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_cli.config.memory_plan import GIB, Layout, choose, estimate_bytes
from areal_cli.config.resolve import Placement
from areal_cli.runconfig.autos import resolve
from areal_cli.runconfig.compose import compose

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
Q7, Q15 = MODELS / "qwen2.5-7b-instruct", MODELS / "qwen2.5-1.5b-instruct"


def test_layouts_count_the_published_parameters():
    assert abs(Layout.from_config(Q7).params - 7.62e9) / 7.62e9 < 0.01
    # tied embeddings counted once
    assert abs(Layout.from_config(Q15).params - 1.54e9) / 1.54e9 < 0.01


def test_moe_layouts_count_every_expert_and_activate_top_k():
    # the random-weights build of Qwen3-30B-A3B held 30,532,122,624; OLMoE-1B-7B: 6.92B published
    q30, olmoe = Layout.from_config(MODELS / "qwen3-30b-a3b"), Layout.from_config(
        MODELS / "olmoe-1b-7b-0924")
    assert abs(q30.params - 30.532e9) / 30.532e9 < 0.001
    assert abs(olmoe.params - 6.919e9) / 6.919e9 < 0.001
    assert q30.intermediate == 8 * 768 and olmoe.intermediate == 8 * 1024  # a token's experts


# (layout, ranks, micro_batch_tokens, every, AdamW moment bytes, output chunk, measured peak GiB)
MEASURED = [
    (Q7, 3, 8256, None, 8, 4096, 85.6),
    (Q7, 3, 16512, 2, 8, 4096, 87.4),
    (Q15, 1, 25344, None, 8, 4096, 82.0),
    (Q15, 1, 16896, None, 8, 4096, 64.9),
    (Q15, 1, 33792, None, 8, 2048, 95.4),
    (Q15, 1, 33792, 2, 8, 2048, 63.0),
    (Q7, 1, 32896, 1, 4, 256, 105.6),
]


@pytest.mark.parametrize("path, ranks, mbt, every, moments, chunk, peak", MEASURED)
def test_the_estimate_is_above_each_measured_peak_and_not_far(path, ranks, mbt, every, moments,
                                                              chunk, peak):
    est = estimate_bytes(Layout.from_config(path), ranks=ranks, micro_batch_tokens=mbt, every=every,
                         moments_bytes=moments, lora=False, staged=False, chunk=chunk) / GIB
    assert peak <= est <= 1.3 * peak, (est, peak)


def test_choose_takes_the_least_recomputation_that_fits():
    lay = Layout.from_config(Q7)
    kw = dict(ranks=3, moments_bytes=8, lora=False, staged=True, chunk=2048)
    assert choose(lay, 150 * 10**9, micro_batch_tokens=8704, **kw)[0] is None
    assert choose(lay, 150 * 10**9, micro_batch_tokens=16384, **kw)[0] == 2
    assert choose(lay, 80 * 10**9, micro_batch_tokens=16384, **kw)[0] == 1
    # nothing fits: the least memory
    assert choose(lay, 10 * 10**9, micro_batch_tokens=16384, **kw)[0] == 1


def resolved(*over, mem=150 * 10**9, model=Q7, gpu=True):
    cfg = compose(["engine=vllm", "trainer.batch_size=12", *over])
    return resolve(cfg, Placement(trainer_gpu=gpu, model_path=model, gpu_memory_bytes=mem)).trainer


def test_auto_resolves_per_card_and_layout():
    t = resolved("trainer.ranks=3", "trainer.micro_batch_tokens=8704")
    assert (t.activation_checkpointing, t.checkpoint_every) == ("false", 1)
    t = resolved("trainer.ranks=3", "trainer.micro_batch_tokens=16384")
    assert (t.activation_checkpointing, t.checkpoint_every) == ("true", 2)
    t = resolved("trainer.ranks=2", "trainer.micro_batch_tokens=16384", mem=80 * 10**9)
    assert (t.activation_checkpointing, t.checkpoint_every) == ("true", 1)


def test_auto_checkpoints_every_layer_where_card_or_layout_is_unknown(tmp_path):
    assert resolved(gpu=False).activation_checkpointing == "true"  # the CPU
    assert resolved(mem=0).activation_checkpointing == "true"  # a plan for other nodes
    (tmp_path / "config.json").write_text('{"model_type": "llama", "architectures": '
                                          '["LlamaForCausalLM"]}')
    assert resolved(model=tmp_path).activation_checkpointing == "true"  # a config without the sizes
    t = resolved("trainer.activation_checkpointing=false", mem=10**9)
    assert t.activation_checkpointing == "false"  # asked for: kept


def test_lora_and_bf16_moments_need_less():
    lay = Layout.from_config(Q7)
    kw = dict(ranks=1, micro_batch_tokens=16384, every=1, staged=False, chunk=2048)
    full = estimate_bytes(lay, moments_bytes=8, lora=False, **kw)
    assert estimate_bytes(lay, moments_bytes=4, lora=False, **kw) < full
    assert estimate_bytes(lay, moments_bytes=8, lora=True, **kw) < full / 2
    # LoRA's frozen weights in the compute dtype: half of float32's
    lora32 = estimate_bytes(lay, moments_bytes=8, lora=True, frozen_bytes=4, **kw)
    lora16 = estimate_bytes(lay, moments_bytes=8, lora=True, **kw)
    assert lora32 - lora16 == pytest.approx(2 * lay.params, rel=1e-6)


def test_adapters_on_the_experts_count_their_states_and_merged_weights():
    """trainer.lora.target_experts: rank-16 adapters on Qwen3-30B-A3B's 18,432 experts are 0.63B
    float32 parameters with gradients and moments (~10 GB), and each kept layer holds its experts
    merged for the grouped GEMM's backward."""
    q30 = Layout.from_config(MODELS / "qwen3-30b-a3b")
    assert q30.expert_params == 48 * 128 * 3 * 2048 * 768
    assert q30.expert_io * 16 == 48 * 128 * 16 * (3 * 768 + 2 * 2048)
    kw = dict(ranks=1, micro_batch_tokens=4096, every=1, staged=False, chunk=2048,
              moments_bytes=8, lora=True)
    more = estimate_bytes(q30, expert_rank=16, **kw) - estimate_bytes(q30, **kw)
    adapters = q30.expert_io * 16 * (4 + 4 + 8)
    merged = q30.expert_params * 2 * 1 / 48  # checkpointing every layer: the one recomputed
    assert more == pytest.approx(adapters + merged, rel=1e-6)

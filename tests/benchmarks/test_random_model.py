"""The shipped architecture configs (parameter counts derived by hand from the published numbers)
and benchmarks/random_model.py building a random checkpoint that areal can load."""

from __future__ import annotations

import json

import pytest
import torch

from areal_cli.architectures import check_supported
from benchmarks.random_model import MODELS, build


def dense_params(vocab, d, ff, layers, heads, kv_heads, tied, qkv_bias):
    """Embedding (+ untied head) + per layer: q, k, v (+ biases), o, gate/up/down, two norms; final
    norm."""
    hd = d // heads
    attn = d * d + 2 * d * kv_heads * hd + d * d + (d + 2 * kv_heads * hd if qkv_bias else 0)
    layer = attn + 3 * d * ff + 2 * d
    return vocab * d * (1 if tied else 2) + layers * layer + d


def moe_params(vocab, d, experts, moe_ff, layers, heads, kv_heads, head_dim, qk_norm):
    """Untied embedding and head + per layer: q, k, v, o, the q/k norms (OLMoE's over all heads,
    Qwen3's per head), every expert's gate/up/down, the router, two norms; final norm."""
    attn = d * heads * head_dim * 2 + 2 * d * kv_heads * head_dim
    norms = {"all_heads": (heads + kv_heads) * head_dim, "per_head": 2 * head_dim}[qk_norm]
    layer = attn + norms + experts * 3 * d * moe_ff + experts * d + 2 * d
    return 2 * vocab * d + layers * layer + d


@pytest.mark.parametrize("name,want", [
    # 1,543,714,304 = Qwen2.5-1.5B's published 1.54B
    ("qwen2.5-1.5b-instruct", dense_params(151936, 1536, 8960, 28, 12, 2, True, True)),
    # 7,615,616,512 = Qwen2.5-7B's published 7.61B
    ("qwen2.5-7b-instruct", dense_params(152064, 3584, 18944, 28, 28, 4, False, True)),
    # 8,030,261,248 = Llama-3.1-8B's published 8.03B
    ("llama-3.1-8b-instruct", dense_params(128256, 4096, 14336, 32, 32, 8, False, False)),
    # 6,919,161,856 = OLMoE-1B-7B's published 6.9B (64 experts of 1024, top-8)
    ("olmoe-1b-7b-0924", moe_params(50304, 2048, 64, 1024, 16, 16, 16, 128, "all_heads")),
    # 30,532,122,624 = Qwen3-30B-A3B's published 30.5B (128 experts of 768, top-8)
    ("qwen3-30b-a3b", moe_params(151936, 2048, 128, 768, 48, 32, 4, 128, "per_head")),
])
def test_shipped_configs_have_the_published_sizes(name, want):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(MODELS / name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == want
    check_supported(MODELS / name, name)  # a layout the trainer and the weight update handle


def test_layers_keeps_the_layout_with_fewer_decoder_layers(tmp_path, tiny_model):
    from transformers import AutoConfig

    small = dict(json.loads((MODELS / "olmoe-1b-7b-0924" / "config.json").read_text()),
                 hidden_size=32, intermediate_size=16, num_attention_heads=4, num_key_value_heads=4)
    (tmp_path / "arch").mkdir()
    (tmp_path / "arch" / "config.json").write_text(json.dumps(small))
    info = build(str(tmp_path / "arch"), tmp_path / "rand", tokenizer=tiny_model, layers=2)
    config = AutoConfig.from_pretrained(tmp_path / "rand")
    assert info["layers"] == config.num_hidden_layers == 2
    assert (config.num_experts, config.num_experts_per_tok) == (64, 8)  # the layout's own


def test_random_checkpoint_keeps_the_real_vocab_and_loads(tmp_path, tiny_model):
    from transformers import AutoModelForCausalLM

    small = dict(json.loads((MODELS / "qwen2.5-1.5b-instruct" / "config.json").read_text()),
                 hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
    (tmp_path / "arch").mkdir()
    (tmp_path / "arch" / "config.json").write_text(json.dumps(small))
    out = tmp_path / "rand"
    info = build(str(tmp_path / "arch"), out, tokenizer=tiny_model)
    assert info["vocab_size"] == 151936 and info["tokenizer_ids"] == 49152
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16 and model.config.eos_token_id == 2  # the tokenizer's EOS
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 151936)
    assert build(str(tmp_path / "arch"), out, tokenizer=tiny_model) == info  # built once
    # no all-zero embedding row (transformers zeroes the pad token's, id 2), unless asked to keep it
    rows = model.get_input_embeddings().weight.float().norm(dim=1)
    assert info["zero_rows_filled"] == [2] and float(rows.min()) > 0.5 * float(rows.median())
    kept = build(str(tmp_path / "arch"), tmp_path / "kept", tokenizer=tiny_model,
                 keep_zero_pad_row=True)
    assert kept["zero_rows_filled"] == []
    kept_model = AutoModelForCausalLM.from_pretrained(tmp_path / "kept")
    zero = kept_model.get_input_embeddings().weight.float().norm(dim=1)
    assert (zero == 0).nonzero().flatten().tolist() == [2]

"""benchmarks/moefy.py: the default model as a Mixtral-layout MoE of its own MLP neurons."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def moefy():
    spec = importlib.util.spec_from_file_location("moefy", ROOT / "benchmarks" / "moefy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["moefy"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dense():
    from transformers import AutoModelForCausalLM

    from areal_cli.model_source import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m-instruct"),
                                                dtype=torch.float32).eval()


def test_every_expert_kept_is_the_dense_model(moefy, dense, tmp_path):
    """With all 8 experts a token (equal weights: a zero router) the MoE computes the dense model;
    keeping 7 of 8 it no longer does, and the checkpoint is a layout `areal train` accepts."""
    from transformers import AutoModelForCausalLM

    from areal_cli import moe

    layers = dense.config.num_hidden_layers
    groups = [list(torch.arange(1536).reshape(8, 192)) for _ in range(layers)]
    zero = [torch.zeros(8, 576) for _ in range(layers)]
    ids = torch.tensor([[1, 9690, 198, 504, 30, 2521, 77, 4102, 12, 28, 1848]])
    with torch.no_grad():
        want = dense(ids).logits
        every = moefy.assemble(dense, groups, zero, top_k=8)
        assert (every(ids).logits - want).abs().max() < 1e-3
        seven = moefy.assemble(dense, groups, zero, top_k=7)
        assert (seven(ids).logits - want).abs().max() > 0.1
    seven.save_pretrained(tmp_path)
    assert moe.is_moe(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path, **moe.load_kwargs(tmp_path))
    with torch.no_grad():
        assert torch.allclose(again(ids).logits, seven(ids).logits, atol=1e-4)


def test_balanced_kmeans_gives_equal_groups(moefy):
    rows = torch.randn(96, 16)
    assign = moefy.balanced_kmeans(rows, 8, iters=3)
    assert torch.bincount(assign, minlength=8).tolist() == [12] * 8

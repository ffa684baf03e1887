"""A token whose embedding row is all zero, at the start of a sequence, is named before it turns the
gradient to NaN: ``build_policy`` records such rows, the trainer warns once per token id."""

from __future__ import annotations

import numpy as np
import torch
from helpers import init_gloo, make_batch, plain_model

from areal_cli.model_source import resolve_model
from areal_cli.trainer.model import build_policy, zero_embedding_rows, zero_row_starts

CPU = torch.device("cpu")


def test_the_pad_row_of_a_from_config_model_is_found_and_a_real_model_has_none(tiny_model):
    init_gloo()
    model = build_policy(tiny_model, CPU, torch.float32, activation_checkpointing=False)
    assert model.zero_embedding_rows == {2}  # SmolLM2's pad token: transformers zeroes its row
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m-instruct"))
    assert zero_embedding_rows(real) == frozenset()


def test_sequences_starting_with_a_zero_row_are_counted_by_token(tiny_model):
    b = make_batch(plain_model(tiny_model), groups=3, group_size=2, seed=1)
    assert zero_row_starts(b, frozenset({2})) == {}
    for s in b.groups[1].samples:
        s.prompt_ids = np.concatenate([[2], s.prompt_ids]).astype(np.int32)
    b.groups[2].samples[0].prompt_ids[-1] = 2  # not at the start: its hidden state is not zero
    assert zero_row_starts(b, frozenset({2, 7})) == {2: 2}

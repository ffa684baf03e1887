"""The final checkpoint holds the trained weights exactly and loads with from_pretrained; it is
written without a second in-memory copy of the model (the plain model takes the live tensors)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from areal_cli.model_source import resolve_model
from areal_cli.trainer.model import build_policy, save_hf


def test_final_checkpoint_round_trips_the_trained_weights(tmp_path):
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    path = resolve_model("smollm2-135m-instruct")
    model = build_policy(path, torch.device("cpu"), torch.bfloat16, True)
    with torch.no_grad():
        for p in list(model.parameters())[:3]:
            p.add_(0.25)  # "trained"
    save_hf(model, path, tmp_path / "final")
    assert (tmp_path / "final" / "COMPLETE").exists() and not (tmp_path / "final.partial").exists()
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "final", dtype=torch.float32).state_dict()
    live = model.state_dict()
    assert set(live) <= set(back)
    assert all(torch.equal(live[k], back[k]) for k in live)
    assert all(p.device.type == "cpu" for p in model.parameters())  # the live model is untouched

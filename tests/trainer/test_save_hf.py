"""The final checkpoint holds the trained weights exactly and loads with from_pretrained; it is
written without a second in-memory copy of the model (the plain model takes the live tensors)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from conftest import perturb, tiny_moe
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
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "final",
                                                dtype=torch.float32).state_dict()
    live = model.state_dict()
    assert set(live) <= set(back)
    assert all(torch.equal(live[k], back[k]) for k in live)
    assert all(p.device.type == "cpu" for p in model.parameters())  # the live model is untouched


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral", "olmoe", "qwen2_moe"])
def test_a_layer_at_a_time_in_the_checkpoints_own_names(kind, tmp_path):
    """An MoE is saved a decoder layer at a time into many small files: the names are those of the
    checkpoint it came from (per-expert matrices, Mixtral's ``block_sparse_moe``, which vLLM loads),
    not transformers 5's fused ones, and from_pretrained gives back the trained weights."""
    import json

    from safetensors import safe_open

    from areal_cli.config.schema import LoraConfig
    from areal_cli.lora import adapter_items

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    src = tiny_moe(tmp_path / "src", kind)

    def names(path):
        out = set()
        for f in path.glob("*.safetensors"):
            with safe_open(str(f), "pt") as h:
                out |= set(h.keys())
        return out

    model = build_policy(src, torch.device("cpu"), torch.float32, False)
    perturb(model, 0.1)
    save_hf(model, src, tmp_path / "final", shard_bytes=64 << 10)
    files = sorted((tmp_path / "final").glob("model-*.safetensors"))
    assert len(files) >= 3  # one layer at a time: a file per layer at least, and the rest
    index = json.loads((tmp_path / "final" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {f.name for f in files}
    assert names(tmp_path / "final") == names(src) == set(index["weight_map"])
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "final", dtype=torch.float32)
    live = model.state_dict()
    for k, v in back.state_dict().items():
        assert torch.equal(v, live[k]), k

    # with LoRA: the adapter is there, and the merged model in the same names
    lo = LoraConfig(rank=4)
    adapted = build_policy(src, torch.device("cpu"), torch.float32, False, lora=lo)
    with torch.no_grad():
        for _, t in adapter_items(adapted.named_parameters()):
            t.normal_(0, 0.1)
    save_hf(adapted, src, tmp_path / "lora", lora=lo, shard_bytes=64 << 10)
    assert (tmp_path / "lora" / "adapter" / "adapter_model.safetensors").is_file()
    assert names(tmp_path / "lora") == names(src)


def test_lora_without_the_merged_copy_writes_the_adapter_alone(tmp_path):
    """trainer.lora.merged_checkpoint=false: the final checkpoint is adapter/ (peft loads it onto
    the base model), no model files; a run that would evaluate it is refused up front."""
    from peft import PeftModel

    from areal_cli.config.read import ConfigError
    from areal_cli.config.schema import LoraConfig
    from areal_cli.lora import adapter_items
    from areal_cli.runconfig.compose import compose

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    src = tiny_moe(tmp_path / "src", "qwen3_moe")
    lo = LoraConfig(rank=4, merged_checkpoint=False)
    adapted = build_policy(src, torch.device("cpu"), torch.float32, False, lora=lo)
    with torch.no_grad():
        for _, t in adapter_items(adapted.named_parameters()):
            t.normal_(0, 0.1)
    save_hf(adapted, src, tmp_path / "final", lora=lo)
    out = tmp_path / "final"
    assert (out / "COMPLETE").is_file() and not list(out.glob("*.safetensors"))
    base = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, out / "adapter")
    ids = torch.tensor([[5, 17, 300, 42]])
    adapted.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, adapted(input_ids=ids).logits,
                                   atol=1e-4, rtol=1e-4)
    with pytest.raises(ConfigError, match="eval.at_end=false eval.every=0"):
        compose([f"model={src}", "trainer.lora.rank=4", "trainer.lora.merged_checkpoint=false"])
    compose([f"model={src}", "trainer.lora.rank=4", "trainer.lora.merged_checkpoint=false",
             "eval.at_end=false"])

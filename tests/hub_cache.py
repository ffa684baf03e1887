"""A local Hugging Face Hub cache for tests (``HF_HUB_CACHE=<dir>``): tiny random models of each
supported layout with SmolLM2's real tokenizer, laid out as huggingface_hub lays out a download
(``models--Org--Name/refs/main`` → ``snapshots/<commit>/``), so resolution runs offline for real."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
            tie_word_embeddings=True)


def commit_of(repo_id: str) -> str:
    return hashlib.sha1(repo_id.encode()).hexdigest()  # 40 hex digits, like a git commit


def snapshot(cache: Path, repo_id: str) -> Path:
    """The snapshot folder of ``repo_id`` at ``main`` (created empty, with refs/main)."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit_of(repo_id))
    snap = folder / "snapshots" / commit_of(repo_id)
    snap.mkdir(parents=True, exist_ok=True)
    return snap


def add_model(cache: Path, repo_id: str, model_type: str, tokenizer_src: Path) -> Path:
    """A tiny random ``model_type`` ("llama", "qwen2", "qwen3") saved with save_pretrained."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    extra = {"head_dim": 16} if model_type == "qwen3" else {}
    config = AutoConfig.for_model(model_type, **TINY, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    snap = snapshot(cache, repo_id)
    model.save_pretrained(snap)
    AutoTokenizer.from_pretrained(tokenizer_src).save_pretrained(snap)
    return snap


def add_config_only(cache: Path, repo_id: str, config: dict, weights_from: Path) -> Path:
    """A repository whose config.json is ``config`` (weights and tokenizer copied from another
    snapshot): enough for the architecture check, which reads config.json alone."""
    snap = snapshot(cache, repo_id)
    for f in weights_from.iterdir():
        if f.name != "config.json":
            shutil.copy(f, snap / f.name)
    (snap / "config.json").write_text(json.dumps(config))
    return snap

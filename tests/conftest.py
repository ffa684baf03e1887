"""Shared fixtures: a tiny random-weight Llama with SmolLM2's real tokenizer (fast), and
helpers to run ``areal train`` for real (subprocesses, ZeroMQ on loopback, gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AREAL = [sys.executable, "-m", "areal_cli.cli"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """2 layers, hidden 64: SmolLM2's architecture and tokenizer, random weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from areal_cli.model_source import resolve_model

    base = resolve_model("smollm2-135m-instruct")
    cfg = AutoConfig.from_pretrained(base)
    cfg.update(dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    out = tmp_path_factory.mktemp("tiny") / "tiny-smollm2"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


@pytest.fixture(autouse=True)
def _keep_pytests_signal_handlers():
    """A test that builds a Controller in this process gets its SIGINT/SIGTERM handlers installed
    here: pytest's go back after it, or Ctrl-C (and CI's ``timeout --signal=INT``) would no
    longer stop the suite."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


TINY_RUN = ["trainer.batch_size=2", "rollout.group_size=2", "rollout.max_new_tokens=12",
            "trainer.micro_batch_tokens=2048", "task.size=64", "reward.workers=1",
            "launcher.peer_timeout_s=60", "engine.dtype=float32"]


def free_port() -> int:
    """A TCP port free on loopback now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_train(run_dir: Path, *overrides: str, timeout: float = 240, check: bool = True):
    if not any(o.startswith("eval.at_end=") for o in overrides):
        # the closing evaluation only where a test asks
        overrides = ("eval.at_end=false", *overrides)
    cmd = AREAL + ["train", "--quiet", f"run_dir={run_dir}", *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if check and proc.returncode != 0:
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                         for p in sorted(run_dir.glob("logs/*.log")))
        raise AssertionError("areal train failed "
                             f"({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{logs}")
    return proc



def tiny_classifier(out: Path, num_labels: int) -> Path:
    """A sequence-classification reward model: SmolLM2's tokenizer, 2 layers of random weights,
    ``num_labels`` outputs (named l0, l1, ... when more than one)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from areal_cli.model_source import resolve_model

    base = resolve_model("smollm2-135m-instruct")
    cfg = AutoConfig.from_pretrained(base)
    cfg.update(dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    num_labels=num_labels))
    if num_labels > 1:
        cfg.id2label = {i: f"l{i}" for i in range(num_labels)}
        cfg.label2id = {v: k for k, v in cfg.id2label.items()}
    torch.manual_seed(1)
    AutoModelForSequenceClassification.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


MOE_CONFIGS = {"qwen3_moe": "Qwen3MoeConfig", "qwen2_moe": "Qwen2MoeConfig",
               "olmoe": "OlmoeConfig", "mixtral": "MixtralConfig"}


def tiny_moe(out: Path, kind: str = "qwen3_moe", experts: int = 8, seed: int = 0) -> Path:
    """A mixture-of-experts causal LM of ``kind``'s real config class: 2 layers, hidden 64,
    ``experts`` experts of inner size 32, top-2, SmolLM2's tokenizer, random weights."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_cli.model_source import resolve_model

    if (out / "config.json").is_file():
        return out
    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    n = {"num_local_experts" if kind == "mixtral" else "num_experts": experts}
    extra = dict(shared_expert_intermediate_size=48) if kind == "qwen2_moe" else {}
    cfg = getattr(transformers, MOE_CONFIGS[kind])(
        vocab_size=len(tok), hidden_size=64, intermediate_size=32, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts_per_tok=2, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=kind not in ("olmoe", "mixtral"),
        **n, **extra)
    # (vLLM's OLMoE keeps its own lm_head whatever the config says, as every OLMoE checkpoint does;
    # so do Mixtral's checkpoints)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # routers transformers starts at zero would tie every expert
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 0.5)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_moe_model(tmp_path_factory) -> Path:
    """The Qwen3-MoE layout of ``tiny_moe``."""
    return tiny_moe(tmp_path_factory.mktemp("moe") / "tiny-qwen3-moe")


@pytest.fixture(scope="session")
def tiny_reward_model(tmp_path_factory) -> Path:
    """A one-output sequence-classification reward model with random weights."""
    return tiny_classifier(tmp_path_factory.mktemp("rm") / "tiny-rm", 1)

def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture
def keys(tmp_path):
    """A run's CURVE keys (tests of real sockets on loopback)."""
    from areal_cli.transport.auth import load_keys, make_keys

    make_keys(tmp_path)
    return load_keys(tmp_path)


@pytest.fixture
def gate(keys):
    """The controller's gatekeeper: one ZAP handler per ZeroMQ context, stopped after the test."""
    import logging

    from areal_cli.transport.auth import Gatekeeper

    g = Gatekeeper(keys, logging.getLogger("test.gate"))
    yield g
    g.stop()


def drive_workflow(flow, engine, timeout_s: float) -> list:
    """Feed ``engine``'s generated sequences to ``flow`` until it yields finished groups (or time
    runs out); the groups it yielded."""
    import time

    results, deadline = [], time.monotonic() + timeout_s
    while not results and time.monotonic() < deadline:
        for seq in engine.poll(0.05):
            flow.on_generated(seq)
        results = flow.poll()
    return results


def perturb(model, scale: float) -> None:
    """Add gaussian noise of ``scale`` to every parameter of ``model`` in place (torch's global
    generator: seed it first for a repeatable copy): new weights for an update."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)


def hf_engine(path, *, temperature: float = 1.0, eos_token_id=2, sequences: int = 8,
              context: int = 0,
              weights=None, index: int = 0, routing: bool = False, **engine):
    """An hf engine on the CPU from ``make_engine`` (the factory every caller uses): float32, 512
    tokens a forward, a 4096-token KV cache of 32-token pages unless ``engine`` says otherwise; its
    ``auto`` values resolved once here, as a planned run's are; ``routing``: an MoE's experts
    recorded per token (``EngineSetup.routing``); ``cpu_batching`` goes to ``engine.hf``."""
    from areal_cli.config.engine import HFConfig
    from areal_cli.config.schema import EngineConfig
    from areal_cli.engines.base import EngineSetup, Sampling
    from areal_cli.engines.factory import make_engine
    from areal_cli.runconfig.autos import resolve_engine

    hf = HFConfig(**{k: engine.pop(k) for k in ("cpu_batching",) if k in engine})
    fields = dict(dtype="float32", max_batch_tokens=512, kv_cache_tokens=4096,
                  page_size=32) | engine
    e = resolve_engine(EngineConfig(name="hf", hf=hf, **fields), updates=weights is not None)
    return make_engine(EngineSetup(e, path, eos_token_id, Sampling(temperature),
                                   sequences=sequences, context=context, index=index, device="cpu",
                                   weights=weights, routing=routing))


def pytest_collection_modifyitems(items):
    """tests/gpu/ carries the ``gpu`` marker and skips where torch sees no GPU."""
    import torch

    gpu = torch.cuda.is_available()
    for item in items:
        if "/tests/gpu/" in str(item.path):
            item.add_marker(pytest.mark.gpu)
            if not gpu:
                item.add_marker(pytest.mark.skip(reason="needs a GPU"))

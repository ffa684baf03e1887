"""The pause of a LoRA weight update into the embedded (hf) engine, both ways: the adapter alone (the
default: received, merged into the engine's weights, verified by the probe) and ``engine.lora_merge=true``
(the trainer merges, the full weights cross the broadcast and load in place).

    python benchmarks/lora_update.py [--rank 16] [--updates 5]

One process, two threads (trainer rank 0's sender and the rollout worker's engine), gloo on loopback,
the default model (SmolLM2-135M) in bf16 on the engine and float32 with adapters on the trainer. Each
update moves every B by a small random step. It prints per path the trainer's prepare + broadcast time
and the engine's update (its pause without generation in flight), median over ``updates``, and the
parts of the engine's time.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from areal_cli import lora  # noqa: E402
from areal_cli.engines.base import EngineSetup, Sampling, WeightSource  # noqa: E402
from areal_cli.engines.factory import make_engine, make_sender  # noqa: E402
from areal_cli.model_source import resolve_model  # noqa: E402
from areal_cli.runconfig.autos import resolve  # noqa: E402
from areal_cli.runconfig.compose import compose  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def items(model, cfg):
    if lora.sends_adapter(cfg):
        return lora.adapter_items(iter(model.named_parameters()))
    return lora.merged_items(iter(model.named_parameters()), lora.scale(cfg.trainer.lora))


def run(merge: bool, rank: int, updates: int) -> dict:
    from transformers import AutoModelForCausalLM

    cfg = resolve(compose([f"trainer.lora.rank={rank}", f"engine.lora_merge={str(merge).lower()}"]))
    path = resolve_model(cfg.model)
    trainer = lora.inject(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), cfg.trainer.lora)
    port, box = free_port(), {}
    setup = EngineSetup(cfg.engine, path, 2, Sampling(1.0), sequences=8, context=256, device="cpu",
                        weights=WeightSource(cfg, "127.0.0.1", port))
    t = threading.Thread(target=lambda: box.setdefault("eng", make_engine(setup)))
    t.start()
    tx = make_sender(cfg, "127.0.0.1", port, trainer, torch.device("cpu"))
    t.join()
    eng = box["eng"]
    sent, got = [], []
    try:
        for v in range(1, updates + 1):
            with torch.no_grad():
                for n, p in trainer.named_parameters():
                    if "lora_B" in n:
                        p.add_(torch.randn_like(p) * 1e-3)
            out: dict = {}
            th = threading.Thread(target=lambda v=v, out=out: out.update(eng.update_weights(v)))
            t0 = time.perf_counter()
            th.start()
            tx.prepare(items(trainer, cfg))
            tx.broadcast()
            sent.append(time.perf_counter() - t0)
            th.join()
            got.append(out)
    finally:
        eng.close()
        tx.close()
    keys = [k for k in got[0] if k.endswith("_s") and isinstance(got[0][k], float)]
    return {"trainer_s": statistics.median(sent), **{k: statistics.median(g[k] for g in got) for k in keys}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--updates", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    for merge in (False, True):
        r = run(merge, a.rank, a.updates)
        name = "engine.lora_merge=true (full weights)" if merge else "adapter (default)"
        parts = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in r.items() if k not in ("trainer_s", "pause_s"))
        print(f"{name}: engine pause {r['pause_s'] * 1000:.0f} ms, trainer prepare+broadcast "
              f"{r['trainer_s'] * 1000:.0f} ms ({parts})")


if __name__ == "__main__":
    main()

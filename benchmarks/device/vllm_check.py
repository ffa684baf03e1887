"""On 2 GPUs: the project's vLLM engine + weight transfer, checked and timed (prints JSON).

    python3 benchmarks/device/vllm_check.py MODEL_DIR OUT.json

1. ``VLLMEngine`` on GPU 0, a "trainer" (transformers, fp32) on GPU 1 in a thread; the weights
   are perturbed on the trainer and sent with ``VLLMWeightSender`` → ``VLLMWeightReceiver``
   *while 64 sequences are generating* (abort, update, re-prefill, resume).
2. Logprob agreement: the engine's behaviour logprobs of the tokens made under the new
   weights vs a trainer recomputation (log_softmax(logits / T) of a bf16 and an fp32 forward
   of the same weights), at T = 1 and at T = 0.7 (where raw logprobs would be wrong).
3. Decode throughput through the Engine interface: vLLM vs the embedded hf engine (GPU 1).
"""

from __future__ import annotations

import json
import sys
import threading
import time

import torch

from areal_cli.config.schema import RootConfig
from areal_cli.rollout.engines.base import Sequence
from areal_cli.rollout.engines.vllm import VLLMEngine
from areal_cli.transport.vllm_weights import VLLMWeightReceiver, VLLMWeightSender, wire_spec

TOPICS = ["a lighthouse", "prime numbers", "a lost key", "the ocean", "a robot", "autumn", "bread",
          "a chess game", "rain", "a mountain", "a library", "trains", "bees", "the moon", "a bridge", "jazz"]


def prompts(tok, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        msg = [{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]} ({i})."}]
        out.append(tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=True, return_dict=False))
    return out


def on_gpu1(fn):
    """A thread target that runs ``fn`` with GPU 1 current (the current device is per thread)."""
    def run():
        torch.cuda.set_device(1)
        fn()
    return threading.Thread(target=run)


def run_all(engine, seqs, update_at_step=None, update=None) -> tuple[list, float, dict]:
    t0, done, steps, timings = time.perf_counter(), [], 0, {}
    for s in seqs:
        engine.submit(s)
    while len(done) < len(seqs):
        done += engine.poll(0.05)
        steps += 1
        if update_at_step is not None and steps == update_at_step:
            timings = update()
    return done, time.perf_counter() - t0, timings


@torch.no_grad()
def recompute(model, seq: Sequence, temperature: float, dtype) -> torch.Tensor:
    ids = torch.tensor([list(seq.prompt_ids) + seq.output_ids], device=model.device)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        logits = model(ids).logits[0, len(seq.prompt_ids) - 1:-1].float()
    lp = torch.log_softmax(logits / temperature, -1)
    return lp.gather(-1, ids[0, len(seq.prompt_ids):, None])[:, 0].cpu()


def agreement(model, done: list, temperature: float, version: int) -> dict:
    diffs = {"bf16": [], "fp32": [], "T1_if_raw": []}
    for s in done:
        mask = torch.tensor([v == version for v in s.versions])
        if not mask.any():
            continue
        got = torch.tensor(s.logprobs)[mask]
        diffs["bf16"].append((recompute(model, s, temperature, torch.bfloat16)[mask] - got).abs())
        diffs["fp32"].append((recompute(model, s, temperature, torch.float32)[mask] - got).abs())
        if temperature != 1.0:
            diffs["T1_if_raw"].append((recompute(model, s, 1.0, torch.float32)[mask] - got).abs())
    out = {"tokens": int(sum(len(d) for d in diffs["bf16"]))}
    for k, v in diffs.items():
        if v:
            cat = torch.cat(v)
            out[f"mean_abs_diff_{k}"], out[f"max_abs_diff_{k}"] = float(cat.mean()), float(cat.max())
    return out


def main() -> None:
    model_dir, out_path = sys.argv[1], sys.argv[2]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = RootConfig()
    cfg.engine.name, cfg.engine.gpu_memory_utilization = "vllm", 0.5
    result = {"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count()}
    t = time.perf_counter()
    engine = VLLMEngine(model_dir, cfg, 0)
    result["vllm_engine_start_s"] = time.perf_counter() - t
    torch.cuda.set_device(1)
    trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to("cuda:1").eval()
    box = {}
    port = 29611
    th = on_gpu1(lambda: box.update(sender=VLLMWeightSender("127.0.0.1", port, 2, torch.bfloat16)))
    th.start()
    receiver = VLLMWeightReceiver(engine.llm, wire_spec(model_dir, torch.bfloat16), "127.0.0.1", port, 1, 2)
    th.join()
    sender = box["sender"]
    torch.manual_seed(0)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(torch.randn_like(p) * p.std() * 0.05)

    def update(version):
        def go():
            th = on_gpu1(lambda: box.update(sent=sender.send(trainer.named_parameters())))
            th.start()
            timings = engine.update_weights(version, receiver.receive)
            th.join()
            return {**timings, **box["sent"]}
        return go

    ps = prompts(tok, 64)
    seqs = [Sequence(f"a{i}", p, 128) for i, p in enumerate(ps)]
    done, _, timings = run_all(engine, seqs, update_at_step=10, update=update(1))
    result["update_during_generation"] = timings
    result["interrupted_sequences_finished"] = sum(s.segments > 1 for s in done)
    result["logprobs_T1"] = agreement(trainer, done, 1.0, 1)
    pauses = []
    for v in range(2, 7):  # pause timings with sequences in flight
        seqs = [Sequence(f"p{v}-{i}", p, 64) for i, p in enumerate(ps)]
        _, _, tm = run_all(engine, seqs, update_at_step=5, update=update(v))
        pauses.append(tm)
    result["update_pauses"] = pauses
    cfg.rollout.temperature = 0.7
    seqs = [Sequence(f"t{i}", p, 128) for i, p in enumerate(ps)]
    done, _, _ = run_all(engine, seqs)
    result["logprobs_T0.7"] = agreement(trainer, done, 0.7, 6)
    cfg.rollout.temperature = 1.0
    big = prompts(tok, 256)
    done, secs, _ = run_all(engine, [Sequence(f"d{i}", p, 256) for i, p in enumerate(big)])
    n = sum(len(s.output_ids) for s in done)
    result["decode_vllm"] = {"sequences": len(done), "tokens": n, "seconds": secs, "tokens_per_s": n / secs}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1), flush=True)
    engine.close()
    trainer.to("cpu")
    from areal_cli.rollout.engines.hf import HFEngine

    hf = HFEngine(model_dir, torch.device("cuda:1"), torch.bfloat16, temperature=1.0, top_p=1.0,
                  max_batch_tokens=8192, kv_cache_tokens=256 * 320, page_size=64, eos_token_id=tok.eos_token_id)
    done, secs, _ = run_all(hf, [Sequence(f"h{i}", p, 256) for i, p in enumerate(big)])
    n = sum(len(s.output_ids) for s in done)
    result["decode_hf"] = {"sequences": len(done), "tokens": n, "seconds": secs, "tokens_per_s": n / secs}
    hf.close()
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1), flush=True)


if __name__ == "__main__":
    main()

"""On 2 GPUs: the project's vLLM engine + weight transfer, checked and timed (prints JSON).

    python3 benchmarks/device/vllm_check.py MODEL_DIR OUT.json [--weight-update reload|inplace]
        [--pause-mode abort|keep] [--lm-head-fp32 auto|true|false] [--dtype bfloat16|float32]

1. The vLLM engine (``make_engine``) on GPU 0, a "trainer" (transformers, fp32) on GPU 1 in a
   thread; the weights are perturbed on the trainer and sent with ``make_sender``'s sender
   (``VLLMWeightSender``) into the engine's own ``update_weights`` (its ``VLLMWeightReceiver``)
   *while 64 sequences are generating* (abort, update, re-prefill, resume).
2. Logprob agreement: the engine's behaviour logprobs of fresh sequences made under the new
   weights vs a trainer recomputation (log_softmax(logits / T)) of the same weights: a bf16
   model with a bf16 head, the same with the float32 head (``trainer.model.float32_head``, what
   the trainer computes with ``engine.lm_head_fp32``), and an fp32 model; T = 1 and T = 0.7.
3. Pause timings of six more updates with 64 sequences in flight.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import torch

from areal_cli.config.resolve import Placement
from areal_cli.config.schema import RootConfig
from areal_cli.engines.base import EngineSetup, Sampling, Sequence, WeightSource
from areal_cli.engines.factory import make_engine, make_sender
from areal_cli.runconfig.autos import resolve

TOPICS = ["a lighthouse", "prime numbers", "a lost key", "the ocean", "a robot", "autumn", "bread",
          "a chess game", "rain", "a mountain", "a library", "trains", "bees", "the moon",
          "a bridge", "jazz"]


def prompts(tok, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        msg = [{"role": "user",
                "content": f"Write a short story about {TOPICS[i % len(TOPICS)]} ({i})."}]
        out.append(tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=True,
                                           return_dict=False))
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
def recompute(model, seq: Sequence, temperature: float) -> torch.Tensor:
    ids = torch.tensor([list(seq.prompt_ids) + seq.output_ids], device=model.device)
    logits = model(ids).logits[0, len(seq.prompt_ids) - 1:-1].float()
    lp = torch.log_softmax(logits / temperature, -1)
    return lp.gather(-1, ids[0, len(seq.prompt_ids):, None])[:, 0].cpu()


def agreement(models: dict, done: list, temperature: float, version: int) -> dict:
    """Mean / max |behaviour logprob − recomputed logprob| over the tokens made under
    ``version``."""
    diffs = {k: [] for k in models}
    for s in done:
        mask = torch.tensor([v == version for v in s.versions])
        if not mask.any():
            continue
        got = torch.tensor(s.logprobs)[mask]
        for k, m in models.items():
            diffs[k].append((recompute(m, s, temperature)[mask] - got).abs())
    out = {"tokens": int(sum(len(d) for d in next(iter(diffs.values()))))}
    for k, v in diffs.items():
        if v:
            cat = torch.cat(v)
            out[f"mean_abs_diff_{k}"], out[f"max_abs_diff_{k}"] = (float(cat.mean()),
                                                                   float(cat.max()))
    return out


def main() -> None:
    import argparse
    import copy

    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--weight-update", default="reload", choices=["reload", "inplace"])
    ap.add_argument("--pause-mode", default="abort", choices=["abort", "keep"])
    ap.add_argument("--lm-head-fp32", default="auto")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="vLLM's dtype (and the wire's)")
    args = ap.parse_args()
    model_dir = args.model_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_cli.trainer.model import float32_head

    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = RootConfig()
    cfg.engine.name, cfg.engine.gpu_memory_utilization = "vllm", 0.5
    cfg.engine.weight_update, cfg.engine.vllm.pause_mode = args.weight_update, args.pause_mode
    cfg.engine.lm_head_fp32, cfg.engine.dtype = args.lm_head_fp32, args.dtype
    # one engine: weight group ranks 0 and 1
    cfg.rollout.workers, cfg.launcher.peer_timeout_s = 1, 600
    # lm_head_fp32=auto: on with vllm
    cfg = resolve(cfg, Placement(trainer_gpu=True, model_path=Path(model_dir)))
    result = {"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
              "args": vars(args)}
    trainer = AutoModelForCausalLM.from_pretrained(model_dir,
                                                   dtype=torch.float32).to("cuda:1").eval()
    box = {}
    port = 29611
    # the engine joins the weight group as it is built: the trainer's end waits for it meanwhile
    th = on_gpu1(lambda: box.update(sender=make_sender(cfg, "127.0.0.1", port, trainer,
                                                       torch.device("cuda:1"))))
    th.start()
    t = time.perf_counter()
    engine = make_engine(EngineSetup(cfg.engine, model_dir, tok.eos_token_id, Sampling(1.0),
                                     sequences=64,
                                     seed=cfg.seed, weights=WeightSource(cfg, "127.0.0.1", port)))
    result["vllm_engine_start_s"] = time.perf_counter() - t  # with joining the weight group
    th.join()
    sender = box["sender"]

    def perturb(seed):
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn_like(p) * p.std() * 0.05)

    def update(version):
        def go():
            # as a run does it: the trainer casts into its wire buffers, then generation pauses
            th = on_gpu1(lambda: box.update(prep=sender.prepare(trainer.named_parameters())))
            th.start()
            th.join()
            th = on_gpu1(lambda: box.update(sent=sender.broadcast()))
            th.start()
            timings = engine.update_weights(version)
            th.join()
            return {**timings, **box["prep"], **box["sent"]}
        return go

    ps = prompts(tok, 64)
    perturb(0)
    seqs = [Sequence(f"a{i}", p, 128) for i, p in enumerate(ps)]
    done, _, timings = run_all(engine, seqs, update_at_step=10, update=update(1))
    result["update_during_generation"] = timings
    result["interrupted_sequences_finished"] = sum(s.segments > 1 for s in done)
    # the trainer's recomputations of the same weights: a bf16 model (as FSDP's bf16 compute),
    # with its standard bf16 head and with the float32 head the trainer uses with lm_head_fp32;
    # and a float32 model
    bf16 = copy.deepcopy(trainer).to(torch.bfloat16)
    bf16_head32 = copy.deepcopy(bf16)
    float32_head(bf16_head32)
    models = {"bf16": bf16, "bf16_fp32head": bf16_head32, "fp32": trainer}
    fresh = [Sequence(f"f{i}", p, 128) for i, p in enumerate(ps)]  # every token under version 1
    done, _, _ = run_all(engine, fresh)
    result["logprobs_T1"] = agreement(models, done, 1.0, 1)
    del bf16, bf16_head32, models
    pauses = []
    for v in range(2, 8):  # pause timings with sequences in flight
        perturb(v)
        seqs = [Sequence(f"p{v}-{i}", p, 64) for i, p in enumerate(ps)]
        _, _, tm = run_all(engine, seqs, update_at_step=5, update=update(v))
        pauses.append(tm)
    result["update_pauses"] = pauses
    result["pause_s_median"] = sorted(p["pause_s"] for p in pauses)[len(pauses) // 2]
    engine.configure(Sampling(0.7), 0)  # the sampling of the requests from now on
    bf16_head32 = copy.deepcopy(trainer).to(torch.bfloat16)
    float32_head(bf16_head32)
    seqs = [Sequence(f"t{i}", p, 128) for i, p in enumerate(ps)]
    done, _, _ = run_all(engine, seqs)
    result["logprobs_T0.7"] = agreement({"bf16_fp32head": bf16_head32, "fp32": trainer}, done, 0.7,
                                        7)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1), flush=True)
    engine.close()


if __name__ == "__main__":
    main()

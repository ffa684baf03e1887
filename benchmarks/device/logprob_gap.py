"""Where vLLM's bf16 behaviour logprobs and the trainer's recomputation part: an ablation.

    python3 benchmarks/device/logprob_gap.py gen MODEL_DIR OUT.pt --variant compiled
    python3 benchmarks/device/logprob_gap.py score MODEL_DIR OUT.json GEN.pt [GEN.pt ...]
    python3 benchmarks/device/logprob_gap.py all MODEL_DIR OUT_DIR [--variants compiled eager ...]

``gen`` samples (T = 1, one GPU) from three prompt families — the ``basic_arithmetic`` and
``arithmetic_long`` tasks' own prompts and free-form stories — with vLLM configured as the
rollout worker configures it (``llm_kwargs``: bf16, float32 head, processed logprobs) plus the
variant's changes, and saves prompts, tokens and behaviour logprobs. ``score`` recomputes the
logprobs of every saved token with several trainer-side forwards of the same bf16 weights and
prints mean / p99 / max |behaviour − recomputed| per family, next to the float32 model's
(the truth both bf16 paths round away from). ``gen`` variant ``hf`` samples with transformers
instead (no vLLM; to check the script on a CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

VLLM_VARIANTS = {
    # what the rollout worker runs: torch.compile (inductor fuses the pointwise ops between
    # GEMMs, so fewer bf16 roundings than an eager forward) and CUDA graphs
    "compiled": ({}, {}),
    # no compile, no CUDA graphs: vLLM's CUDA kernels for norm, activation and rotary
    "eager": ({"enforce_eager": True}, {}),
    # dynamo without inductor and the native (PyTorch) ops: the rounding points of an eager
    # transformers forward, CUDA graphs kept
    "native": ({"compilation_config": {"backend": "eager", "custom_ops": ["none"]}}, {}),
    # FlashAttention 2 instead of 3
    "fa2": ({"attention_config": {"flash_attn_version": 2}}, {}),
    "native_fa2": ({"compilation_config": {"backend": "eager", "custom_ops": ["none"]},
                    "attention_config": {"flash_attn_version": 2}}, {}),
    # vLLM's batch-invariant mode
    "batch_invariant": ({}, {"VLLM_BATCH_INVARIANT": "1"}),
    # float16: 3 more mantissa bits than bfloat16 (the trainer side: the fp16_* recomputations)
    "fp16": ({"dtype": "float16"}, {}),
}
STORIES = ["a lighthouse", "prime numbers", "a lost key", "the ocean", "a robot", "autumn", "bread",
           "a chess game", "rain", "a mountain", "a library", "trains", "bees", "the moon",
           "a bridge", "jazz"]


def families(tok, n: int) -> dict[str, list[list[int]]]:
    from areal_cli.runconfig.compose import compose
    from areal_cli.tasks import load_problems, prompt_ids

    def ids(messages):
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                       return_dict=False)

    out = {}
    for task in ("basic_arithmetic", "arithmetic_long"):
        cfg = compose([f"task={task}"])
        out[task] = [prompt_ids(tok, p, cfg.task) for p in load_problems(cfg.task, "eval")[:n]]
    out["stories"] = [ids([{"role": "user",
                            "content": f"Write a short story about {STORIES[i % 16]} ({i})."}])
                      for i in range(n)]
    return out


def gen(model_dir: str, out: str, variant: str, n: int, max_tokens: int) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    fams = families(tok, n)
    t0 = time.perf_counter()
    if variant == "hf":
        rows = _gen_hf(model_dir, fams, max_tokens)
    else:
        rows = _gen_vllm(model_dir, fams, variant, max_tokens)
    torch.save({"variant": variant, "rows": rows, "gen_s": time.perf_counter() - t0}, out)
    print(f"{variant}: {sum(len(r['out']) for r in rows)} tokens in {time.perf_counter() - t0:.1f} "
          "s", flush=True)


def _gen_vllm(model_dir, fams, variant, max_tokens):
    import vllm

    from areal_cli.config.schema import RootConfig
    from areal_cli.engines.vllm.args import llm_kwargs
    from areal_cli.runconfig.autos import resolve_engine

    cfg = RootConfig()
    cfg.engine.name, cfg.engine.gpu_memory_utilization = "vllm", 0.35
    cfg.engine = resolve_engine(cfg.engine, updates=False)
    kw = llm_kwargs(cfg.engine, cfg.seed, 0)
    kw.pop("weight_transfer_config")
    kw.update(VLLM_VARIANTS[variant][0])
    llm = vllm.LLM(model=model_dir, **kw)
    sp = vllm.SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens, logprobs=0,
                             detokenize=False, seed=0)
    rows = []
    for fam, prompts in fams.items():
        outs = llm.generate([vllm.TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                            use_tqdm=False)
        for p, o in zip(prompts, outs, strict=True):
            c = o.outputs[0]
            lp = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs, strict=True)]
            rows.append({"family": fam, "prompt": list(p), "out": list(c.token_ids), "logp": lp})
    return rows


@torch.no_grad()
def _gen_hf(model_dir, fams, max_tokens):
    from transformers import AutoModelForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
    torch.manual_seed(0)
    rows = []
    for fam, prompts in fams.items():
        for p in prompts:
            o = model.generate(torch.tensor([p], device=dev), do_sample=True, temperature=1.0,
                               top_k=0, top_p=1.0,
                               max_new_tokens=max_tokens, output_logits=True,
                               return_dict_in_generate=True)
            out = o.sequences[0, len(p):]
            lp = [float(torch.log_softmax(lg[0].float(), -1)[t]) for lg,
                  t in zip(o.logits, out, strict=False)]
            rows.append({"family": fam, "prompt": list(p), "out": out.tolist()[:len(lp)],
                         "logp": lp})
    return rows


# ---- trainer-side recomputations -------------------------------------------------------------

def _attention_fns():
    """Custom transformers attention functions: vLLM's FlashAttention (forward only) and
    PyTorch's varlen FlashAttention (has a backward), one unpadded sequence per row."""
    from transformers import AttentionInterface

    def cu(L, dev):
        return torch.tensor([0, L], dtype=torch.int32, device=dev)

    def vllm_fa(module, q, k, v, attention_mask, scaling=None, dropout=0.0, **kw):
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        B, H, L, D = q.shape
        assert B == 1, "one sequence per row"
        qq, kk, vv = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
        o = flash_attn_varlen_func(qq, kk, vv, L, cu(L, q.device), L, cu(L, q.device),
                                   softmax_scale=scaling,
                                   causal=True, fa_version=int(os.environ.get("FA_VERSION", "3")))
        return o[None], None

    def torch_varlen(module, q, k, v, attention_mask, scaling=None, dropout=0.0, **kw):
        from torch.nn.attention.varlen import varlen_attn

        B, H, L, D = q.shape
        assert B == 1, "one sequence per row"
        rep = H // k.shape[1]
        qq, kk, vv = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
        kk, vv = kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)
        c = cu(L, q.device)
        try:
            o = varlen_attn(qq, kk, vv, c, c, L, L, scale=scaling, window_size=(-1, 0))
        except TypeError:
            o = varlen_attn(qq, kk, vv, c, c, L, L, is_causal=True, scale=scaling)
        return o[None], None

    AttentionInterface.register("vllm_fa", vllm_fa)
    AttentionInterface.register("torch_varlen", torch_varlen)


def _load(model_dir, dtype, attn="sdpa", head32=True):
    from transformers import AutoModelForCausalLM

    from areal_cli.trainer.model import float32_head

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype,
                                             attn_implementation=attn).to(dev).eval()
    if head32 and dtype != torch.float32:
        float32_head(m)
    return m


@torch.no_grad()
def _per_sequence(model, rows):
    out = []
    for r in rows:
        ids = torch.tensor([r["prompt"] + r["out"]], device=model.device)
        logits = model(ids).logits[0, len(r["prompt"]) - 1:-1].float()
        lp = torch.log_softmax(logits, -1)
        out.append(lp.gather(-1, ids[0, len(r["prompt"]):, None])[:, 0].cpu())
    return out


@torch.no_grad()
def _trainer_path(model, rows, dtype=torch.bfloat16):
    """The trainer's own route: packed micro-batches (rows of PACKED_ROW_TOKENS_CUDA tokens,
    block-diagonal mask), ``forward`` under bf16 autocast, ``token_logprobs``."""
    from areal_cli.trainer.batching import (
        PACKED_ROW_TOKENS_CUDA,
        Rollouts,
        forward,
        model_inputs,
        token_logprobs,
    )

    L = max(len(r["out"]) for r in rows)
    ro = Rollouts(prompts=[r["prompt"] for r in rows], responses=[r["out"] for r in rows],
                  behav_logp=torch.zeros(len(rows), L),
                  loss_mask=torch.ones(len(rows), L, dtype=torch.bool),
                  rewards=torch.zeros(len(rows)), group_size=1)
    out = []
    for s in range(0, len(rows), 16):
        mb = list(range(s, min(s + 16, len(rows))))
        x = model_inputs(ro, mb, True, device=model.device, row_tokens=PACKED_ROW_TOKENS_CUDA)
        lp, _ = token_logprobs(forward(model, x, dtype), x, 1.0)
        out += [lp[j, :len(rows[i]["out"])].cpu() for j, i in enumerate(mb)]
    return out


def score(model_dir: str, out: str, gens: list[str], only: list[str] | None) -> None:
    data = [torch.load(g) for g in gens]
    rows = [r for d in data for r in d["rows"]]
    _attention_fns()
    bf16, fp16 = torch.bfloat16, torch.float16
    variants = {
        "fp32": lambda: _per_sequence(_load(model_dir, torch.float32), rows),
        "sdpa": lambda: _per_sequence(_load(model_dir, bf16), rows),
        "sdpa_bf16_head": lambda: _per_sequence(_load(model_dir, bf16, head32=False), rows),
        "trainer": lambda: _trainer_path(_load(model_dir, bf16), rows),
        "eager_attn": lambda: _per_sequence(_load(model_dir, bf16, "eager"), rows),
        "torch_varlen": lambda: _per_sequence(_load(model_dir, bf16, "torch_varlen"), rows),
        "vllm_fa": lambda: _per_sequence(_load(model_dir, bf16, "vllm_fa"), rows),
        "compiled": lambda: _per_sequence(torch.compile(_load(model_dir, bf16), dynamic=True),
                                          rows),
        "compiled_vllm_fa": lambda: _per_sequence(torch.compile(_load(model_dir, bf16, "vllm_fa"),
                                                                dynamic=True),
                                                  rows),
        "fp16_sdpa": lambda: _per_sequence(_load(model_dir, fp16), rows),
        "fp16_trainer": lambda: _trainer_path(_load(model_dir, fp16), rows, fp16),
    }
    if torch.cuda.is_available():  # last: it changes the process's matmul settings for good
        def bi():
            from vllm.model_executor.layers.batch_invariant import enable_batch_invariant_mode
            enable_batch_invariant_mode()
            return _per_sequence(_load(model_dir, bf16), rows)
        variants["batch_invariant"] = bi
    recomputed, errors = {}, {}
    for name, fn in variants.items():
        if only and name not in only and name != "fp32":
            continue
        t = time.perf_counter()
        try:
            recomputed[name] = fn()
            print(f"scored {name} in {time.perf_counter() - t:.1f} s", flush=True)
        except Exception as e:  # one variant failing must not cost the others
            errors[name] = f"{type(e).__name__}: {e}"[:300]
            print(f"{name} failed: {errors[name]}", flush=True)
    result = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "errors": errors, "table": []}
    fams = sorted({r["family"] for r in rows})
    start = 0
    for d in data:
        idx = list(range(start, start + len(d["rows"])))
        start += len(d["rows"])
        for fam in fams + ["all"]:
            sel = [i for i in idx if fam == "all" or rows[i]["family"] == fam]
            behav = torch.cat([torch.tensor(rows[i]["logp"]) for i in sel])
            line = {"gen": d["variant"], "family": fam, "tokens": len(behav),
                    "mean_neg_logp": float(-behav.mean())}
            for name, lps in recomputed.items():
                diff = (torch.cat([lps[i] for i in sel]) - behav).abs()
                line[name] = [round(float(diff.mean()), 4), round(float(diff.quantile(0.99)), 3),
                              round(float(diff.max()), 3)]
            if "fp32" in recomputed:  # the trainer-side bf16 paths against the truth
                ref = torch.cat([recomputed["fp32"][i] for i in sel])
                for name in ("sdpa", "trainer", "compiled", "vllm_fa", "compiled_vllm_fa",
                             "fp16_sdpa"):
                    if name in recomputed and d is data[0]:
                        line[f"{name}_vs_fp32"] = round(float((torch.cat([recomputed[name][i]
                                                                          for i in sel])
                                                               - ref).abs().mean()), 4)
            result["table"].append(line)
            print(json.dumps(line), flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["gen", "score", "all"])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("gens", nargs="*")
    ap.add_argument("--variant", default="compiled", choices=[*VLLM_VARIANTS, "hf"])
    ap.add_argument("--variants", nargs="+", default=list(VLLM_VARIANTS))
    ap.add_argument("--score-only", nargs="+", default=None, help="trainer-side variants to run")
    ap.add_argument("--n", type=int, default=64, help="prompts per family")
    ap.add_argument("--max-tokens", type=int, default=256)
    a = ap.parse_args()
    if a.cmd == "gen":
        gen(a.model_dir, a.out, a.variant, a.n, a.max_tokens)
    elif a.cmd == "score":
        score(a.model_dir, a.out, a.gens, a.score_only)
    else:
        os.makedirs(a.out, exist_ok=True)
        paths = []
        for v in a.variants:
            p = os.path.join(a.out, f"gen_{v}.pt")
            env = {**os.environ, **VLLM_VARIANTS.get(v, ({}, {}))[1]}
            rc = subprocess.call([sys.executable, __file__, "gen", a.model_dir, p, "--variant", v,
                                  "--n", str(a.n), "--max-tokens", str(a.max_tokens)], env=env)
            if rc == 0:
                paths.append(p)
            else:
                print(f"gen {v} failed (rc={rc})", flush=True)
        score(a.model_dir, os.path.join(a.out, "gap.json"), paths, a.score_only)


if __name__ == "__main__":
    main()

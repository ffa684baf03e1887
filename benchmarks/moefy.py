"""A mixture-of-experts model made from a trained dense one: the default model (Llama layout) as a
Mixtral-layout MoE whose experts are its own MLP neurons, for measuring what routing does where the
weights are trained (random weights route near ties and give near-uniform outputs; no trained MoE
checkpoint reaches the GPU machines).

    python benchmarks/moefy.py OUT [--model smollm2-135m-instruct] [--experts 8] [--top-k 7]

Each decoder layer's MLP neurons (its gate/up rows and down columns) split into ``--experts``
experts of equal size by a balanced k-means over their gate rows, so that an expert holds neurons
that fire together. The router is fitted by least squares to predict, from the MLP's input, how much
each expert adds (the norm of its output), on the dense model's own greedy answers to training
prompts of the task (``task`` of conf/: the default's basic_arithmetic), then scaled down so that
its scores spread by ``--spread`` (their standard deviation over the experts) and the top-k weights
stay near equal. Mixtral renormalises the top-k weights to a sum of 1, so each expert's down
projection is multiplied by k: a token's MLP output is then the dense one less its unchosen
experts'. Measured on the CPU against the dense model's greedy answers to held-out prompts: keeping
7 experts of 8 (the defaults), the mean |logprob difference| to the dense model was 0.49 and 77% of
the greedy tokens agreed (16 prompts, 201 tokens); on 8 prompts, 6 of 8 gave 0.96 and 73%, and
weights spread by 0.2 instead of 0.01 gave 3.4 and 32% (the experts' sizes then vary by token,
which the dense model never saw).

The experts a token runs depend on its router's scores, and a trained model's logprobs on what its
MLPs add: a flip between the engine and the trainer moves the logprobs as it would in a trained MoE,
not as in a random one. It is not a trained MoE (its router never trained with its experts). Writes
OUT/moefied.json with the layout and, on ``--check`` prompts, the mean |logprob difference| to the
dense model and the share of greedy tokens that agree.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def balanced_kmeans(rows, k: int, iters: int = 10, seed: int = 0):
    """Assignment of ``rows`` [n, d] to ``k`` clusters of n / k rows each (cosine similarity;
    a greedy capacity-constrained assignment each iteration)."""
    import torch

    n = rows.shape[0]
    size = n // k
    x = torch.nn.functional.normalize(rows.detach().float().cpu(), dim=1)
    g = torch.Generator().manual_seed(seed)
    centres = x[torch.randperm(n, generator=g)[:k]].clone()
    assign = torch.zeros(n, dtype=torch.long)
    for _ in range(iters):
        sim = x @ centres.T  # [n, k]
        order = sim.flatten().argsort(descending=True)
        taken, room = [-1] * n, [size] * k
        for flat in order.tolist():
            i, c = divmod(flat, k)
            if taken[i] < 0 and room[c]:
                taken[i] = c
                room[c] -= 1
        assign = torch.tensor(taken)
        for c in range(k):
            centres[c] = torch.nn.functional.normalize(x[assign == c].mean(0), dim=0)
    return assign


def fitting_text(model, tok, n: int, max_new: int, device: str = "cpu") -> list[list[int]]:
    """The dense model's greedy answers to ``n`` training prompts of the default task (prompt +
    answer ids)."""
    import torch

    from areal_cli.runconfig.compose import compose
    from areal_cli.tasks import load_problems, prompt_ids

    cfg = compose([]).task
    out = []
    for p in load_problems(cfg, "train")[:n]:
        ids = torch.tensor([prompt_ids(tok, p, cfg)], device=device)
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id)
        out.append(gen[0].tolist())
    return out


def build(out: Path, model_path: Path, experts: int, top_k: int, spread: float, fit_prompts: int,
          check_prompts: int, device: str = "cpu") -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    marker = out / "moefied.json"
    if marker.is_file():
        return json.loads(marker.read_text())
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(model_path)
    dense = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
    c = dense.config
    if c.model_type != "llama" or c.intermediate_size % experts:
        raise SystemExit(f"{model_path}: a Llama-layout model whose intermediate_size "
                         f"({c.intermediate_size}) the {experts} experts divide is needed")
    texts = fitting_text(dense, tok, fit_prompts, 48, device)
    # each layer's MLP input (after its norm) over the fitting text
    inputs: dict[int, list] = {i: [] for i in range(c.num_hidden_layers)}
    hooks = [layer.mlp.register_forward_pre_hook(
        lambda m, a, i=i: inputs[i].append(a[0].reshape(-1, a[0].shape[-1]).detach()))
        for i, layer in enumerate(dense.model.layers)]
    with torch.no_grad():
        for ids in texts:
            dense(torch.tensor([ids], device=device))
    for h in hooks:
        h.remove()
    groups, routers, fits = [], [], []
    with torch.no_grad():
        for i, d in enumerate(dense.model.layers):
            gate, up, down = d.mlp.gate_proj.weight, d.mlp.up_proj.weight, d.mlp.down_proj.weight
            assign = balanced_kmeans(gate, experts, seed=i)
            g = [(assign == e).nonzero().flatten().to(gate.device) for e in range(experts)]
            x = torch.cat(inputs[i])
            act = torch.nn.functional.silu(x @ gate.T) * (x @ up.T)  # [tokens, inner]
            # each expert's contribution: the norm of its share of the dense MLP output
            y = torch.stack([(act[:, n] @ down[:, n].T).norm(dim=-1) for n in g], dim=1)
            w = torch.linalg.lstsq(x, y).solution.T  # [experts, hidden]
            pred = x @ w.T
            groups.append(g)
            routers.append(w * spread / pred.std(dim=1).mean().clamp_min(1e-6))
            chosen, best = pred.topk(top_k, dim=1).indices, y.topk(top_k, dim=1).indices
            agree = (chosen.sort(1).values == best.sort(1).values).all(1).float().mean()
            fits.append(round(float(agree), 3))
    moe = assemble(dense, groups, routers, top_k)
    report = {"from": str(model_path), "layout": "mixtral", "experts": experts, "top_k": top_k,
              "expert_inner": c.intermediate_size // experts, "spread": spread,
              "fit_tokens": sum(map(len, texts)), "router_top_k_exact_share_per_layer": fits}
    report.update(agreement(dense, moe, tok, check_prompts, device))
    report["build_s"] = round(time.perf_counter() - t0, 1)
    out.mkdir(parents=True, exist_ok=True)
    moe.to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    marker.write_text(json.dumps(report, indent=1))
    return report


def assemble(dense, groups, routers, top_k: int):
    """The Mixtral-layout MoE of ``dense`` (a Llama-layout model): ``groups[i]``, layer i's experts
    as index tensors of its MLP neurons (equal sizes); ``routers[i]``, its router weight
    [experts, hidden]; every other weight copied, the output layer untied."""
    import torch
    from transformers import AutoModelForCausalLM, MixtralConfig

    c = dense.config
    experts = len(groups[0])
    cfg = MixtralConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size // experts, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, rope_parameters=dict(c.rope_parameters),
        num_local_experts=experts, num_experts_per_tok=top_k, bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id, tie_word_embeddings=False,
        sliding_window=None)
    device = dense.get_input_embeddings().weight.device
    moe = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(device)
    sd = {k: v for k, v in dense.state_dict().items() if ".mlp." not in k}
    sd["lm_head.weight"] = dense.get_output_embeddings().weight.detach().clone()  # untied
    missing = [k for k in moe.load_state_dict(sd, strict=False).missing_keys if ".mlp." not in k]
    if missing:
        raise SystemExit(f"the MoE layout has weights the dense model lacks: {missing[:4]}")
    with torch.no_grad():
        for d, m, g, w in zip(dense.model.layers, moe.model.layers, groups, routers, strict=True):
            gate, up, down = d.mlp.gate_proj.weight, d.mlp.up_proj.weight, d.mlp.down_proj.weight
            m.mlp.gate.weight.copy_(w)
            m.mlp.experts.gate_up_proj.copy_(torch.stack([torch.cat([gate[n], up[n]]) for n in g]))
            m.mlp.experts.down_proj.copy_(torch.stack([down[:, n] * top_k for n in g]))
    return moe.eval()


def agreement(dense, moe, tok, n: int, device: str) -> dict:
    """On ``n`` held-out prompts (the eval split) with the dense model's greedy answers: the mean
    |logprob difference| of the MoE to the dense model over the answer tokens, and the share of
    answer positions where both would pick the same greedy token."""
    import torch

    from areal_cli.runconfig.compose import compose
    from areal_cli.tasks import load_problems, prompt_ids

    cfg = compose([]).task
    diffs, same, count = 0.0, 0, 0
    for p in load_problems(cfg, "eval")[:n]:
        ids = torch.tensor([prompt_ids(tok, p, cfg)], device=device)
        with torch.no_grad():
            full = dense.generate(ids, max_new_tokens=32, do_sample=False,
                                  pad_token_id=tok.pad_token_id or tok.eos_token_id)
            a = torch.log_softmax(dense(full).logits[0, ids.shape[1] - 1:-1].float(), -1)
            b = torch.log_softmax(moe(full).logits[0, ids.shape[1] - 1:-1].float(), -1)
        target = full[0, ids.shape[1]:]
        diffs += float((a.gather(1, target[:, None]) - b.gather(1, target[:, None])).abs().sum())
        same += int((a.argmax(-1) == b.argmax(-1)).sum())
        count += len(target)
    return {"check_prompts": n, "check_tokens": count,
            "logp_gap_to_dense": round(diffs / max(count, 1), 4),
            "greedy_agreement_with_dense": round(same / max(count, 1), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="a dense Llama-layout model: a local directory or the default's name")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=7)
    ap.add_argument("--spread", type=float, default=0.01)
    ap.add_argument("--fit-prompts", type=int, default=64)
    ap.add_argument("--check", type=int, default=16, help="held-out prompts for the agreement")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    from areal_cli.model_source import resolve_model

    path = Path(resolve_model(a.model))
    report = build(a.out, path, a.experts, a.top_k, a.spread, a.fit_prompts, a.check, a.device)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

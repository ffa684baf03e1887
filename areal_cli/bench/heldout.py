"""Held-out greedy accuracy of a checkpoint: the task's eval split, greedy decoding with
transformers ``generate`` (batched, left-padded), scored by the run's reward function."""

from __future__ import annotations

from pathlib import Path

from areal_cli.config.schema import RootConfig


def greedy_accuracy(model_path: Path | str, cfg: RootConfig, size: int = 0, batch: int = 64,
                    problems: list | None = None) -> dict:
    """``problems``: already loaded from the eval split (default: ``load_problems(cfg.task,
    "eval")``).
    ``correct`` holds one character per problem, in order: "1" where the answer scored 1."""
    import torch
    from transformers import AutoModelForCausalLM

    from areal_cli.rewards.scoring import score
    from areal_cli.tasks import load_problems, load_tokenizer, prompt_text

    if problems is None:
        problems = load_problems(cfg.task, "eval")
    problems = problems[: size or cfg.eval.size or None]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = load_tokenizer(model_path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).to(device).eval()
    rewards = []
    for i in range(0, len(problems), batch):
        chunk = problems[i:i + batch]
        texts = [prompt_text(tok, p, cfg.task) for p in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=cfg.rollout.max_new_tokens,
                                 pad_token_id=tok.pad_token_id)
        for p, ids in zip(chunk, out[:, enc["input_ids"].shape[1]:], strict=True):
            rewards.append(score(tok.decode(ids, skip_special_tokens=True), p, cfg.reward))
    return {"accuracy": sum(r >= 1.0 for r in rewards) / max(1, len(rewards)),
            "mean_reward": sum(rewards) / max(1, len(rewards)), "problems": len(rewards),
            "correct": "".join("1" if r >= 1.0 else "0" for r in rewards)}

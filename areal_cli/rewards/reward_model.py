"""The reward model of reward.fn=model: an AutoModelForSequenceClassification whose chosen output
(reward.model.label) for (problem, completion) is the reward. It reads the pair as a chat (user =
problem, assistant = completion) where its tokenizer has a chat template, else as
"problem\\n\\ncompletion"; the raw logit is the score."""

from __future__ import annotations

import json
from pathlib import Path

from areal_cli.config.reward_models import RewardModelConfig
from areal_cli.rewards.judge import device_of


def label_index(config: dict, label: str) -> int:
    """The head's output that is the reward; ValueError naming the fix for a head with several
    outputs and no (or an unknown) reward.model.label."""
    id2label = {int(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    n = int(config.get("num_labels") or len(id2label) or 1)
    if not label:
        if n == 1:
            return 0
        raise ValueError(f"reward.model.path: the reward model's head has {n} outputs "
                         f"({', '.join(id2label.get(i, str(i)) for i in range(n))}); set "
                         "reward.model.label to the one that is the reward (a name or an index)")
    names = {v: k for k, v in id2label.items()}
    if label in names:
        return names[label]
    if label.isdigit() and int(label) < n:
        return int(label)
    raise ValueError(f"reward.model.label={label!r} is not an output of the reward model's head; "
                     f"its outputs: {', '.join(f'{i} ({id2label.get(i, i)})' for i in range(n))}")


def head_config(model_dir: Path) -> dict:
    """config.json of a reward model directory; ValueError when it is no sequence classifier."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    archs = config.get("architectures") or []
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ValueError(f"reward.model.path={model_dir}: a {', '.join(archs)}, not a "
                         "sequence-classification model; give an "
                         "AutoModelForSequenceClassification (or use reward.fn=judge)")
    return config


class RewardModel:
    """The loaded reward model (frozen, eval mode)."""

    def __init__(self, model_dir, cfg: RewardModelConfig, dtype, device: str = "cpu"):
        import torch
        from transformers import AutoModelForSequenceClassification

        from areal_cli.tasks import load_tokenizer

        self.cfg, self.torch = cfg, torch
        self.index = label_index(head_config(model_dir), cfg.label)
        self.tok = load_tokenizer(model_dir)
        self.tok.truncation_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        loaded = AutoModelForSequenceClassification.from_pretrained(str(model_dir), dtype=dtype)
        self.model = loaded.to(device).eval()
        self.model.requires_grad_(False)
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tok.pad_token_id

    def text(self, problem: str, completion: str) -> str:
        if getattr(self.tok, "chat_template", None):
            chat = [{"role": "user", "content": problem},
                    {"role": "assistant", "content": completion}]
            return self.tok.apply_chat_template(chat, tokenize=False)
        return f"{problem}\n\n{completion}"

    def score(self, items: list[tuple[str, str, str]]) -> list[float]:
        """The reward of each (problem, reference, completion), in one batch (the reference is
        unused)."""
        enc = self.tok([self.text(p, c) for p, _, c in items], return_tensors="pt", padding=True,
                       truncation=True, max_length=self.cfg.max_tokens, add_special_tokens=False)
        enc = enc.to(device_of(self.model))
        with self.torch.inference_mode():
            logits = self.model(**enc).logits.float()
        return logits[:, self.index].tolist()


"""The generative judge of reward.fn=judge: a frozen causal LM grades completions from a rubric.

A prompt is the rubric template with {problem}, {reference} and {completion} replaced by plain
text (one pass of substitution: nothing in a completion is ever formatted or evaluated; the
tokenizer's control strings in them escaped, so they are never read as turn boundaries), wrapped in
the judge's chat template. verdict=yes_no scores P(yes) / (P(yes) + P(no)) of the first token of
the judge's reply, in one forward; verdict=number lets it write up to max_new_tokens (greedy) and
scales the first number in [score_min, score_max] to [0, 1]. A verdict that parses as neither is a
``parse_error``: counted, and scored per reward.judge.on_parse_error.

``JudgeBase`` holds what the engines share (the prompts, the verdict rules); ``Judge`` runs the
judge with transformers (reward.judge.engine=hf), ``vllm_judge.VLLMJudge`` with vLLM.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass

from areal_cli.config.reward_models import PLACEHOLDER, PLACEHOLDERS, JudgeConfig

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
YES, NO = ("yes", "Yes", "YES", " yes", " Yes"), ("no", "No", "NO", " no", " No")


@dataclass
class Verdict:
    score: float
    status: str  # "ok" | "parse_error" | "error"
    detail: str = ""


def render(template: str, problem: str, reference: str, completion: str) -> str:
    """``template`` with each {problem}/{reference}/{completion} replaced by its text, in one
    pass."""
    values = {"problem": problem, "reference": reference, "completion": completion}
    return PLACEHOLDER.sub(lambda m: values[m.group(1)]
                           if m.group(1) in PLACEHOLDERS else m.group(0), template)


ZERO_WIDTH = "\u200b"


def control_strings(tok) -> list[str]:
    """The texts the judge's tokenizer reads as special tokens (``<|im_end|>``, ``<|im_start|>``,
    its added control tokens), longest first."""
    specials = set(tok.all_special_tokens)
    specials |= {t.content for t in getattr(tok, "added_tokens_decoder", {}).values()
                 if getattr(t, "special", False)}
    return sorted((s for s in specials if len(s) > 1), key=len, reverse=True)


def escape_controls(text: str, controls: list[str]) -> str:
    """``text`` with every control string broken by a zero-width space after its first character:
    it reads the same, and tokenizes as plain text (a completion that spells ``<|im_end|>`` cannot
    end the judge's turn and forge its own)."""
    for s in controls:
        if s in text:
            text = text.replace(s, s[0] + ZERO_WIDTH + s[1:])
    return text


def parse_number(text: str, lo: float, hi: float) -> float | None:
    """The first number in ``text`` scaled from [lo, hi] to [0, 1]; None if none, or outside."""
    found = NUMBER.search(text)
    if found is None:
        return None
    value = float(found.group(0))
    return (value - lo) / (hi - lo) if lo <= value <= hi else None


def failed_parse(cfg: JudgeConfig, detail: str) -> Verdict:
    """A verdict that did not parse, scored per ``on_parse_error`` (min = 0, error = a failed
    call)."""
    return Verdict(0.0, "error" if cfg.on_parse_error == "error" else "parse_error", detail)


def single_token_ids(tok, words) -> list[int]:
    """The ids of the words that are one token each (the judge's first token decides)."""
    ids = {tuple(tok(w, add_special_tokens=False)["input_ids"]) for w in words}
    return sorted({i[0] for i in ids if len(i) == 1})


class JudgeBase(ABC):
    """What every judge engine shares: the judge's tokenizer, the prompts as token ids and the
    verdict rules. An engine loads the model and runs the forwards: ``_yes_no_mass`` and
    ``_replies``."""

    def __init__(self, model_dir, cfg: JudgeConfig):
        from areal_cli.tasks import load_tokenizer

        self.cfg = cfg
        self.tok = load_tokenizer(model_dir)
        self.tok.padding_side, self.tok.truncation_side = "left", "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.yes, self.no = single_token_ids(self.tok, YES), single_token_ids(self.tok, NO)
        self.controls = control_strings(self.tok)
        if cfg.verdict == "yes_no" and not (self.yes and self.no):
            raise ValueError("reward.judge.model: its tokenizer has no single-token yes/no; use "
                             "reward.judge.verdict=number")

    def prompt(self, problem: str, reference: str, completion: str) -> str:
        """The judge's prompt: the rubric with the three texts as data (control tokens escaped:
        the policy writes the completion, a data file the problem and the reference)."""
        problem, reference, completion = (escape_controls(t, self.controls)
                                          for t in (problem, reference, completion))
        text = render(self.cfg.template, problem, reference, completion)
        return self.tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                            add_generation_prompt=True)

    def encode(self, items: list[tuple[str, str, str]], **kw):
        """The prompts of ``items`` tokenized, each its last ``max_tokens`` tokens (``kw``: padding,
        tensors)."""
        return self.tok([self.prompt(*it) for it in items], truncation=True,
                        max_length=self.cfg.max_tokens,
                        add_special_tokens=False, **kw)

    def score(self, items: list[tuple[str, str, str]]) -> list[Verdict]:
        """Verdicts of (problem, reference, completion) items, in one batch."""
        if self.cfg.verdict == "yes_no":
            return self.yes_no_verdicts(*self._yes_no_mass(items))
        return self.number_verdicts(self._replies(items))

    @abstractmethod
    def _yes_no_mass(self, items) -> tuple[list[float], list[float]]:
        """P(yes) and P(no) of each item's first reply token."""

    @abstractmethod
    def _replies(self, items) -> list[list[int]]:
        """Each item's greedy reply, up to ``max_new_tokens`` token ids."""

    def yes_no_verdicts(self, p_yes: list[float], p_no: list[float]) -> list[Verdict]:
        """P(yes) / (P(yes) + P(no)); a parse failure where P(yes) + P(no) <
        ``min_verdict_mass``."""
        out = []
        for y, n in zip(p_yes, p_no, strict=True):
            if y + n < self.cfg.min_verdict_mass:
                out.append(failed_parse(self.cfg, f"P(yes) + P(no) = {y + n:.3g} < "
                                                  f"reward.judge.min_verdict_mass={self.cfg.min_verdict_mass:g}"))
            else:
                out.append(Verdict(y / (y + n), "ok"))
        return out

    def number_verdicts(self, replies: list[list[int]]) -> list[Verdict]:
        """The first number in [score_min, score_max] of each decoded reply, scaled to [0, 1]."""
        out = []
        for text in self.tok.batch_decode(replies, skip_special_tokens=True):
            value = parse_number(text, self.cfg.score_min, self.cfg.score_max)
            if value is None:
                out.append(failed_parse(self.cfg, f"no number in [{self.cfg.score_min:g}, "
                                                  f"{self.cfg.score_max:g}] in the judge's reply "
                                                  f"{text[:80]!r}"))
            else:
                out.append(Verdict(value, "ok"))
        return out


class Judge(JudgeBase):
    """reward.judge.engine=hf: the judge as a transformers model (frozen, eval mode, no
    gradients)."""

    def __init__(self, model_dir, cfg: JudgeConfig, dtype, device: str = "cpu"):
        import torch
        from transformers import AutoModelForCausalLM

        super().__init__(model_dir, cfg)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir),
                                                          dtype=dtype).to(device).eval()
        self.model.requires_grad_(False)

    def _batch(self, items):
        return self.encode(items, return_tensors="pt", padding=True).to(device_of(self.model))

    def _yes_no_mass(self, items) -> tuple[list[float], list[float]]:
        with self.torch.inference_mode():
            probs = self.torch.softmax(self.model(**self._batch(items)).logits[:, -1].float(),
                                       dim=-1)
        return probs[:, self.yes].sum(-1).tolist(), probs[:, self.no].sum(-1).tolist()

    def _replies(self, items) -> list[list[int]]:
        enc = self._batch(items)
        with self.torch.inference_mode():
            out = self.model.generate(**enc, max_new_tokens=self.cfg.max_new_tokens,
                                      do_sample=False,
                                      pad_token_id=self.tok.pad_token_id)
        return out[:, enc["input_ids"].shape[1]:].tolist()


def device_of(model) -> str:
    return str(next(model.parameters()).device)

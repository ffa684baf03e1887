"""Prompt tokens, made one way for every process: the controller (training prompts), the
evaluator, the launcher's preflight and the benchmarks.

``load_tokenizer`` reads a model directory's ``tokenizer.json`` with ``PreTrainedTokenizerFast``
(no torch import: the controller stays ~180 MB smaller) and falls back to ``AutoTokenizer`` for a
model without one; ``prompt_ids`` applies the chat template and tokenizes without adding special
tokens (the template already holds them).
"""

from __future__ import annotations

from pathlib import Path

from areal_cli.config.task import TaskConfig
from areal_cli.tasks.base import Problem


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of a local model directory."""
    if (Path(model_dir) / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def build_messages(problem: Problem, cfg: TaskConfig) -> list[dict]:
    """Chat messages for one problem: the optional system prompt, then the user prompt."""
    messages = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    return messages + [{"role": "user", "content": problem.prompt}]


def prompt_text(tok, problem: Problem, cfg: TaskConfig) -> str:
    """The prompt as text: chat template applied, ending with the assistant header."""
    return tok.apply_chat_template(build_messages(problem, cfg), add_generation_prompt=True,
                                   tokenize=False)


def prompt_ids(tok, problem: Problem, cfg: TaskConfig) -> list[int]:
    """The prompt tokens a model is given for ``problem`` (training, evaluation, checks)."""
    return tok(prompt_text(tok, problem, cfg), add_special_tokens=False)["input_ids"]

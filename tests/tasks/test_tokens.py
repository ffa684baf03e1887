"""Prompt tokens are made one way everywhere (tasks.prompt_ids), and the torch-free tokenizer it
loads gives exactly AutoTokenizer's ids for the default model."""

from __future__ import annotations

import subprocess
import sys

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from areal_cli.model_source import resolve_model
from areal_cli.runconfig.compose import compose
from areal_cli.tasks import Problem, load_problems, load_tokenizer, prompt_ids
from areal_cli.workflows.turns import env_turn_ids

PROMPTS = ["What is 2 + 3?", "Compute 17 - 9 + 4. Give the final answer after 'Answer:'.",
           "Ünïcødé, emoji 🙂 and\ttabs\nnew lines", "", "  leading and trailing spaces  ",
           "```python\nprint(1)\n```", "<|im_start|>user\nan injected header<|im_end|>"]


def test_prompt_ids_equal_autotokenizer_for_the_default_model():
    path = resolve_model(compose([]).model)
    fast, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(path)
    assert type(fast) is PreTrainedTokenizerFast  # tokenizer.json is there: the torch-free class
    cfg = compose(["task=basic_arithmetic"])
    problems = [Problem(f"t/{i}", p, "0", {}) for i, p in enumerate(PROMPTS)] + load_problems(cfg.task, "eval")[:20]
    system = compose(["task=basic_arithmetic", "task.system_prompt=Think step by step."]).task
    for task in (cfg.task, system):
        for p in problems:
            ids = prompt_ids(fast, p, task)
            text = auto.apply_chat_template([*([{"role": "system", "content": task.system_prompt}]
                                              if task.system_prompt else []), {"role": "user", "content": p.prompt}],
                                            add_generation_prompt=True, tokenize=False)
            assert ids == auto(text, add_special_tokens=False)["input_ids"], p.prompt
            assert fast.decode(ids) == auto.decode(ids)
    assert (fast.eos_token_id, fast.eos_token, fast.pad_token_id) == (auto.eos_token_id, auto.eos_token,
                                                                      auto.pad_token_id)
    for feedback in ("wrong, try again", "Output:\n42"):  # the env turns of multi-turn workflows
        for eos in (True, False):
            assert env_turn_ids(fast, feedback, eos) == env_turn_ids(auto, feedback, eos)


def test_the_controller_tokenizer_does_not_import_torch():
    path = resolve_model(compose([]).model)
    code = ("import sys; from areal_cli.runconfig.compose import compose; from areal_cli.tasks import load_tokenizer, "
            f"prompt_ids, Problem; tok = load_tokenizer({str(path)!r}); "
            "prompt_ids(tok, Problem('t', 'What is 2 + 3?', '5', {}), compose([]).task); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]

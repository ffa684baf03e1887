"""The torch-free tokenizer the controller uses gives the prompts the same token ids as
AutoTokenizer, whose ids the engines and the trainer see."""

from __future__ import annotations

import subprocess
import sys

from transformers import AutoTokenizer

from areal_cli.config.task import TaskConfig
from areal_cli.models import resolve_model
from areal_cli.tasks import build_messages, load_problems, load_tokenizer


def test_same_prompt_ids_as_autotokenizer():
    path = resolve_model("smollm2-135m-instruct")
    light, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(path)
    task = TaskConfig(source="reasoning_gym", dataset="basic_arithmetic", size=20, eval_size=5)
    texts = [light.apply_chat_template(build_messages(p, task), add_generation_prompt=True, tokenize=False)
             for p in load_problems(task, "train")]
    texts += ["Ünïcødé ✓ 数学 \\n\\t  spaces", "<|im_start|>user\nhi<|im_end|>", ""]
    for text in texts:
        assert light(text, add_special_tokens=False)["input_ids"] == auto(text, add_special_tokens=False)["input_ids"]
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2 + 3?"}]
    assert light.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == \
        auto.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert light.eos_token_id == auto.eos_token_id


def test_loading_it_imports_no_torch():
    code = ("import sys; from areal_cli.models import resolve_model; from areal_cli.tasks import load_tokenizer; "
            "load_tokenizer(resolve_model('smollm2-135m-instruct')); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]

"""reward.judge.engine=vllm: on the CPU, the vLLM judge's side of ``JudgeBase`` against a stand-in for
``vllm.LLM`` (the prompts it sends, the yes/no mass it sums from the top logprobs, the replies it
decodes) and the error without vLLM; where vLLM and a GPU are present, the real thing against the hf
judge on the same GPU: the default model, 8 items, both verdicts."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from areal_cli.config.reward_models import JudgeConfig
from areal_cli.config.schema import RootConfig
from areal_cli.model_source import resolve_model
from areal_cli.rewards.judge import Judge, JudgeBase
from areal_cli.rewards.vllm_judge import VLLMJudge, import_vllm
from tests.engines.test_vllm_engine import _gpu_vllm, hide_vllm

ITEMS = [
    ("What is the capital of France?", "Paris", "Paris is the capital of France."),
    ("What is the capital of France?", "Paris", "banana banana banana " * 20),
    ("What is 3 + 4?", "7", "3 + 4 is 7."),
    ("What is 3 + 4?", "7", "I like trains."),
    ("What colour is the sky on a clear day?", "blue", "The sky is blue."),
    ("What colour is the sky on a clear day?", "blue", "Seven."),
    ("Who wrote Hamlet?", "Shakespeare", "William Shakespeare wrote Hamlet."),
    ("Who wrote Hamlet?", "Shakespeare", "The weather is nice today, thank you for asking about it."),
]
GRADE = ("Question: {problem}\n\nAnswer: {completion}\n\nGrade the answer from 0 (wrong) to 10 (right). "
         "Reply with the grade only.")


@pytest.fixture(scope="module")
def judge_dir():
    return resolve_model(RootConfig().model)  # the default model, as policy and judge


class FakeLLM:
    """``vllm.LLM.generate``'s shape: per prompt one output whose first token has ``top`` as its top
    logprobs (token id → an object with ``.logprob``) and whose reply is ``reply``."""

    def __init__(self, top: dict[int, float], reply: list[int]):
        self.top = {i: SimpleNamespace(logprob=math.log(p)) for i, p in top.items()}
        self.reply, self.prompts = reply, []

    def generate(self, prompts, params, use_tqdm):
        assert not use_tqdm
        self.prompts += prompts
        return [SimpleNamespace(outputs=[SimpleNamespace(logprobs=[self.top], token_ids=self.reply)]) for _ in prompts]


def fake_judge(judge_dir, cfg: JudgeConfig, llm: FakeLLM) -> VLLMJudge:
    """A ``VLLMJudge`` whose LLM is ``llm``: everything but vLLM itself."""
    judge = VLLMJudge.__new__(VLLMJudge)
    JudgeBase.__init__(judge, judge_dir, cfg)
    judge.llm, judge.first_token, judge.greedy = llm, None, None
    return judge


def test_yes_no_sums_the_yes_and_no_tokens_among_the_top_logprobs(judge_dir):
    probe = fake_judge(judge_dir, JudgeConfig(), FakeLLM({}, []))
    yes, no = probe.yes, probe.no
    # P(yes) = 0.5 + 0.1 over two yes tokens, P(no) = 0.2, another token 0.15 is neither:
    # 0.6 / (0.6 + 0.2) = 0.75
    llm = FakeLLM({yes[0]: 0.5, yes[1]: 0.1, no[0]: 0.2, 50: 0.15}, [])
    assert fake_judge(judge_dir, JudgeConfig(), llm).score(ITEMS[:1])[0].score == pytest.approx(0.75)
    # neither yes nor no among the top: P(yes) + P(no) = 0 < min_verdict_mass
    [meant_neither] = fake_judge(judge_dir, JudgeConfig(), FakeLLM({50: 0.9}, [])).score(ITEMS[:1])
    assert meant_neither.status == "parse_error" and "P(yes) + P(no) = 0 <" in meant_neither.detail


def test_prompts_are_the_hf_judges_token_ids_kept_from_the_end(judge_dir):
    cfg = JudgeConfig(max_tokens=40)  # shorter than every prompt: each keeps its last 40 tokens
    llm = FakeLLM({}, [])
    fake_judge(judge_dir, cfg, llm)._yes_no_mass(ITEMS[:2])
    hf = Judge(judge_dir, cfg, torch.float32)
    full = [hf.tok(hf.prompt(*it), add_special_tokens=False)["input_ids"] for it in ITEMS[:2]]
    assert [p["prompt_token_ids"] for p in llm.prompts] == [ids[-40:] for ids in full]
    assert all(len(ids) > 40 for ids in full)
    assert hf._batch(ITEMS[:2])["input_ids"].tolist() == [ids[-40:] for ids in full]  # no padding at equal lengths


def test_number_decodes_the_reply_tokens(judge_dir):
    probe = fake_judge(judge_dir, JudgeConfig(), FakeLLM({}, []))
    seven = probe.tok("7 out of 10", add_special_tokens=False)["input_ids"] + [probe.tok.eos_token_id]
    cfg = JudgeConfig(verdict="number", template=GRADE)
    [verdict] = fake_judge(judge_dir, cfg, FakeLLM({}, seven)).score(ITEMS[:1])
    assert (verdict.status, verdict.score) == ("ok", pytest.approx(0.7))  # 7 on [0, 10]


def test_without_vllm_the_error_names_the_extra(monkeypatch):
    hide_vllm(monkeypatch)
    with pytest.raises(ValueError, match=r"reward.judge.engine=vllm needs vllm .*areal-cli\[vllm\].*"
                                         r"reward.judge.engine=hf"):
        import_vllm()


@pytest.mark.skipif(bool(_gpu_vllm()), reason=_gpu_vllm() or "runs")
def test_vllm_and_hf_judges_agree_on_one_gpu(judge_dir):
    # float32 on both: in bfloat16 the two engines' kernels round differently (on an H100 up to 0.057 apart
    # on these items), which is no difference of the judges' prompts or verdict rules
    cfg = JudgeConfig(gpu_memory_utilization=0.3)
    vllm_judge = VLLMJudge(judge_dir, cfg, torch.float32)  # first: vLLM starts before this process uses CUDA
    hf_judge = Judge(judge_dir, cfg, torch.float32, "cuda")
    got, want = vllm_judge.score(ITEMS), hf_judge.score(ITEMS)
    print("yes_no vllm", [round(v.score, 3) for v in got], "hf", [round(v.score, 3) for v in want])
    assert [v.status for v in got] == [v.status for v in want] == ["ok"] * len(ITEMS)
    assert [v.score for v in got] == pytest.approx([v.score for v in want], abs=0.05)
    number = dataclasses.replace(cfg, verdict="number", template=GRADE)
    vllm_judge.cfg = hf_judge.cfg = number  # the same max_new_tokens: vLLM's greedy parameters still hold
    got, want = vllm_judge.score(ITEMS), hf_judge.score(ITEMS)
    print("number vllm", [(v.status, v.score) for v in got], "hf", [(v.status, v.score) for v in want])
    assert any(v.status == "ok" for v in got) and all(0.0 <= v.score <= 1.0 for v in got)
    assert [(v.status, v.score) for v in got] == [(v.status, v.score) for v in want]  # the same greedy replies

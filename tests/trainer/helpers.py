"""Shared pieces of the trainer tests: a one-rank gloo group, a batch of trajectories whose
behaviour logprobs come from the model itself (exactly on-policy), and configs."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from areal_cli.runconfig.autos import resolve
from areal_cli.runconfig.compose import compose
from areal_cli.transport.messages import Batch, GroupResult, Sample


def init_gloo() -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def config(*overrides: str):
    """The composed config of ``overrides``, float32 compute, no CPU threads setting, resolved for
    the CPU (what `areal train` plans on this machine)."""
    return resolve(compose(["trainer.dtype=float32", *overrides]))


@torch.no_grad()
def behaviour_logprobs(model, prompt: list[int], resp: list[int]) -> np.ndarray:
    """log π(resp_t | prefix) of an unpadded float32 forward: what an exact engine records."""
    ids = torch.tensor([prompt + resp])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(resp)[:, None])[:, 0].numpy()


def make_batch(model, groups: int, group_size: int, seed: int = 0, rewards=None) -> Batch:
    """``groups`` × ``group_size`` random prompts/responses of varied lengths, mixed rewards."""
    gen = torch.Generator().manual_seed(seed)

    def tokens(lo, hi):
        n = int(torch.randint(lo, hi, (1,), generator=gen))
        return torch.randint(5, 1000, (n,), generator=gen).tolist()

    out = []
    for g in range(groups):
        prompt = tokens(3, 9)
        samples = []
        for i in range(group_size):
            resp = tokens(2, 8)
            r = float(rewards[g * group_size + i]) if rewards is not None else float((g + i) % 2)
            samples.append(Sample(
                sample_index=i, prompt_ids=np.array(prompt, np.int32), output_ids=np.array(resp, np.int32),
                logprobs=behaviour_logprobs(model, prompt, resp).astype(np.float32),
                versions=np.zeros(len(resp), np.int32), loss_mask=np.ones(len(resp), np.uint8), reward=r,
                reward_status="ok", finish_reason="stop", num_turns=1, completion=""))
        out.append(GroupResult(group_id=g, prompt_id=f"p{g}", worker=0, samples=samples, gen_time_s=0.0,
                               gen_tokens=0))
    return Batch(step=0, groups=out)


def plain_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def default_shaped_batch(seed: int = 0, groups: int = 8, group_size: int = 4, uniform=(1, 4, 6)) -> Batch:
    """The default run's batch shape: ``groups`` × ``group_size`` samples, prompts of 55–65
    tokens, responses of 10–64; the groups in ``uniform`` got one reward for every sample (zero
    advantage, as 3 of 8 groups do early in the default run), the others 1 and 0 mixed.
    Behaviour logprobs are made up (no model needed: for timing and memory, not for values)."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        prompt = rng.integers(100, 10000, int(rng.integers(55, 66))).astype(np.int32)
        samples = []
        for i in range(group_size):
            resp = rng.integers(100, 10000, int(rng.integers(10, 65))).astype(np.int32)
            reward = float(g % 2) if g in uniform else float(i % 2 == 0 if i < 2 else rng.random() < 0.5)
            samples.append(Sample(
                sample_index=i, prompt_ids=prompt, output_ids=resp,
                logprobs=rng.uniform(-3, -0.01, len(resp)).astype(np.float32),
                versions=np.zeros(len(resp), np.int32), loss_mask=np.ones(len(resp), np.uint8), reward=reward,
                reward_status="ok", finish_reason="stop", num_turns=1, completion=""))
        out.append(GroupResult(group_id=g, prompt_id=f"p{g}", worker=0, samples=samples, gen_time_s=0.0,
                               gen_tokens=0))
    return Batch(step=0, groups=out)


def step_runner(path, *overrides: str, checkpointing: bool = False):
    """A one-rank float32 CPU StepRunner of the model at ``path`` with ``overrides``, seeded."""
    from areal_cli.trainer.model import build_policy
    from areal_cli.trainer.step import StepRunner

    cfg = config(*overrides)
    torch.manual_seed(0)
    model = build_policy(path, torch.device("cpu"), torch.float32, activation_checkpointing=checkpointing,
                         lora=cfg.trainer.lora)
    return StepRunner.build(model, path, cfg, torch.device("cpu"), torch.float32, rank=0, world=1)


def grads(model) -> dict[str, torch.Tensor]:
    """Every parameter's gradient (the full tensor of a sharded one), cloned, by name."""
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in model.named_parameters()}

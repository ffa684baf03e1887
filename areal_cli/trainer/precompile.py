"""Compiling the policy's decoder layers before the first batch, for every form of input a step can
give them.

A compiled layer (``model.compile_decoder_layers``, dynamic shapes) compiles again for each new form
of its inputs: one packed row or several (dynamo specialises a dimension of size 1), a block mask or
FlashAttention's segment offsets (``trainer.varlen``), a rank's empty micro-batch (a plain two-token
forward), gradients on or off. A form first met at step k stalls that step for the compile
while generation waits on the trainer (BENCHMARKS.md "Steps that compile inside a run"; a CPU run of
two layers shows the recompiles themselves: tests/trainer/test_precompile.py). Here each form the
run can meet is compiled once, on a few synthetic tokens, before the trainer waits for its first
batch, which it does while the engines start and generate it. The forms run on a few tokens: no
compiled graph depends on the micro-batch's size (``model.no_size_guards``; with size guards, steps
compiled again after precompile: benchmarks/precompile_check.py).
``compiled_graphs`` counts the graphs dynamo compiled since the process started: a step's metrics
carry the ones it compiled (``StepRunner.train``), so a form missed here shows up as a step that
did."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace

import torch

from areal_cli.trainer.batching import Rollouts, dummy_forward

PROMPT_TOKENS_ASSUMED = 1024
"""Without engine.vllm.max_model_len, a prompt is taken to be at most this long when deciding
whether a sequence can exceed a packed row (and so take the segment-offset path)."""


@dataclass(frozen=True)
class Form:
    name: str
    # tokens of each sequence of one micro-batch; () = a rank's empty micro-batch
    lengths: tuple[int, ...]
    grad: bool


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (0 where dynamo was never imported: importing it
    to ask would cost a CPU trainer's first step seconds)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def longest_sequence(cfg) -> int:
    """The most tokens (prompt and response) one trained sequence can hold in this run."""
    if cfg.engine.vllm.max_model_len > 0:
        return cfg.engine.vllm.max_model_len
    return PROMPT_TOKENS_ASSUMED + cfg.rollout.max_new_tokens * max(1, cfg.workflow.max_turns)


def input_forms(runner, row_tokens: int | None) -> list[Form]:
    """The forms of input this run's steps can give the compiled layers (``row_tokens``: the longest
    packed row, ``batching.PACKED_ROW_TOKENS_CUDA`` on GPUs; None: a micro-batch is one row)."""
    cfg = runner.cfg
    budget, longest = cfg.trainer.micro_batch_tokens, longest_sequence(cfg)
    if runner.packing:
        shapes = [("one packed row", (16, 16))]
        if row_tokens is not None and budget > row_tokens:  # a micro-batch of several rows
            shapes.append(("packed rows", (row_tokens // 2 + 1, row_tokens // 2 + 1)))
        if runner.varlen and row_tokens is not None and longest > row_tokens:
            shapes.append(("segment offsets", (row_tokens + 1,)))
    else:
        shapes = [("one padded row", (16,)), ("padded rows", (16, 16))]
    # a rank without rows, or every row skipped
    if runner.world > 1 or cfg.trainer.skip_zero_advantage:
        shapes.append(("empty micro-batch", ()))
    modes = [True, False] if runner._needs_proximal() else [True]
    return [Form(name, lengths, grad) for grad in modes for name, lengths in shapes]


def synthetic_rollouts(lengths: tuple[int, ...]) -> Rollouts:
    """Sequences of those lengths (a 4-token prompt, the rest response) of arbitrary tokens."""
    prompts = [[1, 2, 3, 4] for _ in lengths]
    responses = [[5 + (i % 64) for i in range(n - 4)] for n in lengths]
    width = max(len(r) for r in responses)
    return Rollouts(prompts=prompts, responses=responses,
                    behav_logp=torch.zeros(len(lengths), width),
                    loss_mask=torch.ones(len(lengths), width, dtype=torch.bool),
                    rewards=torch.zeros(len(lengths)), group_size=1)


def run_form(runner, form: Form) -> None:
    """One forward (and a zero-weight backward with ``form.grad``) of the policy on that form."""
    with torch.set_grad_enabled(form.grad):
        if not form.lengths:
            dummy_forward(runner.model, runner.device, runner.dtype, backward=form.grad)
            return
        ro = synthetic_rollouts(form.lengths)
        lp, ent = runner._forward(ro, list(range(ro.n)))
        if form.grad:
            (lp.sum() * 0.0 + ent.sum() * 0.0).backward()


def precompile(runner, row_tokens: int | None) -> tuple[list[str], float]:
    """Run every form of ``input_forms`` once (every rank the same forms, in the same order: FSDP's
    collectives), then drop the zero gradients. The forms' names and the seconds it took."""
    t0 = time.perf_counter()
    forms, resized = input_forms(runner, row_tokens), set()
    for form in forms:
        run_form(runner, form)
        if form.lengths and form.grad not in resized:
            # the output layer's reduce (``logprobs.compiled_reduce``) compiles for the first
            # chunk's size, then again at the next size, dynamic in the token dimension: that second
            # one here
            resized.add(form.grad)
            run_form(runner, replace(form, lengths=tuple(n + 8 for n in form.lengths)))
    runner.opt.zero_grad(set_to_none=True)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return [f"{f.name}{'' if f.grad else ' (no grad)'}" for f in forms], time.perf_counter() - t0

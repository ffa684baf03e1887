"""Generate and score held-out problems: a greedy pass and/or a sampled pass of k per problem.

Prompts are built as the controller builds them (``tasks.prompt_ids``), tokens
come from the training engine (``engine.name``, built by ``engines.factory.make_engine`` as a
rollout worker's is, with no weight source; greedy when temperature is 0) and every completion is
scored by the training reward pool, so an eval number means what a training reward means. One
engine serves every pass of a model: ``Engine.configure`` sets each pass's sampling (and, hf, its
KV cache).

Nothing waits forever: a pass in which no sequence finishes, or no completion is scored, for
``timeout_s`` raises ``EvalStalled`` naming what it waited for.
"""

from __future__ import annotations

import collections
import concurrent.futures
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from areal_cli.config.schema import EngineConfig
from areal_cli.config.task import RewardConfig, TaskConfig
from areal_cli.engines.base import Engine, EngineSetup, Sampling, Sequence
from areal_cli.engines.factory import make_engine
from areal_cli.eval.metrics import summarize
from areal_cli.model_source import resolve_eval_model
from areal_cli.rewards import RewardPool
from areal_cli.rewards.extract import extract_answer
from areal_cli.runconfig.autos import resolve_engine
from areal_cli.tasks import Problem, load_problems, load_tokenizer, prompt_ids


@dataclass(frozen=True)
class EvalId:
    """The engine request of sample ``sample`` of problem ``problem`` in pass ``pass_no`` (pass
    numbers keep ids unique in a vLLM engine that every pass reuses)."""

    pass_no: int
    problem: int
    sample: int

    def __str__(self) -> str:
        return f"{self.pass_no}/{self.problem}:{self.sample}"


class EvalStalled(RuntimeError):
    """An evaluation made no progress for its ``timeout_s``; the message says what it waited for."""


def eval_problems(task_cfg: TaskConfig, size: int = 0) -> list[Problem]:
    """The first ``size`` problems of the task's eval split (0 = all task.eval_size)."""
    return load_problems(task_cfg, "eval")[: size or None]


class Evaluator:
    """One model, loaded once, with its tokenizer and a reward pool; ``run`` measures one task.

    ``engine_cfg``: the engine (engine.* of ``areal eval``; default hf), built once and configured
    per pass; ``seed`` seeds vLLM's sampling.
    """

    def __init__(self, model_path: str | Path, reward_cfg: RewardConfig,
                 engine_cfg: EngineConfig | None = None,
                 threads: int | None = None, max_concurrent: int = 64,
                 pool: RewardPool | None = None,
                 seed: int = 0, timeout_s: float = 3600.0):
        self.timeout_s = timeout_s  # longest wait for a sequence or a score; 0 = no limit
        self._own_pool = pool is None  # started first: its workers warm up while the model loads
        self.pool = pool or RewardPool(reward_cfg, reward_cfg.workers)
        self.engine: Engine | None = None
        self._passes = 0
        try:
            # not planned by a launcher: its engine's auto values are resolved here, once
            self._load(model_path, resolve_engine(engine_cfg or EngineConfig(), updates=False),
                       threads,
                       max_concurrent, seed)
        except BaseException:
            self.close()
            raise

    def _load(self, model_path, engine_cfg: EngineConfig, threads: int | None, max_concurrent: int,
              seed: int) -> None:
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.engine_cfg = engine_cfg
        self.max_concurrent = max_concurrent
        self.model_path = str(model_path)
        self.tok = load_tokenizer(model_path)
        # greedy until a pass says otherwise; each pass sizes the KV cache for its own context
        self.engine = make_engine(EngineSetup(engine_cfg, model_path, self.tok.eos_token_id,
                                              Sampling(0.0),
                                              sequences=max_concurrent, seed=seed))

    def run(self, task_cfg: TaskConfig, *, n_samples: int = 1, temperature: float = 0.0,
            max_new_tokens: int = 64, size: int = 0, greedy: bool = True, top_p: float = 1.0,
            seed: int = 0, problems: list[Problem] | None = None) -> dict:
        """Metrics and every sample of one task: {"task", "model", "metrics", "samples", "wall_s"}.

        ``problems``: already loaded eval problems (default: the first ``size`` of the eval split).
        """
        t0 = time.perf_counter()
        if problems is None:
            problems = eval_problems(task_cfg, size)
        prompts = [self.prompt_ids(p, task_cfg) for p in problems]
        samples = []
        if greedy or temperature == 0:
            samples += self._pass("greedy", problems, prompts, 1, 0.0, top_p, max_new_tokens)
        if temperature > 0:
            import torch

            torch.manual_seed(seed)
            samples += self._pass("sample", problems, prompts, n_samples, temperature, top_p,
                                  max_new_tokens)
        return {"model": self.model_path, "task": task_cfg.name,
                "metrics": summarize(samples, n_samples), "samples": samples,
                "wall_s": round(time.perf_counter() - t0, 2)}

    def run_agent(self, task_cfg: TaskConfig, workflow, problems: list[Problem],
                  max_new_tokens: int) -> dict:
        """``workflow.agent`` run greedily once per problem (eval/agent.py); the same dict as
        ``run``."""
        from areal_cli.eval.agent import agent_pass

        t0 = time.perf_counter()
        self._passes += 1
        # the agent's messages, then its calls' tokens
        context = 1024 + max_new_tokens * workflow.max_turns
        self.engine.configure(Sampling(0.0), context)
        samples = agent_pass(self.engine, self.tok, self.pool, workflow, problems, max_new_tokens,
                             context,
                             self.timeout_s, self.model_path)
        return {"model": self.model_path, "task": task_cfg.name, "metrics": summarize(samples, 1),
                "samples": samples, "wall_s": round(time.perf_counter() - t0, 2)}

    def prompt_ids(self, problem: Problem, task_cfg: TaskConfig) -> list[int]:
        """The prompt tokens exactly as the controller makes them for training."""
        return prompt_ids(self.tok, problem, task_cfg)

    def _pass(self, name: str, problems: list[Problem], prompts: list[list[int]], n: int,
              temperature: float, top_p: float, max_new_tokens: int) -> list[dict]:
        self._passes += 1  # request ids unique over the passes of the engine that every pass reuses
        requests = [Sequence(EvalId(self._passes, i, j), prompts[i], max_new_tokens)
                    for i in range(len(problems))
                    for j in range(n)]
        scored = {}
        self.engine.configure(Sampling(temperature, top_p),
                              max(map(len, prompts), default=1) + max_new_tokens)
        t0 = time.monotonic()
        for k, seq in enumerate(generate(self.engine, requests, self.max_concurrent,
                                         self.timeout_s), 1):
            if k % PROGRESS_EVERY == 0 or k == len(requests):
                say(f"  {name}: {k}/{len(requests)} completions ({time.monotonic() - t0:.0f}s)")
            i, j = seq.rid.problem, seq.rid.sample
            text = self.tok.decode(seq.output_ids, skip_special_tokens=True)
            scored[i, j] = (seq, text, self.pool.submit(text, problems[i]))
        wait_scores([f for _, _, f in scored.values()], self.timeout_s)
        return [_record(name, problems[i], j, seq, text, future.result())
                for (i, j), (seq, text, future) in sorted(scored.items())]

    def close(self) -> None:
        try:
            if self.engine is not None:
                self.engine.close()
                self.engine = None
        finally:
            if self._own_pool:
                self.pool.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


PROGRESS_EVERY = 50
"""A pass prints a progress line (stderr) every this many completions, and at its end."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def generate(engine, requests: list[Sequence], max_concurrent: int, timeout_s: float = 0.0):
    """Yield every request once finished, keeping at most ``max_concurrent`` in the engine; raise
    EvalStalled when none finishes for ``timeout_s`` (0 = wait as long as it takes)."""
    pending, running = collections.deque(requests), 0
    last = time.monotonic()
    while pending or running:
        while pending and running < max_concurrent:
            engine.submit(pending.popleft())
            running += 1
        for seq in engine.poll(0.5):
            running -= 1
            last = time.monotonic()
            yield seq
        if timeout_s and time.monotonic() - last > timeout_s:
            raise EvalStalled(f"no sequence finished for {timeout_s:g}s ({running} generating, "
                              f"{len(pending)} waiting): the engine is stuck; raise timeout_s if a "
                              "sequence can take longer")


def wait_scores(futures: list, timeout_s: float) -> None:
    """Until every reward call is back; EvalStalled when none comes back for ``timeout_s`` (the pool
    bounds each call by reward.timeout_s, so this is the pool itself stuck)."""
    waiting = set(futures)
    while waiting:
        done, waiting = concurrent.futures.wait(waiting, timeout=timeout_s or None,
                                                return_when=concurrent.futures.FIRST_COMPLETED)
        if not done:
            raise EvalStalled(f"no completion was scored for {timeout_s:g}s ({len(waiting)} "
                              "waiting): the reward pool is stuck; see the log for its error")

def _record(name: str, problem: Problem, j: int, seq: Sequence, text: str, result) -> dict:
    return {"prompt_id": problem.id, "pass": name, "sample": j, "completion": text,
            "answer": extract_answer(text), "reference": problem.answer,
            "score": float(result.score),
            "reward_status": result.status, "length": len(seq.output_ids),
            "finish_reason": seq.finish_reason}


def evaluate(model_path: str | Path, task_cfg: TaskConfig, reward_cfg: RewardConfig,
             n_samples: int = 1,
             temperature: float = 0.0, max_new_tokens: int = 64, size: int = 0, **options) -> dict:
    """Evaluate one model on one task's eval split; what ``areal train`` calls for ``eval.every``.

    ``model_path``: an alias, a Hugging Face directory or a run_dir. ``size``: the first that
    many eval problems (0 = all). ``options``: ``greedy``, ``top_p``, ``seed``, ``problems`` (of
    ``run``; ``seed`` also seeds a vLLM engine) and
    ``engine_cfg``, ``threads``, ``max_concurrent``, ``pool`` (of ``Evaluator``; pass the
    caller's RewardPool to skip starting one). Returns ``Evaluator.run``'s dict.
    """
    run_keys = ("greedy", "top_p", "seed", "problems")
    run_opts = {k: options.pop(k) for k in run_keys if k in options}
    with Evaluator(resolve_eval_model(str(model_path)), reward_cfg, seed=run_opts.get("seed", 0),
                   **options) as ev:
        return ev.run(task_cfg, n_samples=n_samples, temperature=temperature,
                      max_new_tokens=max_new_tokens, size=size, **run_opts)

"""The reward-model process: scores the model-based parts of reward.fn (model, judge) for every
rollout worker of a run, in batches.

``python -m areal_cli.rewards.server <run_dir>``. It loads the reward model and/or the judge
(frozen: their weights never change), binds its ROUTER (``transport.channels.ReplyRouter``, a CURVE
server admitting only the run's key), writes its address to ``reward_endpoint.json`` and serves:
after the first request it gathers more for reward.batch_wait_s (up to reward.batch_size per part
it serves), from whichever workers sent them, scores each part's requests in forwards of at most
reward.batch_size and answers each worker.
A batch that fails (a torch error) answers "error" for each of its requests, and the process goes
on. It exits on the controller's Stop (it subscribes to the control channel).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import zmq

from areal_cli.config.read import read_yaml
from areal_cli.config.resolve import require_resolved
from areal_cli.config.reward_models import JudgeEngine
from areal_cli.config.schema import RootConfig
from areal_cli.durable import atomic_write
from areal_cli.model_source import resolve_model
from areal_cli.rundir import RunDir
from areal_cli.runtime import run_main, set_threads, setup_process
from areal_cli.transport.auth import Gatekeeper, load_keys
from areal_cli.transport.channels import Channel, Endpoints, ReplyRouter, max_frame_bytes
from areal_cli.transport.messages import RewardReply, RewardRequest, RewardTaken, Stop

NAME = "reward-model"
"""The process's name: its log is logs/reward-model.log; errors of its parts name it."""


def load_scorers(cfg: RootConfig, device: str) -> dict:
    """part → its loaded scorer: ``RewardModel`` (model) and/or the judge of reward.judge.engine
    (judge)."""
    import torch

    dtype = getattr(torch, cfg.reward.dtype)
    scorers = {}
    # first: vLLM sizes its share of the GPU before the reward model takes any
    if "judge" in cfg.reward.parts:
        scorers["judge"] = load_judge(cfg, dtype, device)
    if "model" in cfg.reward.parts:
        from areal_cli.rewards.reward_model import RewardModel

        scorers["model"] = RewardModel(resolve_model(cfg.reward.model.path), cfg.reward.model,
                                       dtype, device)
    return scorers


def load_judge(cfg: RootConfig, dtype, device: str):
    """The judge on the engine of the resolved reward.judge.engine: a vllm.LLM, or a transformers
    model."""
    path, jc = resolve_model(cfg.reward.judge.model or cfg.model), cfg.reward.judge
    if jc.engine == JudgeEngine.vllm:
        from areal_cli.rewards.vllm_judge import VLLMJudge

        return VLLMJudge(path, jc, dtype)
    from areal_cli.rewards.judge import Judge

    return Judge(path, jc, dtype, device)


def score_part(scorer, part: str, requests: list[RewardRequest]) -> list[tuple[float, str, str]]:
    """(score, status, detail) of each request of one part, scored in one batch."""
    items = [(r.problem, r.reference, r.completion) for r in requests]
    if part == "model":
        return [(float(s), "ok", "") for s in scorer.score(items)]
    return [(v.score, v.status, v.detail) for v in scorer.score(items)]


class Server:
    def __init__(self, run_dir: str):
        self.log = setup_process(NAME, run_dir)
        self.cfg = cfg = require_resolved(read_yaml(RunDir(run_dir).config),
                                          str(RunDir(run_dir).config))
        self.rc = cfg.reward
        set_threads(0, share=2)
        import torch

        device = "cuda" if cfg.reward.gpus and torch.cuda.is_available() else "cpu"
        self.scorers = load_scorers(cfg, device)
        keys, limit = load_keys(run_dir), max_frame_bytes(cfg)
        self.gate = Gatekeeper(keys, self.log)
        self.sock = ReplyRouter(f"tcp://{cfg.launcher.host}:0", keys, limit, self.gate)
        self.control = Channel(zmq.SUB, Endpoints.load(run_dir).control, bind=False, name="control",
                               keys=keys,
                               max_frame=limit)
        self.served = 0
        atomic_write(RunDir(run_dir).reward_endpoint, json.dumps({"reward": self.sock.addr}))
        self.log.info("serving %s on %s (%s)", ", ".join(self.scorers), self.sock.addr, device)
        if "judge" in self.scorers:
            self.log.info("judge: reward.judge.engine=%s", cfg.reward.judge.engine)

    def run(self) -> None:
        while not isinstance(self.control.recv(0), Stop):
            first = self.sock.recv_from(0.1)
            if first is None:
                continue
            batch, deadline = [first], time.monotonic() + self.rc.batch_wait_s
            while len(batch) < self.rc.batch_size * len(self.scorers):
                nxt = self.sock.recv_from(max(0.0, deadline - time.monotonic()))
                if nxt is None:
                    break
                batch.append(nxt)
            self._serve(batch)
        self.log.info("stop received after %d requests", self.served)

    def _serve(self, batch: list[tuple[bytes, RewardRequest]]) -> None:
        by_part: dict[str, list[tuple[bytes, RewardRequest]]] = defaultdict(list)
        for identity, req in batch:
            by_part[req.part].append((identity, req))
        size = self.rc.batch_size
        chunks = [(part, items[i:i + size]) for part,
                  items in by_part.items() for i in range(0, len(items), size)]
        for part, items in chunks:
            requests = [r for _, r in items]
            workers = len({identity for identity, _ in items})
            for identity, req in items:  # each call's reward.timeout_s counts from now
                self.sock.reply(identity, RewardTaken(req.request_id))
            for (identity, req), (score, status, detail) in zip(items, self._score(part, requests),
                                                                strict=True):
                self.sock.reply(identity,
                                RewardReply(req.request_id, score, status, detail, len(items),
                                            workers))
            self.served += len(items)

    def _score(self, part: str, requests: list[RewardRequest]) -> list[tuple[float, str, str]]:
        scorer = self.scorers.get(part)
        if scorer is None:
            detail = f"this run's {NAME} process scores {', '.join(self.scorers)}, not {part!r}"
            return [(0.0, "error", detail)] * len(requests)
        t0 = time.perf_counter()
        try:
            out = score_part(scorer, part, requests)
        # a torch or tokenizer failure fails this batch only
        except (RuntimeError, ValueError) as err:
            self.log.exception("scoring %d %s request(s) failed", len(requests), part)
            return [(0.0, "error", f"{type(err).__name__}: {err}")] * len(requests)
        self.log.info("%s: scored %d in %.2fs", part, len(requests), time.perf_counter() - t0)
        return out

    def close(self) -> None:
        self.sock.close()
        self.control.close()
        self.gate.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    args = ap.parse_args()
    server = Server(args.run_dir)
    try:
        server.run()
    finally:
        server.close()


if __name__ == "__main__":
    run_main(main)

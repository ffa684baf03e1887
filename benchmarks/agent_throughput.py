"""The cost of the agent endpoint: the same task trained with workflow=single_turn and with an agent
that makes the same single call through the OpenAI client (``one_call`` below), or each agent
given with --agent, one run after the other on this machine; prints episodes/s and generated
tokens/s of each over the steps after warm-up, their ratios to single_turn's, and where an agent
episode's time went (waiting for a slot, in the engine, the agent's own).

    python -m benchmarks.agent_throughput --steps 8 --warmup 2 [overrides ...]
    python -m benchmarks.agent_throughput --agent benchmarks.agent_throughput:one_call \
        --agent examples.agents.calculator:run workflow.max_turns=3 ...

GPU: pass engine=vllm and the layout overrides (cluster.gpus=[0,1] ...), the same for both runs.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from areal_cli.controller.records import AGENT_TIMES


async def one_call(client, problem):
    """single_turn's work as an agent: the task's prompt, one completion, the task's reward."""
    await client.chat.completions.create(model="policy",
                                         messages=[{"role": "user", "content": problem.prompt}])
    return None


def run(name: str, overrides: list[str], out: Path, steps: int) -> list[dict]:
    run_dir = out / name
    cmd = [sys.executable, "-m", "areal_cli.cli", "train", "--quiet", f"run_dir={run_dir}",
           f"trainer.steps={steps}", "eval.at_end=false", *overrides]
    print(f"== {name}: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parents[1])
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
            if x.strip()]


def engine_figures(run_dir: Path) -> dict:
    """The engine's own line of the whole run (rollout-0's log): its tokens/s while it held
    sequences, and how many it held on average then."""
    line = re.findall(r"generation over the run: .*?([\d.]+) tokens/s generating, ([\d.]+) "
                      r"sequences at once", (run_dir / "logs" / "rollout-0.log").read_text())
    return ({"engine_tokens_per_s": float(line[-1][0]), "sequences_held": float(line[-1][1])}
            if line else {})


def summary(rows: list[dict], warmup: int, episodes_per_step: int) -> dict:
    kept = rows[warmup:] or rows
    wall = sum(r["step_wall_s"] for r in kept)
    episodes = max(1, sum(r.get("agent_episodes", 0) for r in kept))
    return {"steps": len(kept), "episodes_per_s": episodes_per_step * len(kept) / wall,
            # the tokens of every kept step over their wall time (a mean of the steps' rates would
            # weigh a 0.2-s step, which a buffered batch makes, as much as a 10-s one)
            "gen_tokens_per_s": sum(r["gen_tokens_per_s"] * r["step_wall_s"] for r in kept) / wall,
            "step_s_median": statistics.median(r["step_wall_s"] for r in kept),
            "calls_per_episode": sum(r.get("agent_calls", 0) for r in kept) / episodes or 1.0,
            # means per episode over the kept steps (each step's mean weighed by its episodes)
            **{k: sum(r.get(k, 0) * r.get("agent_episodes", 0) for r in kept) / episodes
               for k in AGENT_TIMES}}


def line(name: str, r: dict) -> str:
    times = (f"; an episode: {r['agent_wait_s']:.2f} s for a slot, {r['agent_engine_s']:.2f} s "
             f"in the engine, {r['agent_own_s']:.2f} s its own" if r.get("agent_engine_s") else "")
    return (f"{name:12s} episodes/s {r['episodes_per_s']:.2f}  gen tokens/s "
            f"{r['gen_tokens_per_s']:.0f}  step {r['step_s_median']:.1f} s  calls/episode "
            f"{r['calls_per_episode']:.2f}  ({r['steps']} steps); engine over the run: "
            f"{r.get('engine_tokens_per_s', 0):.0f} tokens/s while holding "
            f"{r.get('sequences_held', 0):.1f} sequences{times}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--agent", action="append", default=None,
                    help="module:function of an agent (repeat for several; each is one run "
                         "against the same single_turn run); default: one_call")
    ap.add_argument("--batch", type=int, default=8, help="trainer.batch_size")
    ap.add_argument("--group", type=int, default=4, help="rollout.group_size")
    ap.add_argument("--out", type=Path, default=None)
    args, overrides = ap.parse_known_args()
    agents = args.agent or ["benchmarks.agent_throughput:one_call"]
    out = args.out or Path(tempfile.mkdtemp(prefix="agent-bench-"))
    common = [f"trainer.batch_size={args.batch}", f"rollout.group_size={args.group}", *overrides]
    per_step = args.batch * args.group
    single = summary(run("single_turn", common, out, args.steps), args.warmup, per_step)
    single.update(engine_figures(out / "single_turn"))
    result = {"single_turn": single, "overrides": common, "agents": []}
    for i, spec in enumerate(agents):
        name = f"agent{i}"
        agent = summary(run(name, ["workflow=agent", f"workflow.agent={spec}", *common], out,
                            args.steps), args.warmup, per_step)
        agent.update(engine_figures(out / name), agent_spec=spec,
                     episodes_per_s_ratio=agent["episodes_per_s"] / single["episodes_per_s"],
                     gen_tokens_per_s_ratio=agent["gen_tokens_per_s"] / single["gen_tokens_per_s"])
        result["agents"].append(agent)
        (out / "agent_throughput.json").write_text(json.dumps(result, indent=2))
    print(line("single_turn", single))
    for agent in result["agents"]:
        print(line("agent", agent) + f"\n  {agent['agent_spec']} / single_turn: episodes/s "
              f"{agent['episodes_per_s_ratio']:.2f}x, gen tokens/s "
              f"{agent['gen_tokens_per_s_ratio']:.2f}x")
    print(f"({out / 'agent_throughput.json'})")


if __name__ == "__main__":
    main()

"""workflow=agent's config checks, shared by ``areal train`` and ``areal eval``, and the one name
an agent goes by in logs and errors. Light: importing it starts no server."""

from __future__ import annotations

from areal_cli.config.choices import AgentReward
from areal_cli.config.schema import WorkflowConfig

SHELL_WORDS = {"cd", "exec", "export", "set", "source", ".", "eval", "ulimit", "umask", "trap",
               "if", "for", "while", "until", "case", "(", "{", "!", "[", "test", "true", "false"}
"""A command may start with these (the shell's own), though PATH has no such program."""
PYTHON_AGENT = "run(client, problem) -> float | dict | None"


def agent_label(w: WorkflowConfig) -> str:
    """``workflow.agent=m:f`` or ``workflow.agent_cmd='...'``: how logs and errors name it."""
    return f"workflow.agent={w.agent}" if w.agent else f"workflow.agent_cmd={w.agent_cmd!r}"


def agent_problems(w: WorkflowConfig, runs_agent: bool) -> list[str]:
    """What is wrong with the agent keys of ``w`` (``runs_agent``: its workflow runs one), each with
    the fix; [] when nothing is."""
    if not runs_agent:
        return [f"workflow.{key}={getattr(w, key)} is set but workflow={w.name}: add "
                "workflow=agent" for key in ("agent", "agent_cmd") if getattr(w, key)]
    if w.agent and w.agent_cmd:
        return [f"workflow.agent={w.agent} and workflow.agent_cmd={w.agent_cmd!r} are both set: "
                "keep one (a Python function, or a program run per episode)"]
    if not w.agent_cmd:
        if ":" not in w.agent:
            return [f"workflow=agent needs workflow.agent=module:function (got {w.agent!r}): "
                    f"{PYTHON_AGENT}, async or not (examples/agents/); or workflow.agent_cmd="
                    "'<command>', a program run per episode"]
        program_only = {"agent_sandbox": w.agent_sandbox,
                        "agent_verifier_cmd": w.agent_verifier_cmd,
                        "agent_reward": w.agent_reward != AgentReward.task}
        return [f"workflow.{k}={getattr(w, k)} applies to workflow.agent_cmd only; a Python agent "
                "returns its reward" for k, on in program_only.items() if on]
    problems = []
    if (w.agent_reward == AgentReward.verifier) != bool(w.agent_verifier_cmd.strip()):
        problems.append(f"workflow.agent_reward={w.agent_reward} with workflow.agent_verifier_cmd="
                        f"{w.agent_verifier_cmd!r}: a verifier command goes with "
                        "agent_reward=verifier, and only with it")
    if w.agent_sandbox:
        from areal_cli.rewards.sandbox import FALLBACK, SandboxUnavailable, require

        try:
            require("bwrap")
        except SandboxUnavailable as err:
            problems.append(f"workflow.agent_sandbox=true: {err}".replace(
                FALLBACK, "or set workflow.agent_sandbox=false"))
    return problems


def command_problems(w: WorkflowConfig) -> list[str]:
    """A program (or verifier) whose first word is neither on PATH nor a file of this directory
    would fail every episode: named before the run starts."""
    import os
    import shlex
    import shutil

    problems = []
    for key in ("agent_cmd", "agent_verifier_cmd"):
        try:
            first = next(iter(shlex.split(getattr(w, key))), "")
        except ValueError as err:  # an unclosed quote
            problems.append(f"workflow.{key}={getattr(w, key)!r}: {err}")
            continue
        if first and "=" not in first and first not in SHELL_WORDS \
                and not (shutil.which(first) or os.path.exists(first)):
            problems.append(f"workflow.{key}={getattr(w, key)!r}: {first!r} is neither a program "
                            "on PATH nor a file of this directory")
    return problems

"""workflow=tool_use: an answer holding a ```python block (and no final "Answer:") runs it in the
sandbox (reward.sandbox, under the reward.code_* limits) and the model sees the output as the next
user turn, up to ``workflow.max_turns``."""

from __future__ import annotations

import concurrent.futures as cf
import re

from areal_cli.config.schema import WorkflowConfig
from areal_cli.engines.base import Engine
from areal_cli.rewards.code_reward import limits_of
from areal_cli.rewards.sandbox import announce, require, run_python
from areal_cli.workflows.length_profile import LengthProfile
from areal_cli.workflows.turns import Episode, TurnWorkflow

CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


class ToolUse(TurnWorkflow):
    """Model-written code runs in the sandbox, two calls at a time, before the turn is scored."""

    def __init__(self, cfg: WorkflowConfig, engine: Engine, rewards, tokenizer, worker: int,
                 lengths: LengthProfile | None = None):
        super().__init__(cfg, engine, rewards, tokenizer, worker, lengths)
        require(rewards.cfg.sandbox)  # no working isolation: fail here, naming the fix
        announce(rewards.cfg.sandbox)
        self.tools = cf.ThreadPoolExecutor(max_workers=2)
        self.tool_limits = limits_of(rewards.cfg)

    def tool_call(self, ep: Episode) -> cf.Future | None:
        code = CODE_BLOCK.search(ep.text)
        if code and "Answer:" not in ep.text and ep.turns < self.cfg.max_turns:
            return self.tools.submit(run_python, code.group(1), self.tool_limits,
                                     self.rewards.cfg.sandbox)
        return None


WORKFLOW = ToolUse

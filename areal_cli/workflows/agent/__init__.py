"""workflow=agent: the rollout worker's OpenAI-compatible endpoint (``server.py``) that a user's
agent calls, the engine behind it (``bridge.py``), chat rendering and tool calls (``chat.py``,
``toolcalls.py``), each episode's recorded calls (``episode.py``) and the ``Workflow`` that turns
them into trajectories (``workflow.py``, its ``WORKFLOW``)."""

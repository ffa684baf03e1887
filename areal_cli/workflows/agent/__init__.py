"""workflow=agent: the rollout worker's OpenAI-compatible endpoint (``server.py``, served by
``serving.py``; Anthropic's
Messages API in ``anthropic_api.py``) that a user's agent calls with the client it is handed
(``clients.py``), the engine behind it (``bridge.py``), chat rendering and tool calls (``chat.py``,
``toolcalls.py``), each episode's recorded calls (``episode.py``), how an agent runs — a Python
function (``runners.py``) or a program per episode (``program.py``, started by ``program_shim.py``)
— with its config checks (``checks.py``), the episode its code carries to the endpoint whatever
client it calls through (``context.py``), and the ``Workflow`` that turns them into trajectories
(``workflow.py``, its ``WORKFLOW``)."""

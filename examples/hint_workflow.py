r"""A user workflow: after a wrong answer, give a hint and let the model try once more.

Run it with:

    PYTHONPATH=examples .venv/bin/areal train workflow.name=hint_workflow:next_turn \
        workflow.max_turns=2

areal calls ``next_turn`` after every model turn, once that turn is scored. Return the next
user message to continue the episode, or None to end it; the episode's reward is the score of
its last turn. The hint tokens are environment tokens: they are in the context of the next
turn but get no loss (loss_mask 0), and the behaviour logprobs and versions stay aligned.
"""


def next_turn(completion: str, turn: int, problem, reward: float) -> str | None:
    if reward >= 1.0:
        return None
    return (f"Not quite. The expression was: {problem.prompt.splitlines()[0]} "
            "Compute it step by step and end with 'Answer: <number>'.")

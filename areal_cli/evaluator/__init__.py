"""The evaluator: one model on held-out task problems, greedy and/or sampled, scored by the
training reward pool (accuracy, avg@k, pass@k).

Three callers, none of which owns it: ``areal eval`` (``areal_cli/evaluation/``), the trainer
for ``eval.every`` and the launcher's closing evaluation. ``from areal_cli.evaluator import
evaluate`` is imported lazily so that configs and the CLI's error paths stay free of torch.
"""

__all__ = ["evaluate"]


def __getattr__(name: str):
    if name == "evaluate":
        from areal_cli.evaluator.runner import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

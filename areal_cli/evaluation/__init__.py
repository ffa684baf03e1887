"""`areal eval`: accuracy (greedy), avg@k and pass@k of models on held-out task problems.

The command (``cli.py``), its config (``config.py``), its data-parallel workers (``parallel.py``)
and its report (``report.py``); what measures one model is ``areal_cli/evaluator/``, which the
trainer and the launcher call too. ``from areal_cli.evaluation import evaluate`` is that
evaluator's ``evaluate``, imported lazily so that the config and the CLI's error paths stay
free of torch.
"""

__all__ = ["evaluate"]


def __getattr__(name: str):
    if name == "evaluate":
        from areal_cli.evaluator.runner import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Scoring models on held-out task problems: accuracy (greedy), avg@k and pass@k.

What measures one model (``runner.py``, ``metrics.py``, ``agent.py``) is called by the trainer
(``eval.every``), the launcher's closing evaluation and ``areal eval``; the command itself is
``cli.py`` with its config (``config.py``), its data-parallel workers (``parallel.py``), its sweep
over models (``sweep.py``) and its report (``report.py``). ``from areal_cli.eval import evaluate``
is imported lazily so that configs and the CLI's error paths stay free of torch.
"""

__all__ = ["evaluate"]


def __getattr__(name: str):
    if name == "evaluate":
        from areal_cli.eval.runner import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

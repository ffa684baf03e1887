"""`areal eval`: accuracy (greedy), avg@k and pass@k of models on held-out task problems.

``from areal_cli.evaluation import evaluate`` is what training calls for ``eval.every``; it is
imported lazily so that the config and the CLI's error paths stay free of torch.
"""

__all__ = ["evaluate"]


def __getattr__(name: str):
    if name == "evaluate":
        from areal_cli.evaluation.runner import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Problems from a local Hugging Face `datasets` directory written by `save_to_disk`."""

from __future__ import annotations

from pathlib import Path

from areal_cli.config.task import TaskConfig
from areal_cli.tasks.base import Problem
from areal_cli.tasks.files import Record, split_records
from areal_cli.tasks.splits import SplitReport

EVAL_SPLITS = ("test", "validation", "eval")
"""Names of a DatasetDict split used for eval when there is no eval_path (first found)."""


def load(cfg: TaskConfig, split: str) -> tuple[list[Problem], SplitReport]:
    dataset = _load_from_disk(cfg.path)
    if hasattr(dataset, "keys"):  # a DatasetDict: use its own train / test splits if present
        if "train" not in dataset:
            raise ValueError(f"{cfg.path}: DatasetDict has no 'train' split ({list(dataset)})")
        eval_name = next((n for n in EVAL_SPLITS if n in dataset), None)
        if eval_name and not cfg.eval_path:
            return split_records(cfg, split, lambda: _rows(dataset["train"], f"{cfg.path}[train]"),
                                 lambda: _rows(dataset[eval_name], f"{cfg.path}[{eval_name}]"))
        dataset = dataset["train"]
    read_eval = (lambda: _rows(_load_table(cfg.eval_path),
                               cfg.eval_path)) if cfg.eval_path else None
    return split_records(cfg, split, lambda: _rows(dataset, cfg.path), read_eval)


def _load_table(path: str):
    loaded = _load_from_disk(path)
    return loaded["train"] if hasattr(loaded, "keys") else loaded


def _load_from_disk(path: str):
    if not Path(path).expanduser().is_dir():
        raise ValueError(f"task.path={path!r}: hf_disk needs a datasets.save_to_disk directory")
    try:
        import datasets
    except ImportError as e:
        raise ValueError("task.source=hf_disk needs datasets: "
                         "pip install 'areal-cli[datasets]'") from e
    return datasets.load_from_disk(str(Path(path).expanduser()))


def _rows(dataset, where: str) -> list[tuple[int, Record]]:
    rows = [(f"{where} row {i}", dict(row)) for i, row in enumerate(dataset)]
    if not rows:
        raise ValueError(f"{where}: the dataset is empty; give a directory with at least one row")
    return list(enumerate(rows))

"""Problems from a local Hugging Face `datasets` directory written by `save_to_disk`."""

from __future__ import annotations

from pathlib import Path

from areal_cli.config.task import TaskConfig
from areal_cli.tasks.base import Problem
from areal_cli.tasks.files import Record, split_records

EVAL_SPLITS = ("test", "validation", "eval")
"""Names of a DatasetDict split used for eval when there is no eval_path (first found)."""


def load(cfg: TaskConfig, split: str) -> list[Problem]:
    dataset = _load_from_disk(cfg.path)
    if hasattr(dataset, "keys"):  # a DatasetDict: use its own train / test splits if present
        eval_name = next((n for n in EVAL_SPLITS if n in dataset), None)
        if "train" in dataset and eval_name and not cfg.eval_path:
            part = dataset["train"] if split == "train" else dataset[eval_name]
            name = "train" if split == "train" else eval_name
            return split_records(_whole(cfg), split, lambda p: _rows(part, f"{p}[{name}]"))
        if "train" not in dataset:
            raise ValueError(f"{cfg.path}: DatasetDict has no 'train' split ({list(dataset)})")
        dataset = dataset["train"]
    return split_records(cfg, split, lambda p: _rows(_load_table(p, cfg.path, dataset), p))


def _whole(cfg: TaskConfig) -> TaskConfig:
    """cfg with eval_path set, so split_records takes each named split whole (then capped)."""
    from dataclasses import replace

    return replace(cfg, eval_path=cfg.path)


def _load_table(path: str, main_path: str, main_dataset):
    if path == main_path:
        return main_dataset
    loaded = _load_from_disk(path)
    return loaded["train"] if hasattr(loaded, "keys") else loaded


def _load_from_disk(path: str):
    if not Path(path).expanduser().is_dir():
        raise ValueError(f"task.path={path!r}: hf_disk needs a datasets.save_to_disk directory")
    try:
        import datasets
    except ImportError as e:
        raise ValueError("task.source=hf_disk needs the package: pip install datasets") from e
    return datasets.load_from_disk(str(Path(path).expanduser()))


def _rows(dataset, where: str) -> list[tuple[int, Record]]:
    rows = [(f"{where} row {i}", dict(row)) for i, row in enumerate(dataset)]
    if not rows:
        raise ValueError(f"{where}: the dataset is empty; give a directory with at least one row")
    return list(enumerate(rows))

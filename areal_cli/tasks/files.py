"""Problems from JSONL, JSON (a list of objects) and Parquet files with configurable fields."""

from __future__ import annotations

import json
import math
from pathlib import Path

from areal_cli.config.task import FILE_SUFFIXES, TaskConfig
from areal_cli.tasks.base import Problem, cap, check_unique_ids, with_instruction
from areal_cli.tasks.splits import SplitReport, hold_out, normalize, pick

Record = tuple[str, dict]
"""(where it came from, e.g. "data.jsonl line 3", the record)."""

MAX_LINE_BYTES = 16 << 20
"""A JSONL line longer than this is refused (read in bounded memory: a file without newlines is
not read whole)."""
MAX_JSON_BYTES = 1 << 30
"""A .json file (read whole) larger than this is refused; JSONL is read line by line."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (only finite numbers are)")


def _parse(text: str, where: str):
    """One JSON value; ValueError naming ``where`` and the fix for anything else: invalid JSON,
    NaN/Infinity, a number of more digits than Python converts, nesting deeper than the parser."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg}); each line must be one JSON object: "
                         "fix or delete that line") from None
    except RecursionError:
        raise ValueError(f"{where}: nested deeper than the JSON parser's limit; fix or delete "
                         "that record") from None
    except ValueError as e:  # NaN/Infinity, or an integer past Python's digit limit
        raise ValueError(f"{where}: {e}; fix or delete that record") from None


def load(cfg: TaskConfig, split: str) -> tuple[list[Problem], SplitReport]:
    read_eval = (lambda: read_records(cfg.eval_path)) if cfg.eval_path else None
    return split_records(cfg, split, lambda: read_records(cfg.path), read_eval)


def split_records(cfg: TaskConfig, split: str, read_train, read_eval=None) -> tuple[list[Problem],
                                                                                    SplitReport]:
    """Train/eval problems disjoint by content (normalised prompt field).

    With an eval source (``read_eval``): eval is its distinct problems (the first eval_size; 0 =
    all), train the records of ``read_train`` whose content is not among them. Without: the
    distinct problems of ``read_train`` are shuffled by seed and the first are held out
    (eval_size, or eval_fraction of them), the rest train. Train is capped at task.size."""
    where = cfg.eval_path if split == "eval" and read_eval else cfg.path
    train = _problems(read_train(), cfg)
    if read_eval:
        held = _problems(read_eval(), cfg)
        held_keys = {p.key for p in held}
        source = held if split == "eval" else train
        chosen, report = pick([p.key for p in source], split, held_keys)
        problems = [source[i] for i in chosen]
        if split == "eval" and cfg.eval_size:
            problems = problems[: cfg.eval_size]
    else:
        keys = [p.key for p in train]
        eval_n = cfg.held_out_count(len(set(keys)))
        chosen, report = hold_out(keys, split, eval_n, cfg.seed)
        problems = [train[i] for i in chosen]
    if split == "train":
        problems = cap(problems, cfg.size)
    report.problems, report.distinct = len(problems), len({p.key for p in problems})
    if not problems:
        raise ValueError(
            f"{where}: the {split} split is empty ({report.draws} records, {len(report.seen)} "
            f"distinct, task.eval_size={cfg.eval_size}, task.eval_fraction={cfg.eval_fraction}); "
            "add data, or lower task.eval_size (0 = task.eval_fraction of the distinct problems)"
        )
    return problems, report


def _problems(records: list[tuple[int, Record]], cfg: TaskConfig) -> list[Problem]:
    """Every record as a Problem; ids unique within the file (whichever split a record lands in)."""
    problems = [to_problem(where, rec, cfg, index) for index, (where, rec) in records]
    check_unique_ids(problems, records[0][1][0].rsplit(" ", 2)[0] if records else "")
    return problems


def read_records(path: str) -> list[tuple[int, Record]]:
    """Every record of a file as (index, (where, record)); an empty file is an error."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"task.path={path!r} does not exist: give an existing file")
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}
    if p.suffix not in readers:
        raise ValueError(f"{path}: unsupported file type; use one of {', '.join(FILE_SUFFIXES)}")
    records = readers[p.suffix](p)
    if not records:
        raise ValueError(f"{path}: the dataset is empty; give a file with at least one record")
    for where, rec in records:
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    return list(enumerate(records))


def to_problem(where: str, rec: dict, cfg: TaskConfig, index: int) -> Problem:
    fields = [cfg.prompt_field, cfg.answer_field] + ([cfg.id_field] if cfg.id_field else [])
    for name in fields:
        if name not in rec:
            raise ValueError(
                f"{where}: missing field {name!r}; fields present: {sorted(rec)}. "
                "Set task.prompt_field / task.answer_field / task.id_field to match"
            )
    used = set(fields)
    answer = rec[cfg.answer_field]
    if isinstance(answer, float) and not math.isfinite(answer):
        raise ValueError(f"{where}: the answer ({cfg.answer_field!r}) is {answer}, not a finite "
                         "number: fix or delete that record")
    if not str(rec[cfg.prompt_field]).strip():
        raise ValueError(f"{where}: the prompt ({cfg.prompt_field!r}) is empty: fix or delete "
                         "that record")
    return Problem(
        id=str(rec[cfg.id_field]) if cfg.id_field else f"{cfg.name}/{index}",
        prompt=with_instruction(str(rec[cfg.prompt_field]), cfg.instruction),
        answer=str(rec[cfg.answer_field]),
        meta=json.loads(json.dumps({k: v for k, v in rec.items() if k not in used}, default=str)),
        key=normalize(str(rec[cfg.prompt_field])),
    )


def _decode(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8; ValueError naming ``where`` and the byte otherwise."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                         "data files must be UTF-8: re-encode the file (e.g. iconv -t UTF-8) or "
                         "fix that line") from None


def _read_jsonl(p: Path) -> list[Record]:
    records = []
    with p.open("rb") as f:
        lineno = 0
        while raw := f.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            where = f"{p} line {lineno}"
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(f"{where}: longer than {MAX_LINE_BYTES:,} bytes; a record must "
                                 "fit on one line of that size: fix or delete that line")
            line = _decode(raw, where)
            if line.strip():
                records.append((where, _parse(line, where)))
    return records


def _read_json(p: Path) -> list[Record]:
    if p.stat().st_size > MAX_JSON_BYTES:
        raise ValueError(f"{p}: larger than {MAX_JSON_BYTES >> 30} GiB, which a .json file is read "
                         "whole for; write it as JSONL (one object a line), read line by line")
    for lineno, raw in enumerate(p.read_bytes().splitlines(), start=1):
        _decode(raw, f"{p} line {lineno}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"{p} line {e.lineno}: not valid JSON ({e.msg}); fix the file") from e
    except RecursionError:
        raise ValueError(f"{p}: nested deeper than the JSON parser's limit; fix the file") from None
    except ValueError as e:
        raise ValueError(f"{p}: {e}; fix the file") from None
    if not isinstance(data, list):
        raise ValueError(f"{p}: expected a JSON list of objects at the top level")
    return [(f"{p} item {i}", rec) for i, rec in enumerate(data)]


def _read_parquet(p: Path) -> list[Record]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ValueError("reading Parquet needs pyarrow: pip install 'areal-cli[datasets]'") from e
    rows = pq.read_table(p).to_pylist()
    return [(f"{p} row {i}", rec) for i, rec in enumerate(rows)]

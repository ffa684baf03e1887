"""What `areal eval` shows and writes: one table (rows = task × model), eval.json, eval.md.

Rates (accuracy, avg@k, pass@k, truncation) are printed as percentages with one decimal,
mean length in tokens with one decimal; eval.json keeps the unrounded fractions and every
sample: prompt id, pass ("greedy" | "sample"), completion, extracted answer, reference, score.
"""

from __future__ import annotations

import json
from pathlib import Path

from areal_cli.durable import atomic_write

LABELS = {"problems": "n", "accuracy": "acc (greedy)", "mean_reward": "reward",
          "mean_length": "len",
          "truncation_rate": "trunc"}
HIDDEN = ("mean_reward",)  # in eval.json only


def columns(results: list[dict]) -> list[str]:
    """Metric keys in display order: n, accuracy, avg@k, pass@k…, len, trunc."""
    keys: list[str] = []
    for r in results:
        keys += [k for k in r["metrics"] if k not in keys and k not in HIDDEN]
    order = ["problems", "accuracy"]
    middle = [k for k in keys if k.startswith("avg@")]
    middle += sorted((k for k in keys if k.startswith("pass@")), key=lambda k: int(k[5:]))
    return [k for k in order if k in keys] + middle + [k for k in ("mean_length", "truncation_rate")
                                                       if k in keys]


def label(key: str) -> str:
    return LABELS.get(key, key) + ("" if key in ("problems", "mean_length") else " %")


def cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "problems":
        return str(value)
    if key == "mean_length":
        return f"{value:.1f}"
    return f"{100 * value:.1f}"


def rows(results: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the summary, shared by the terminal table and eval.md."""
    keys = columns(results)
    header = ["task", "model"] + [label(k) for k in keys] + ["time s"]
    body = [[r["task"], r["model"]] + [cell(k, r["metrics"].get(k)) for k in keys]
            + [f"{r['wall_s']:.0f}"]
            for r in sorted(results, key=lambda r: r["task"])]
    return header, body


def print_table(results: list[dict], console=None) -> None:
    """The summary on stdout: numbers never wrap; task and model names fold on a narrow terminal,
    and a pipe or file gets the table at its full width."""
    import sys

    from rich.console import Console
    from rich.table import Table

    header, body = rows(results)
    table = Table(title="areal eval")
    for i, name in enumerate(header):
        if i < 2:
            longest = max(len(name), *(len(row[i]) for row in body))
            table.add_column(name, overflow="fold", min_width=min(longest, 24))
        else:
            table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    for row in body:
        table.add_row(*row)
    if console is None:
        full = sum(max(len(c) for c in col) + 3 for col in zip(header, *body, strict=True)) + 1
        console = Console() if sys.stdout.isatty() else Console(width=max(full, Console().width))
    console.print(table)


def write(results: list[dict], out_dir: Path, run: dict) -> None:
    """eval.json (everything) and eval.md (the table, then every sample) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "eval.json", json.dumps({"run": run, "results": results}, indent=1))
    atomic_write(out_dir / "eval.md", markdown(results, run))


def markdown(results: list[dict], run: dict) -> str:
    header, body = rows(results)
    lines = ["# areal eval", "", _settings(run), "", _md_row(header),
             _md_row(["---"] * len(header))]
    lines += [_md_row(r) for r in body]
    for r in results:
        lines += ["", f"## {r['task']} — {r['model']}", "",
                  _md_row(["prompt id", "pass", "#", "answer", "reference", "score", "tokens",
                           "finish",
                           "completion"]), _md_row(["---"] * 9)]
        lines += [_md_row([s["prompt_id"], s["pass"], str(s["sample"]), str(s["answer"]),
                           s["reference"],
                           f"{s['score']:g}", str(s["length"]), s["finish_reason"],
                           s["completion"]])
                  for s in r["samples"]]
    return "\n".join(lines) + "\n"


def _settings(run: dict) -> str:
    keys = ("n_samples", "temperature", "top_p", "max_new_tokens", "seed")
    return ", ".join(f"{k}={run[k]}" for k in keys if k in run)


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(_md_escape(c) for c in cells) + " |"


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")

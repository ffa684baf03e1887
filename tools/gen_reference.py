"""Write the site's reference pages from the code: every config key from the typed schema's field
docstrings (with the value ``conf/`` gives it), and every command of the CLI from Typer.

    python tools/gen_reference.py [OUT_DIR]      # default docs/reference; `make docs` runs it

The pages are build outputs (ignored by git); ``tests/docs/test_reference.py`` checks that the
config page names every key of the schema.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import re
import sys
import textwrap
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def field_docs(cls: type) -> dict[str, str]:
    """{field: its docstring} of a dataclass: the string literal right after each annotated field."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _type_name(tp) -> str:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in tp)
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def keys(cls: type, value, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, value, docstring) of every field of ``cls``, nested dataclasses expanded;
    ``value``: an instance holding the values to show."""
    hints, docs, out = typing.get_type_hints(cls), field_docs(cls), []
    for f in dataclasses.fields(cls):
        tp, current = hints[f.name], getattr(value, f.name)
        if dataclasses.is_dataclass(tp):
            out.append((prefix + f.name, "group", "", docs.get(f.name, tp.__doc__ or "")))
            out += keys(tp, current, f"{prefix}{f.name}.")
        else:
            shown = current.value if isinstance(current, enum.Enum) else current
            out.append((prefix + f.name, _type_name(tp), repr(shown), docs.get(f.name, "")))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(rows: list[tuple[str, str, str, str]]) -> list[str]:
    lines = ["| key | type | value | meaning |", "|---|---|---|---|"]
    for key, tp, value, doc in rows:
        if tp == "group":
            lines.append(f"| **`{key}`** | | | {_cell(doc)} |")
        else:
            lines.append(f"| `{key}` | {tp} | `{_cell(value)}` | {_cell(doc)} |")
    return lines


def config_rows() -> tuple[list, list]:
    """The rows of `areal train`'s keys and of `areal eval`'s, with conf/'s values."""
    from areal_cli.config.schema import RootConfig
    from areal_cli.eval.config import EvalRunConfig, compose_eval
    from areal_cli.runconfig.compose import compose

    return keys(RootConfig, compose([])), keys(EvalRunConfig, compose_eval([])[0])


def config_page() -> str:
    train, evaluate = config_rows()
    head = [
        "# Config keys",
        "",
        "Generated from the typed schema (`areal_cli/config/`, `areal_cli/eval/config.py`): every",
        "key, its type, the value `conf/` gives it (before `auto` is resolved) and its docstring. Set any",
        "of them on the command line as `key=value`; config groups (`algorithm=`, `task=`, `engine=`,",
        "`workflow=`, `launcher=`, `reward=`, `precision=`) swap in a file of `conf/<group>/`. A wrong key,",
        "type or value exits 2 before any process starts, naming the key and the fix.",
        "",
        "Keys that tools and tests rely on: `run_dir`, `model`, `task`, `engine`, `seed`, `trainer.steps`,",
        "`trainer.batch_size` (prompt groups per step), `trainer.lr`, `rollout.group_size`,",
        "`rollout.max_staleness`, `rollout.max_new_tokens`, `rollout.workers`, `trainer.ranks`.",
        "",
        "## `areal train` (`conf/config.yaml`)",
        "",
    ]
    evals = ["", "## `areal eval` (`conf/eval.yaml`)", "",
             "The `task.*`, `reward.*`, `engine.*` and `workflow.*` keys are those of `areal train`.", ""]
    short = [r for r in evaluate if not r[0].startswith(("task.", "reward.", "engine.", "workflow."))]
    return "\n".join(head + _table(train) + evals + _table(short)) + "\n"


def _command_lines(name: str, cmd) -> list[str]:
    lines = [f"## `{name}`", "", inspect.cleandoc(cmd.help or ""), ""]
    ctx = cmd.context_class(cmd, info_name=name)
    usage = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), cmd.get_usage(ctx).replace("Usage: ", ""))
    lines += ["```", usage, "```", ""]
    params = [p for p in cmd.params if p.name != "help"]
    if params:
        lines += ["| argument or option | meaning |", "|---|---|"]
        for p in params:
            label = " / ".join(p.opts) if p.param_type_name == "option" else p.name.upper()
            lines.append(f"| `{label}` | {_cell(getattr(p, 'help', None) or '')} |")
        lines.append("")
    return lines


def cli_page() -> str:
    import typer

    from areal_cli.cli import app

    root = typer.main.get_command(app)
    lines = ["# Command line", "", "Generated from the Typer app (`areal_cli/cli.py`).", "",
             inspect.cleandoc(root.help or ""), ""]

    def walk(group, prefix: str) -> None:
        for name, cmd in sorted(group.commands.items()):
            if hasattr(cmd, "commands"):
                walk(cmd, f"{prefix} {name}")
            else:
                lines.extend(_command_lines(f"{prefix} {name}", cmd))

    walk(root, "areal")
    return "\n".join(lines) + "\n"


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.md").write_text(config_page())
    (out / "cli.md").write_text(cli_page())
    print(f"wrote {out / 'config.md'} and {out / 'cli.md'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "reference")

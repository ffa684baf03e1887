"""The shell blocks of README.md and docs/ that are marked runnable, and how each line is checked.

A block is runnable when the line before its fence is ``<!-- runnable -->``. Every line of it must
be an ``areal`` or ``make`` command (``#`` comments, ``\\`` continuations and a ``.venv/bin/``
prefix allowed); anything else fails, so an unmarkable block stays unmarked. ``check_line`` applies
the rewrite rules below; none of them starts a training process, and each fails the way the command
would for a reader: a renamed key, preset, option, command or make target.

- ``areal train ARGS`` and ``make train ARGS="..."``: composed and planned as ``areal train
  --dry-run`` does (config validation, ranges, model lookup, device map, the exact commands), with
  ``run_dir`` in a temporary directory; on 8 pretend GPUs where the line names GPUs
  (``gpus``) or ``engine=vllm``, else on this machine's devices; ``launcher=slurm``: the sbatch
  script is built as ``--dry-run`` prints it; ``resume=<…>``: resumed from a real run (``RUN``).
- ``areal eval ARGS``: its configs composed and validated, every model named found (none loads).
- ``areal bench sync-vs-async ARGS``: the bench options and the run's config composed.
- ``areal tasks [NAME]``: run as is.
- ``areal status RUN`` and ``areal plot RUN ...``: run as is.
- A Hub id (``model=Org/Name`` or an alias of one) is resolved offline from a Hub cache holding a
  tiny model under that id (``tests/hub_cache.py``).
- In every line, a ``<placeholder>`` or ``runs/…`` path is a real 2-step run of a tiny model
  (``RUN``, with a step checkpoint and ``checkpoints/final``).
- ``make TARGET``: the target must be in the Makefile.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

MARKER = "<!-- runnable -->"
PLACEHOLDER = re.compile(r"(?:runs/)?<[^>]+>|runs/[\w.-]+")


@dataclass
class Line:
    """One command of a runnable block: where it is written and its words."""

    where: str
    words: list[str]

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.words)}"


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def runnable_lines(path: Path, root: Path) -> list[Line]:
    """The commands of every block of ``path`` marked runnable."""
    lines, out = path.read_text().splitlines(), []
    for i, text in enumerate(lines):
        if text.strip() != MARKER:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            raise ValueError(f"{path.relative_to(root)}:{i + 1}: {MARKER} must sit on the line "
                             "before a ``` fence")
        j, pending = i + 2, ""
        while j < len(lines) and not lines[j].startswith("```"):
            pending += lines[j].rstrip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
            else:
                words = shlex.split(pending, comments=True)
                if words:
                    out.append(Line(f"{path.relative_to(root)}:{j + 1}", words))
                pending = ""
            j += 1
    return out


def needs_run(line: Line) -> bool:
    """Whether the line reads a run: a path placeholder, a resume, status or plot."""
    words = line.words[1:]
    return words[:1] in (["status"], ["plot"]) or any(PLACEHOLDER.search(w)
                                                      or w.startswith("resume=")
                                                      for w in words)


def _strip_venv(words: list[str]) -> list[str]:
    return ["areal", *words[1:]] if words[0].endswith("/areal") else words


def check_line(line: Line, tmp: Path, run: Path, makefile: Path) -> None:
    """Raise (AssertionError, ValueError, ConfigError, SystemExit) where the command would fail."""
    words = _strip_venv(line.words)
    if words[0] == "make":
        return _make(words[1:], tmp, makefile)
    assert words[0] == "areal", f"{line}: a runnable block holds areal and make commands only"
    cmd, args = words[1], [PLACEHOLDER.sub(str(run), a) for a in words[2:]]
    if cmd == "train":
        return _train([a for a in args if a not in ("--dry-run", "--no-checks", "--quiet")], tmp,
                      run)
    if cmd == "eval":
        from areal_cli.eval.cli import _models
        from areal_cli.eval.config import compose_eval

        # every model named must exist (a run needs checkpoints/final)
        _models(compose_eval(args)[0])
        return None
    if cmd == "bench":
        assert args[:1] == ["sync-vs-async"], f"{line}: unknown bench {args[:1]}"
        from areal_cli.bench.sync_vs_async import split_overrides
        from areal_cli.runconfig.compose import compose

        compose(split_overrides(args[1:])[0])
        return None
    if cmd in ("tasks", "status", "plot"):
        return _cli([cmd, *args], tmp)
    raise AssertionError(f"{line}: `areal {cmd}` is not a command of areal")


def _make(args: list[str], tmp: Path, makefile: Path) -> None:
    targets = [a for a in args if "=" not in a]
    if targets == ["train"]:
        extra = next((a.split("=", 1)[1] for a in args if a.startswith("ARGS=")), "")
        return _train(shlex.split(extra), tmp, None)
    proc = subprocess.run(["make", "-n", "-f", str(makefile), *targets], capture_output=True,
                          text=True,
                          cwd=makefile.parent)
    assert "No rule to make target" not in proc.stderr, proc.stderr


def _train(args: list[str], tmp: Path, run: Path | None) -> None:
    from areal_cli.launcher.devices import visible_gpus
    from areal_cli.launcher.plan import make_plan
    from areal_cli.launcher.run import resume_config
    from areal_cli.runconfig.compose import compose

    resumed = [a for a in args if a.startswith("resume=")]
    if resumed:
        assert run is not None
        cfg = resume_config(str(run), [a for a in args if a not in resumed])
    else:
        cfg = compose([*args, f"run_dir={tmp / 'run'}"])
    cfg.dry_run = True
    if cfg.launcher.name == "slurm":
        from areal_cli.launcher.slurm import build

        build(cfg)
        return
    gpus = list(range(8)) if any("gpus" in a or a == "engine=vllm"
                                 for a in args) else visible_gpus()
    make_plan(cfg, gpus=gpus)


def _cli(args: list[str], tmp: Path) -> None:
    import os
    import sys

    proc = subprocess.run([sys.executable, "-m", "areal_cli.cli", *args], capture_output=True,
                          text=True,
                          cwd=tmp, timeout=120, env={**os.environ, "MPLBACKEND": "Agg"})
    assert (proc.returncode
            == 0), (f"areal {shlex.join(args)} exited "
                    f"{proc.returncode}:\n{proc.stdout}\n{proc.stderr}")

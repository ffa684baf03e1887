"""The generated reference names every key of the schema (each with its docstring) and every command
of the CLI: a key added without a docstring, or a page that lost one, fails here."""

from __future__ import annotations

import dataclasses
import sys
import typing

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import gen_reference  # noqa: E402


def dotted(cls: type, prefix: str = "") -> list[str]:
    """Every key of a config dataclass, nested ones as group.key, walked from the dataclasses
    alone."""
    out, hints = [], typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out.append(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out += dotted(hints[f.name], f"{prefix}{f.name}.")
    return out


def test_config_reference_lists_every_schema_key_with_its_docstring():
    from areal_cli.config.schema import RootConfig
    from areal_cli.eval.config import EvalRunConfig

    page = gen_reference.config_page()
    train, evaluate = page.split("## `areal eval`")
    missing = [k for k in dotted(RootConfig) if f"`{k}`" not in train]
    missing += [k for k in dotted(EvalRunConfig) if f"`{k}`" not in evaluate and not k.startswith(
        ("task", "reward", "engine", "workflow"))]
    assert not missing, f"not in the config reference: {missing}"
    rows, _ = gen_reference.config_rows()
    undocumented = [key for key, tp, _, doc in rows if tp != "group" and not doc]
    assert not undocumented, f"schema fields without a docstring: {undocumented}"


def test_config_reference_shows_the_values_conf_gives():
    page = gen_reference.config_page()
    assert "| `trainer.steps` | int | `30` |" in page  # conf/config.yaml's value, not a made-up one
    assert "| `rollout.max_staleness` | int |" in page


def test_cli_reference_lists_every_command():
    page = gen_reference.cli_page()
    for cmd in ("areal train", "areal eval", "areal bench sync-vs-async", "areal tasks",
                "areal status",
                "areal plot"):
        assert f"## `{cmd}`" in page
    assert "`--dry-run`" in page

"""A config.yaml read back into the typed schema, unchecked: what a run's own processes do with the
file the launcher wrote after checking it (``runconfig/compose.py`` composes and checks configs)."""

from __future__ import annotations

import functools
import re
import typing
from dataclasses import is_dataclass
from enum import Enum
from pathlib import Path

from areal_cli.config.choices import listed
from areal_cli.config.engine import moved_key_problem, moved_key_problems
from areal_cli.config.schema import RootConfig


class ConfigError(ValueError):
    """A config the user must fix; ``str()`` lists every problem and its fix."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(f"  - {p}" for p in problems))


@functools.cache
def choice_at(root: type, key: str) -> type[Enum] | None:
    """The enum type of dotted ``key`` in the config dataclass ``root``; None if it is no choice."""
    t = root
    for part in key.split("."):
        hints = typing.get_type_hints(t) if is_dataclass(t) else {}
        if part not in hints:
            return None
        t = hints[part]
    return t if isinstance(t, type) and issubclass(t, Enum) else None


def _chain(err: BaseException | None):
    """``err`` and the exceptions it was raised from or during, innermost last."""
    while err is not None:
        yield err
        err = err.__cause__ or err.__context__


def choice_message(err: BaseException | None) -> str:
    """"key=value: use a, b or c" for a value outside a choice anywhere in ``err``'s chain; "" if
    none."""
    for e in _chain(err):
        key = getattr(e, "full_key", None) or ""
        found = re.search(r"Invalid value '(.*)', expected one of",
                          str(getattr(e, "msg", "") or e))
        choices = choice_at(RootConfig, key) if key else None
        if found and choices:
            quote = " (in YAML quoted: 'true', 'false')" if found.group(1) in ("True",
                                                                               "False") else ""
            return f"{key}={found.group(1)}: use {listed(choices)}{quote}"
    return ""


def moved_message(err: BaseException | None) -> str:
    """"engine.max_model_len moved to engine.vllm.max_model_len" where ``err``'s chain is about a
    key that moved (``config/engine.py``, ``MOVED_KEYS``); "" if none."""
    found = (moved_key_problem(getattr(e, "full_key", None) or "") for e in _chain(err))
    return next((m for m in found if m), "")


def known_message(err: BaseException | None) -> str:
    """What ``err``'s chain says in the config's own terms (a value outside a choice, a key that
    moved); "" if neither."""
    return choice_message(err) or moved_message(err)


def to_root(cfg) -> RootConfig:
    """An OmegaConf config merged into the schema: unknown keys and wrong types are a
    ``ConfigError``; a key that moved (``engine.max_model_len``) is one naming its new place."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    moved = moved_key_problems(cfg)
    if moved:
        raise ConfigError(moved)
    schema = OmegaConf.structured(RootConfig)
    try:
        merged = OmegaConf.merge(schema, cfg)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError([_schema_message(err)]) from None


def _schema_message(err: Exception) -> str:
    if known := known_message(err):
        return known
    key = getattr(err, "full_key", None) or ""
    msg = getattr(err, "msg", None) or str(err).splitlines()[0]
    if "not in struct" in msg or "Key '" in msg and "not in" in msg:
        return (f"unknown key '{key}': check the spelling (`areal train --dry-run` prints every "
                "valid key)")
    return f"{key}: {msg.splitlines()[0]} (give a value of the documented type)"


def read_yaml(path: str | Path, private: bool = True) -> RootConfig:
    """A run's ``config.yaml`` as written by the launcher, unchecked (it was checked before it was
    written). ``private``: read only when it is the running user's alone
    (``areal_cli/private.py``)."""
    from omegaconf import OmegaConf

    from areal_cli.private import read_private

    text = read_private(path).decode() if private else Path(path).read_text()
    return to_root(OmegaConf.create(text))

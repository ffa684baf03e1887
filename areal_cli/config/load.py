"""Compose ``conf/`` + overrides into a validated ``RootConfig``; every problem reported at once."""

from __future__ import annotations

import os
from pathlib import Path

from areal_cli.config.ranges import check_ranges, drop_repeats
from areal_cli.config.schema import RootConfig


class ConfigError(ValueError):
    """A config the user must fix; ``str()`` lists every problem and its fix."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(f"  - {p}" for p in problems))


def conf_dir() -> Path:
    """The ``conf/`` directory: ``AREAL_CONF_DIR``, else the one beside the package."""
    env = os.environ.get("AREAL_CONF_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "conf"


def compose(overrides: list[str], config_name: str = "config") -> RootConfig:
    """Hydra composition of conf/ with ``key=value`` overrides, checked against the schema."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _register_schema()
    try:
        with initialize_config_dir(str(conf_dir()), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError([_hydra_message(err)]) from None
    return from_dictconfig(cfg)


def _register_schema() -> None:
    """conf/config.yaml starts from this schema, so every documented key is overridable."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="areal_schema", node=RootConfig)


def _hydra_message(err: Exception) -> str:
    lines = [x.strip() for x in str(err).strip().splitlines() if x.strip()]
    text = lines[0]
    if text.startswith("Error merging override"):
        cause = str(err.__cause__ or (lines[1] if len(lines) > 1 else "")).strip().splitlines()
        text = f"{text}: {cause[0] if cause else 'wrong type'} (give a value of the documented type)"
    if "Could not find" in text or "not found in" in text.lower():
        return f"{text} (see `ls conf/` for the groups and their options)"
    if "is not in struct" in text or "Could not override" in text or "Key '" in text:
        return f"{text} (check the spelling; `areal train --dry-run` prints every valid key)"
    return text


def from_dictconfig(cfg) -> RootConfig:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    schema = OmegaConf.structured(RootConfig)
    try:
        merged = OmegaConf.merge(schema, cfg)
        root: RootConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError([_schema_message(err)]) from None
    problems = validate(root)
    if problems:
        raise ConfigError(problems)
    return root


def _schema_message(err: Exception) -> str:
    key = getattr(err, "full_key", None) or ""
    msg = getattr(err, "msg", None) or str(err).splitlines()[0]
    if "not in struct" in msg or "Key '" in msg and "not in" in msg:
        return f"unknown key '{key}': check the spelling (`areal train --dry-run` prints every valid key)"
    return f"{key}: {msg.splitlines()[0]} (give a value of the documented type)"


def load_yaml(path: str | Path) -> RootConfig:
    """Read a resolved ``config.yaml`` written by ``save_yaml``."""
    from omegaconf import OmegaConf

    return from_dictconfig(OmegaConf.load(path))


def save_yaml(cfg: RootConfig, path: str | Path) -> None:
    from areal_cli.durable import atomic_write

    atomic_write(path, to_yaml(cfg))


def to_yaml(cfg: RootConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def validate(cfg: RootConfig) -> list[str]:
    """Every numeric setting in its range (config/ranges.py), then the cross-field checks of the
    whole config (each role's own checks included); a key out of range is reported once."""
    generic = check_ranges(cfg)
    problems = generic + drop_repeats(generic, _cross_field(cfg))
    return problems


def _cross_field(cfg: RootConfig) -> list[str]:
    problems = cfg.task.validate() + cfg.reward.validate() + cfg.algorithm.validate()
    r, t = cfg.rollout, cfg.trainer
    if cfg.launcher.heartbeat_s * 3 > cfg.launcher.peer_timeout_s:
        problems.append(f"launcher.heartbeat_s={cfg.launcher.heartbeat_s:g} must be at most a third of "
                        f"launcher.peer_timeout_s={cfg.launcher.peer_timeout_s:g}: lower heartbeat_s")
    if (t.batch_size * r.group_size) % t.ranks:
        problems.append(
            f"trainer.batch_size × rollout.group_size = {t.batch_size * r.group_size} samples do not split "
            f"evenly over trainer.ranks={t.ranks}: choose a batch_size or ranks that divides it"
        )
    if r.group_size < 2 and cfg.algorithm.adv_estimator in ("grpo", "rloo", "dr_grpo", "reinforce_pp_baseline"):
        problems.append(
            f"rollout.group_size={r.group_size}: algorithm {cfg.algorithm.adv_estimator} compares samples "
            "within a group; use rollout.group_size>=2"
        )
    if cfg.algorithm.overlong_buffer >= r.max_new_tokens and cfg.algorithm.overlong_buffer > 0:
        problems.append(
            f"algorithm.overlong_buffer={cfg.algorithm.overlong_buffer} must be < rollout.max_new_tokens="
            f"{r.max_new_tokens}: lower the buffer or raise max_new_tokens"
        )
    if (cfg.eval.every or cfg.eval.at_end) and not 0 < cfg.eval.size <= cfg.task.eval_size:
        problems.append(f"eval.size={cfg.eval.size} must be in 1..task.eval_size={cfg.task.eval_size}: "
                        "lower eval.size or raise task.eval_size")
    if r.batch_order not in ("finished", "admission"):
        problems.append(f"rollout.batch_order={r.batch_order!r}: use finished or admission")
    if cfg.engine.name not in ("hf", "vllm"):
        problems.append(f"engine={cfg.engine.name!r}: use engine=hf or engine=vllm")
    if cfg.launcher.name not in ("local", "slurm"):
        problems.append(f"launcher={cfg.launcher.name!r}: use launcher=local or launcher=slurm")
    if cfg.trainer.dtype not in ("auto", "bfloat16", "float16", "float32"):
        problems.append("trainer.dtype: use auto, bfloat16, float16 or float32")
    if cfg.engine.dtype not in ("auto", "bfloat16", "float16", "float32"):
        problems.append("engine.dtype: use auto, bfloat16, float16 or float32")
    e = cfg.engine
    if e.pause_mode not in ("abort", "keep"):
        problems.append(f"engine.pause_mode={e.pause_mode!r}: use abort or keep")
    if e.weight_update not in ("auto", "reload", "inplace"):
        problems.append(f"engine.weight_update={e.weight_update!r}: use auto, reload or inplace")
    if e.weight_update == "inplace" and e.tensor_parallel_size != 1:
        problems.append("engine.weight_update=inplace needs engine.tensor_parallel_size=1: use reload with TP")
    if str(e.lm_head_fp32).lower() not in ("auto", "true", "false"):
        problems.append(f"engine.lm_head_fp32={e.lm_head_fp32!r}: use auto, true or false")
    if cfg.weights.backend not in ("auto", "nccl", "gloo"):
        problems.append(f"weights.backend={cfg.weights.backend!r}: use auto, nccl or gloo")
    if cfg.resume and not (Path(cfg.resume) / "config.yaml").is_file():
        problems.append(f"resume={cfg.resume}: no config.yaml there; give the run_dir of an earlier run")
    return problems


"""Compose ``conf/`` + overrides into a validated ``RootConfig``; every problem reported at once."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from areal_cli.config.engine import moved_override_problems
from areal_cli.config.ranges import check_ranges, drop_repeats
from areal_cli.config.read import ConfigError, choice_at, known_message, to_root
from areal_cli.config.schema import RootConfig
from areal_cli.config.trackers import problems as tracking_problems
from areal_cli.engines import unknown as unknown_engine
from areal_cli.runconfig.bounds import run_bounds
from areal_cli.rundir import RunDir
from areal_cli.workflows import workflow_spec
from areal_cli.workflows.agent.checks import agent_problems


def conf_dir() -> Path:
    """The ``conf/`` directory: ``AREAL_CONF_DIR``; else the one installed inside the package
    (``areal_cli/conf``, from a wheel or ``pip install .``); else, in a checkout or an editable
    install, the repository's own ``conf/`` beside the package."""
    env = os.environ.get("AREAL_CONF_DIR")
    if env:
        return Path(env)
    installed = Path(str(importlib.resources.files("areal_cli") / "conf"))
    if installed.is_dir():
        return installed
    checkout = Path(__file__).resolve().parents[2] / "conf"
    if not checkout.is_dir():
        raise ConfigError([f"no conf/ directory: neither {installed} nor {checkout} exists; "
                           "reinstall areal-cli (pip install .), or set AREAL_CONF_DIR to a conf/ "
                           "directory"])
    return checkout


def compose(overrides: list[str], config_name: str = "config") -> RootConfig:
    """Hydra composition of conf/ with ``key=value`` overrides, checked against the schema."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if moved := moved_override_problems(overrides):  # engine.max_model_len=...: its new place
        raise ConfigError(moved)
    _register_schema()
    rest, params = split_task_params(quote_choices(overrides))
    try:
        with initialize_config_dir(str(conf_dir()), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=rest)
        apply_task_params(cfg, rest, params, config_name)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError([_hydra_message(err)]) from None
    return from_dictconfig(cfg)


def split_task_params(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(overrides for Hydra, overrides of task.params): params are set after composition, so a
    key the preset lacks is no error and `task.params={...}` replaces the preset's params."""
    def is_param(o: str) -> bool:
        key = o.split("=", 1)[0].lstrip("+~")
        return key == "task.params" or key.startswith("task.params.")

    return [o for o in overrides if not is_param(o)], [o for o in overrides if is_param(o)]


def apply_task_params(cfg, rest: list[str], params: list[str], config_name: str) -> None:
    """Set the task.params overrides on a composed config. A task.dataset other than the task
    preset's starts from no params (the preset's belong to its dataset) and names the task
    after the dataset unless task.name is given."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    keys = {o.split("=", 1)[0].lstrip("+~") for o in rest}
    switched = cfg.task.get("dataset") != _preset(rest, config_name).get("dataset",
                                                                         cfg.task.get("dataset"))
    parsed = OverridesParser.create().parse_overrides(params)
    with open_dict(cfg):
        if switched and "task.name" not in keys:
            cfg.task.name = cfg.task.dataset
        if switched or any(o.key_or_group == "task.params" for o in parsed):
            cfg.task.params = {}
        for o in parsed:
            if o.key_or_group == "task.params":
                cfg.task.params = OmegaConf.create(o.value() or {})
            elif o.is_delete():
                cfg.task.params.pop(o.key_or_group.removeprefix("task.params."), None)
            else:
                OmegaConf.update(cfg, o.key_or_group, o.value(), force_add=True)


def quote_choices(overrides: list[str], root: type = RootConfig) -> list[str]:
    """The overrides, each value of a choice (an enum field) quoted: Hydra would read
    `engine.lm_head_fp32=true` (or True) as YAML's boolean, which is no member of the enum."""
    out = []
    for o in overrides:
        key, eq, value = o.partition("=")
        if eq and value and value[0] not in "'\"$[{" and choice_at(root, key.lstrip("+~")):
            o = f"{key}='{value.lower() if value.lower() in ('true', 'false') else value}'"
        out.append(o)
    return out


def _preset(overrides: list[str], config_name: str) -> dict:
    """The task preset file chosen (`task=` or the config's default), as a dict; {} if none."""
    from omegaconf import OmegaConf

    chosen = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == "task"
              and "=" in o]
    if not chosen:
        loaded = OmegaConf.load(conf_dir() / f"{config_name}.yaml")
        defaults = OmegaConf.to_container(loaded).get("defaults", [])
        chosen = [d["task"] for d in defaults if isinstance(d, dict) and "task" in d]
    path = conf_dir() / "task" / f"{chosen[-1]}.yaml" if chosen else None
    return OmegaConf.to_container(OmegaConf.load(path)) if path and path.is_file() else {}


def _register_schema() -> None:
    """conf/config.yaml starts from this schema, so every documented key is overridable."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="areal_schema", node=RootConfig)


def _hydra_message(err: Exception) -> str:
    if known := known_message(err):
        return known
    lines = [x.strip() for x in str(err).strip().splitlines() if x.strip()]
    text = lines[0]
    if text.startswith("Error merging override"):
        cause = str(err.__cause__ or (lines[1] if len(lines) > 1 else "")).strip().splitlines()
        text = (f"{text}: {cause[0] if cause else 'wrong type'} (give a value of the documented "
                "type)")
    if "Could not find" in text or "not found in" in text.lower():
        return f"{text} (see `ls conf/` for the groups and their options)"
    if "is not in struct" in text or "Could not override" in text or "Key '" in text:
        return f"{text} (check the spelling; `areal train --dry-run` prints every valid key)"
    return text


def from_dictconfig(cfg, check: bool = True) -> RootConfig:
    root = to_root(cfg)
    problems = validate(root) if check else []
    if problems:
        raise ConfigError(problems)
    return root


def load_yaml(path: str | Path, check: bool = True, private: bool = True) -> RootConfig:
    """Read a resolved ``config.yaml`` written by ``save_yaml``. ``check=False`` for a run's own
    processes: the launcher validated it before writing it, and checking again would import what
    only the checks need (reasoning-gym's dataset registry: ~80 MB in every process). ``private``:
    a run's own file, read only when it is the running user's alone (``areal_cli/private.py``);
    False to read another user's run (``areal eval``'s overlap check, which starts nothing)."""
    from omegaconf import OmegaConf

    from areal_cli.private import read_private

    text = read_private(path).decode() if private else Path(path).read_text()
    return from_dictconfig(OmegaConf.create(text), check=check)


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


def lora_problems(cfg: RootConfig) -> list[str]:
    """trainer.lora checks that need no model (preflight checks the names and the rank against
    it)."""
    lora, out = cfg.trainer.lora, []
    if lora.rank <= 0:
        return out
    if not lora.target_modules or not all(isinstance(m, str) and m for m in lora.target_modules):
        out.append(f"trainer.lora.target_modules={list(lora.target_modules)}: name at least one "
                   "linear layer, e.g. [q_proj,v_proj] (default: every attention and MLP "
                   "projection)")
    if lora.target_experts and lora.dropout:
        out.append(f"trainer.lora.target_experts=true with trainer.lora.dropout={lora.dropout}: "
                   "an expert's adapter has no dropout (its input is not its own); set "
                   "trainer.lora.dropout=0 or trainer.lora.target_experts=false")
    if lora.target_experts and cfg.engine.lora_merge == "false":
        out.append("trainer.lora.target_experts=true with engine.lora_merge=false: the experts' "
                   "adapters travel merged into their weights only; set engine.lora_merge=auto "
                   "or trainer.lora.target_experts=false")
    if cfg.algorithm.needs_critic:
        out.append(f"trainer.lora.rank={lora.rank} with "
                   f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} (algorithm=ppo): the "
                   "critic has no LoRA (it would train in full beside the adapter); use a "
                   "critic-free estimator (algorithm=grpo) or trainer.lora.rank=0")
    return out


def _cross_field(cfg: RootConfig) -> list[str]:
    problems = cfg.task.validate() + cfg.reward.validate() + cfg.algorithm.validate()
    from areal_cli.rewards.sandbox import sandbox_problems

    workflow = workflow_spec(cfg.workflow.name)
    problems += sandbox_problems(cfg.reward, cfg.task, workflow.runs_code)
    problems += tracking_problems(cfg.logging)
    r, t = cfg.rollout, cfg.trainer
    problems += run_bounds(cfg)
    if t.shard == "false" and t.ranks > 1:
        problems.append(f"trainer.shard=false with trainer.ranks={t.ranks}: several ranks train "
                        "through FSDP; set trainer.shard=auto or trainer.ranks=1")
    if (t.batch_size * r.group_size) % t.ranks and not workflow.varying_rows:
        problems.append(
            f"trainer.batch_size × rollout.group_size = {t.batch_size * r.group_size} samples do "
            f"not split evenly over trainer.ranks={t.ranks}: choose a batch_size or ranks that "
            "divides it"
        )
    if r.group_size < 2 and cfg.algorithm.adv_estimator in ("grpo", "rloo", "dr_grpo",
                                                            "reinforce_pp_baseline"):
        problems.append(
            f"rollout.group_size={r.group_size}: algorithm {cfg.algorithm.adv_estimator} compares "
            "samples within a group; use rollout.group_size>=2"
        )
    if cfg.algorithm.overlong_buffer >= r.max_new_tokens and cfg.algorithm.overlong_buffer > 0:
        problems.append(
            f"algorithm.overlong_buffer={cfg.algorithm.overlong_buffer} must be < "
            f"rollout.max_new_tokens={r.max_new_tokens}: lower the buffer or raise max_new_tokens"
        )
    if t.lora.rank > 0 and not t.lora.merged_checkpoint and (cfg.eval.every or cfg.eval.at_end):
        problems.append("trainer.lora.merged_checkpoint=false writes the adapter alone, and the "
                        "evaluation scores a merged checkpoint: set eval.at_end=false "
                        "eval.every=0, or trainer.lora.merged_checkpoint=true")
    if (cfg.eval.every or cfg.eval.at_end) and cfg.eval.size < 0:
        problems.append(f"eval.size={cfg.eval.size} must be >= 0 (0 = the whole eval split, "
                        "at most task.eval_size problems)")
    problems += agent_problems(cfg.workflow, workflow.runs_agent)
    if unknown_engine(cfg.engine.name):
        problems.append(unknown_engine(cfg.engine.name))
    if not 0 <= cfg.launcher.max_frame_mb <= 2047:
        problems.append(f"launcher.max_frame_mb={cfg.launcher.max_frame_mb}: use 0 (sized to the "
                        "largest batch) or 1..2047")
    problems += lora_problems(cfg)
    problems += _served_reward_problems(cfg)
    if cfg.resume and not RunDir(cfg.resume).config.is_file():
        problems.append(f"resume={cfg.resume}: no config.yaml there; give the run_dir of an "
                        "earlier run")
    return problems



def _served_reward_problems(cfg: RootConfig) -> list[str]:
    """A model or judge reward needs the local launcher; evaluation scores with the verifier
    part."""
    problems = []
    if cfg.reward.served and cfg.launcher.name != "local":
        problems.append(f"reward.fn={cfg.reward.fn}: the reward-model process runs under the local "
                        "launcher only; use launcher=local")
    if (cfg.eval.every or cfg.eval.at_end) and cfg.reward.verifier() is None:
        problems.append(f"reward.fn={cfg.reward.fn} has no verifier to score held-out answers: set "
                        "eval.at_end=false eval.every=0, or add one with weight 0 "
                        "(reward.fn=[auto,judge] reward.weights=[0,1])")
    return problems

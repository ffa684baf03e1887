"""Model FLOP utilisation and peak memory of the trainer, as metrics of each step."""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist

from areal_cli.moe import experts_of, sparse_layers, top_k

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
"""Dense bf16 peak FLOP/s per GPU (SXM parts), by a name that ``torch.cuda.get_device_name``
contains."""


def peak_flops(device: torch.device, override: float) -> float | None:
    """One rank's peak FLOP/s: ``trainer.peak_flops`` when > 0, else the GPU's from the table;
    None on the CPU or an unknown GPU (no MFU then)."""
    if override > 0:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def flop_terms(config) -> tuple[float, float, float]:
    """``(body, attention, head)`` coefficients of ``sequence_flops`` from a Llama-style config.

    body = 6 · Σ_layers P_layer, P_layer = the matmul weights of one decoder layer a token passes
    through: q and o ``H·a·d`` each, k and v ``H·k·d`` each, the MLP (``mlp_weights``);
    attention = 12 · L · a·d (PaLM's 12·L·H·S: QKᵀ and AV, 4·a·d·S per token per layer in the
    forward, ×3 with the backward, S keys: causal masking is not discounted);
    head = 6 · V · H (the output layer). Norms, rotary and the embedding lookup are not counted."""
    h, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    d = getattr(config, "head_dim", None) or h // heads
    attention = 2 * h * heads * d + 2 * h * kv * d
    body = layers * attention + sum(mlp_weights(config, i) for i in range(layers))
    return 6.0 * body, 12.0 * layers * heads * d, 6.0 * config.vocab_size * h


def mlp_weights(config, layer: int) -> float:
    """The MLP weights a token meets in decoder layer ``layer``: the gated MLP ``3·H·I``; in a
    sparse (mixture-of-experts) layer the *active* ones only: the top-k experts
    ``k·3·H·I_expert``, a shared expert where the layout has one, and the router ``H·E``."""
    h = config.hidden_size
    if layer not in sparse_layers(config):
        return 3.0 * h * config.intermediate_size
    expert = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    shared = getattr(config, "shared_expert_intermediate_size", None) or 0
    return top_k(config) * 3.0 * h * expert + 3.0 * h * shared + h * experts_of(config)


def sequence_flops(terms: tuple[float, float, float], length: int, response: int) -> float:
    """Model FLOPs of one forward + backward of a sequence of ``length`` tokens (prompt and
    response: every one passes through the decoder layers) whose ``response`` tokens reach
    the output layer: ``(body + attention · length) · length + head · response``."""
    body, attention, head = terms
    return (body + attention * length) * length + head * response


class MFU:
    """Model FLOPs of the rows a step trained, per second, over the peak of all ranks.

    Only the policy's forward + backward passes count (one per PPO epoch, the rows that were
    not skipped); the proximal, reference and critic passes, activation recomputation and
    padding are overhead, not model FLOPs. A mixture-of-experts model counts its active parameters
    (the experts a token is routed to, not all of them: ``mlp_weights``)."""

    def __init__(self, config, device: torch.device, override: float, world: int,
                 frozen: bool = False):
        """``frozen``: the weights take no gradient (LoRA): their matmuls cost 4 FLOPs a weight and
        token (forward, and the backward's input gradient), not 6; the adapters' own are left out (<
        1%)."""
        body, attention, head = flop_terms(config)
        self.terms = (body * 4 / 6, attention, head * 4 / 6) if frozen else (body, attention, head)
        peak = peak_flops(device, override)
        self.peak = None if peak is None else peak * world

    def stats(self, ro, keep: torch.Tensor, elapsed: float, epochs: int) -> dict:
        flops = epochs * sum(sequence_flops(self.terms, len(ro.prompts[i]) + len(ro.responses[i]),
                                            int(ro.loss_mask[i].sum()))
                             for i in range(ro.n) if keep[i])
        out = {"model_tflops_per_s": flops / elapsed / 1e12}
        if self.peak:
            out["mfu"] = flops / elapsed / self.peak
        return out


def memory_stats(device: torch.device) -> dict:
    """The largest peak over ranks of the resident memory (``peak_rss_gb``, GiB) and, on CUDA,
    of the memory PyTorch allocated on the GPU (``peak_gpu_mem_gb``); a collective."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    gpu = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    peaks = torch.tensor([rss, gpu], dtype=torch.float64, device=device)
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    out = {"peak_rss_gb": float(peaks[0])}
    if device.type == "cuda":
        out["peak_gpu_mem_gb"] = float(peaks[1])
    return out

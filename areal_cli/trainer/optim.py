"""AdamW whose moments are stored in bfloat16 with stochastic rounding (``trainer.optim_state``).

fp32 master weights and gradients, the update computed in float32, chunk by chunk; only the two
moments are kept in bfloat16, half of AdamW's 8 bytes per parameter (540 MB for a 135M model).
Rounding the new moments to the nearest bfloat16 would lose updates smaller than half a bfloat16
step: with beta2 = 0.999 the second moment changes by ~0.1% per step, below bfloat16's 0.4%
resolution, so it would stop moving. Stochastic rounding rounds up with probability equal to the
dropped fraction, so the stored moment is right on average. The random bits come from a generator
seeded by (seed, step), so a resumed run rounds as the uninterrupted one did.
"""

from __future__ import annotations

import torch

CHUNK = 1 << 20  # elements per pass: three float32 temporaries of 4 MiB


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 shard: its local part


class AdamWBF16State(torch.optim.Optimizer):
    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0,
                 seed: int = 0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.seed = seed

    def _noise(self, step: int, device) -> torch.Tensor:
        gen = torch.Generator(device="cpu").manual_seed(self.seed * 1_000_003 + step)
        return torch.randint(0, 1 << 16, (2 * CHUNK,), dtype=torch.int32, generator=gen).to(device)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        noise, offset = None, 0
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = torch.zeros((), dtype=torch.float32)
                    st["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    st["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                st["step"] += 1
                t = int(st["step"])
                if noise is None:
                    noise = self._noise(t, _local(p).device)
                c1, c2 = 1 - b1 ** t, 1 - b2 ** t
                w, g = _local(p).view(-1), _local(p.grad).view(-1)
                m, v = _local(st["exp_avg"]).view(-1), _local(st["exp_avg_sq"]).view(-1)
                for i in range(0, w.numel(), CHUNK):
                    j = min(i + CHUNK, w.numel())
                    gg = g[i:j].float()
                    m32 = m[i:j].float().lerp_(gg, 1 - b1)
                    v32 = v[i:j].float().mul_(b2).addcmul_(gg, gg, value=1 - b2)
                    denom = (v32 / c2).sqrt_().add_(eps)
                    if wd:
                        w[i:j].mul_(1 - lr * wd)
                    w[i:j].addcdiv_(m32, denom, value=-lr / c1)
                    offset = (offset + 7919) % CHUNK
                    _round_into(m[i:j], m32, noise[offset:offset + j - i])
                    _round_into(v[i:j], v32, noise[CHUNK - offset:CHUNK - offset + j - i])
        return loss


def _round_into(dst: torch.Tensor, src: torch.Tensor, noise: torch.Tensor) -> None:
    """``dst`` (bfloat16) = ``src`` (float32) stochastically rounded: random low 16 bits added to
    the magnitude, then cut off (bfloat16 is float32's upper half, so the copy is exact)."""
    bits = src.view(torch.int32)
    bits.add_(noise).bitwise_and_(-65536)
    dst.copy_(src)

"""Where a gradient grows through the decoder layers, token by token: hooks on a policy's decoder
layers that record, for the first backward after ``arm()``, each layer's largest |gradient| of its
output, the token where it sits (row, position in its sequence, token id) and that token's
hidden-state RMS at the layer's input, and how many tokens hold a non-finite gradient. Used by
``trainer_profile.py --grad-probe`` to replay a kept batch
(``RUN_DIR/nonfinite/batch_STEP.msgpack``) on the trainer alone.

A gradient that grows by a constant factor per layer, on one token whose hidden state is near zero,
is RMSNorm's backward (its gain is 1 / RMS(x), up to 1 / sqrt(eps)); a non-finite count that starts
in one layer's attention is that kernel's backward. Compiled layers keep their graphs: the hooks run
around each layer's compiled forward, not inside it.
"""

from __future__ import annotations

import torch


class GradProbe:
    """Forward hooks on the embedding (token ids) and each decoder layer (positions, input RMS, a
    tensor hook on the output's gradient); ``report()`` lists the layers from the last to the
    first."""

    def __init__(self, model: torch.nn.Module):
        layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
        embeds = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
        if not layers or not embeds:
            raise ValueError("grad probe: no decoder layers or embedding in this model")
        self.index = {id(m): i for i, m in enumerate(layers)}
        self.ids: torch.Tensor | None = None
        self.rows: dict[int, dict] = {}
        self.armed = False
        self.handles = [embeds[0].register_forward_hook(self._ids)]
        self.handles += [m.register_forward_hook(self._layer, with_kwargs=True) for m in layers]

    def arm(self) -> None:
        """Record the next backward (the first micro-batch's; recomputed forwards are not recorded
        twice)."""
        self.rows, self.ids, self.armed = {}, None, True

    def _ids(self, _module, args, _out) -> None:
        # the recorded micro-batch's
        if self.armed and torch.is_grad_enabled() and self.ids is None:
            self.ids = args[0].detach().reshape(-1).cpu()

    def _layer(self, module, args, kwargs, out) -> None:
        i = self.index[id(module)]
        if not self.armed or not torch.is_grad_enabled() or i in self.rows:
            return
        hidden = args[0] if args else kwargs.get("hidden_states")
        y = out[0] if isinstance(out, tuple) else out
        if not isinstance(y, torch.Tensor) or not y.requires_grad:
            return
        pos = kwargs.get("position_ids")
        self.rows[i] = row = {"layer": i,
                              "rms_in": hidden.detach().float().pow(2).mean(-1).sqrt()
                                                .reshape(-1).cpu(),
                              "pos": pos.detach().reshape(-1).cpu()
                              if isinstance(pos, torch.Tensor) else None,
                              "width": hidden.shape[-2]}

        def hook(g: torch.Tensor, row=row) -> None:
            a = g.detach().float().abs().amax(-1).reshape(-1)
            finite = torch.isfinite(a)
            row["nonfinite_tokens"] = int((~finite).sum())
            b = torch.where(finite, a, 0.0)
            row["grad_max"] = float(b.max())
            row["at"] = int(b.argmax())
            if row["nonfinite_tokens"]:
                row["first_nonfinite"] = int((~finite).nonzero()[0, 0])
        y.register_hook(hook)

    def report(self) -> list[dict]:
        """One dict per layer, last layer first: grad_max, where (flat index, row, position, token
        id), the token's input RMS, the non-finite count, and the growth from the layer above."""
        self.armed = False
        out, above = [], None
        for i in sorted(self.rows, reverse=True):
            r = self.rows[i]
            if "grad_max" not in r:
                continue
            at = r["at"]
            info = {"layer": i, "grad_max": r["grad_max"], "at": at, "row": at // r["width"],
                    "position": int(r["pos"][at]) if r["pos"] is not None
                    and at < len(r["pos"]) else at % r["width"],
                    "token_id": int(self.ids[at]) if self.ids is not None
                    and at < len(self.ids) else None,
                    "rms_in_at": float(r["rms_in"][at]),
                    "rms_in_median": float(r["rms_in"].median()),
                    "nonfinite_tokens": r["nonfinite_tokens"]}
            if "first_nonfinite" in r:
                f = r["first_nonfinite"]
                info["first_nonfinite"] = {"at": f,
                                           "token_id": int(self.ids[f])
                                           if self.ids is not None else None,
                                           "position": int(r["pos"][f])
                                           if r["pos"] is not None else None}
            if above and r["grad_max"] > 0:
                info["growth"] = r["grad_max"] / above
            above = r["grad_max"]
            out.append(info)
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def print_report(rows: list[dict]) -> None:
    for r in rows:
        growth = f"x{r['growth']:.3g}" if "growth" in r else ""
        bad = (f"  non-finite on {r['nonfinite_tokens']} tokens (first: {r['first_nonfinite']})"
               if r["nonfinite_tokens"] else "")
        print(f"layer {r['layer']:3} grad max {r['grad_max']:.3g} {growth:>9} at row {r['row']} "
              f"position {r['position']} token {r['token_id']} (input RMS {r['rms_in_at']:.3g}, "
              f"median {r['rms_in_median']:.3g}){bad}", flush=True)


def explodes(rows: list[dict], factor: float = 10.0) -> bool:
    """Whether the gradient grew by more than ``factor`` between two layers, or went non-finite
    (``grad_max`` is over the finite values)."""
    return any(r["nonfinite_tokens"] or r.get("growth", 1.0) > factor for r in rows)

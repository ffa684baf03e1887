"""A random-weights checkpoint of a real architecture, for benchmarks at size where no real weights
can be had: ``from_config`` (transformers' own initialisation, seed 0) + ``save_pretrained`` in
bfloat16, with the default model's tokenizer.

    python benchmarks/random_model.py qwen2.5-7b-instruct /tmp/rand/qwen2.5-7b [--device cuda]

NAME is a folder of benchmarks/models/ (or any directory holding a config.json). Skips the work
when OUT already holds a complete checkpoint. The vocabulary keeps the architecture's own size
(151,936 / 152,064 / 128,256 ids) against the tokenizer's 49,152: the embedding, the output layer
and the [tokens × vocab] logits, a large share of a 1.5B model's FLOPs and of the trainer's
memory, stay real. Sampling is not restricted: an id past the tokenizer decodes to nothing (the
rewards of random text are 0 anyway) and vLLM runs without detokenising. bos/eos/pad ids are set
to the tokenizer's. Use with ``rollout.length_profile`` (random weights never stop on their own).

transformers' initialisation zeroes the pad token's embedding row; a real checkpoint has none, and
in a random one a sequence that starts with that token keeps a zero hidden state through every layer
(its attention sees only itself, every bias is 0), whose RMSNorm backward multiplies the gradient by
up to 1 / sqrt(eps) per layer. It did: transformers 5.17 reads the default model's GGUF tokenizer
with no pad token and eos = ``<|im_start|>``, the first token of every chat prompt, which became the
pad id here. The row is initialised like the others unless ``--keep-zero-pad-row``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

MODELS = Path(__file__).resolve().parent / "models"


def build(name: str, out: Path, tokenizer: Path | None = None, device: str = "cpu", seed: int = 0,
          keep_zero_pad_row: bool = False, layers: int = 0) -> dict:
    """Write the checkpoint (unless there already); returns its description (also in
    OUT/random_weights.json). ``layers`` > 0: only that many decoder layers, every other field of
    the layout as it is (a small model of a real layout)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    marker = out / "random_weights.json"
    if marker.is_file():
        return json.loads(marker.read_text())
    src = MODELS / name if (MODELS / name / "config.json").is_file() else Path(name)
    config = AutoConfig.from_pretrained(src, **({"num_hidden_layers": layers} if layers else {}))
    if tokenizer is None:
        from areal_cli.model_source import resolve_model

        tokenizer = resolve_model("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(tokenizer)
    config.bos_token_id, config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    filled = [] if keep_zero_pad_row else fill_zero_rows(model, config)
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a build that was stopped
    model.save_pretrained(tmp, max_shard_size="5GB")
    tok.save_pretrained(tmp)
    info = {"architecture": name, "config_from": str(src), "params": params, "dtype": "bfloat16",
            "seed": seed, "layers": config.num_hidden_layers, "vocab_size": config.vocab_size,
            "tokenizer_ids": len(tok),
            "weights": "random (transformers from_config initialisation)",
            "zero_rows_filled": filled,
            "build_s": time.perf_counter() - t0}
    (tmp / "random_weights.json").write_text(json.dumps(info, indent=1))
    tmp.rename(out)
    return info


def fill_zero_rows(model, config) -> list[int]:
    """Initialise the embedding rows transformers left at zero (the pad token's: ``padding_idx``)
    like the others, normal(0, initializer_range); the ids filled."""
    import torch

    from areal_cli.trainer.model import zero_embedding_rows

    w = model.get_input_embeddings().weight
    ids = sorted(zero_embedding_rows(model))
    with torch.no_grad():
        if ids:
            rows = torch.empty(len(ids), w.shape[1], device=w.device, dtype=torch.float32)
            rows.normal_(0.0, float(getattr(config, "initializer_range", 0.02)))
            w[ids] = rows.to(w.dtype)
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name",
                    help=f"one of {sorted(p.name for p in MODELS.iterdir() if p.is_dir())} or a "
                         "directory")
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, default=None, help="default: the default model's")
    ap.add_argument("--device", default="cpu",
                    help="where to initialise (cuda is much faster at 7B)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0,
                    help="keep only this many decoder layers (0: the layout's own count)")
    ap.add_argument("--keep-zero-pad-row", action="store_true",
                    help="keep the all-zero embedding row transformers gives the pad token "
                         "(checkpoints built before)")
    args = ap.parse_args()
    print(json.dumps(build(args.name, args.out, args.tokenizer, args.device, args.seed,
                           args.keep_zero_pad_row, args.layers),
                     indent=1))


if __name__ == "__main__":
    main()

"""Weight broadcast bandwidth on two GPUs: raw NCCL vs the project's bucketed path.

    python3 benchmarks/weight_broadcast.py [--models 7b 1.5b 135m] [--bucket-mb 1024 256] [--out
    FILE]

Two processes, GPU 0 = trainer rank 0, GPU 1 = a rollout worker; both groups are built from a
TCPStore outside torchrun, as ``areal_cli/transport/weights.py`` does.

* raw: one ``broadcast`` of a bf16 tensor the size of the model's wire bytes (and of 1 GiB),
  on the same kind of standalone NCCL group, median of the timed repeats;
* path: ``WeightSender.prepare(full_parameters(fsdp_model))`` on GPU 0 (fp32 master weights under
  FSDP2 on a one-rank group, cast into bf16 wire buffers; timed apart, as a run does it before the
  workers pause), then ``broadcast()`` → ``WeightReceiver.receive()`` into a bf16 model on GPU 1;
  gather / transfer (sender) and receive / load (receiver) medians. ``ratio_to_raw``: raw
  broadcast time / (broadcast + load); ``ratio_to_raw_with_gather`` counts the gather too.

Models: Llama architecture with random weights (no files needed). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MODELS = {
    # ~7.6B: Qwen2.5-7B's shape (hidden 3584, 28 layers, MLP 18944, 28 heads / 4 KV heads, vocab
    # 152064)
    "7b": dict(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
               num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    # ~1.4B: hidden 2048, 24 layers, MLP 5632, vocab 49152, untied head
    "1.5b": dict(hidden_size=2048, num_hidden_layers=24, intermediate_size=5632,
                 num_attention_heads=16,
                 num_key_value_heads=16, vocab_size=49152, tie_word_embeddings=False),
    # SmolLM2-135M's shape
    "135m": dict(hidden_size=576, num_hidden_layers=30, intermediate_size=1536,
                 num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(name: str, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(max_position_embeddings=2048, **MODELS[name])
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    return model


def cuda_sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sync_barrier(pg, device):
    t = torch.zeros(1, device=device)
    pg.allreduce([t], dist.AllreduceOptions()).wait()
    cuda_sync(device)


def raw_bw(pg, device, nbytes: int, reps: int) -> dict:
    from areal_cli.transport.weights import _broadcast

    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    times = []
    for i in range(reps + 2):
        sync_barrier(pg, device)
        t0 = time.perf_counter()
        _broadcast(pg, x).wait()
        cuda_sync(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    return {"bytes": nbytes, "median_s": s, "GiB_per_s": nbytes / s / 2**30, "min_s": min(times)}


def worker(rank: int, args, ports: dict, q) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    device = torch.device("cpu") if args.cpu else torch.device("cuda", rank)
    backend = "gloo" if args.cpu else "nccl"
    if not args.cpu:
        torch.cuda.set_device(device)
    from areal_cli.transport.weights import WeightReceiver, WeightSender, new_group, param_specs

    if rank == 0:  # the trainer's own one-rank group (FSDP2 needs one)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                device_id=None if args.cpu else device)
    out = {"device": "cpu" if args.cpu else torch.cuda.get_device_name(device),
           "torch": torch.__version__}
    _, pg = new_group("127.0.0.1", ports["raw"], rank, 2, backend, 120)
    out["raw_1GiB"] = raw_bw(pg, device, args.raw_mib << 20, args.reps)
    for name in args.models:
        res = {}
        if rank == 0:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            from areal_cli.trainer.model import full_parameters

            model = build(name, device, torch.float32)
            mpp = (MixedPrecisionPolicy() if args.cpu else
                   MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
            for layer in model.model.layers:
                fully_shard(layer, mp_policy=mpp)
            fully_shard(model, mp_policy=mpp)
            specs = param_specs(model)
            wire_bytes = sum(s.numel for s in specs) * 2
        else:
            model = build(name, device, torch.bfloat16)
            wire_bytes = sum(s.numel for s in param_specs(model)) * 2
        res["params"] = wire_bytes // 2
        res["wire_bytes"] = wire_bytes
        res["raw"] = raw_bw(pg, device, wire_bytes, args.reps)
        for mb in args.bucket_mb:
            port = ports[f"{name}-{mb}"]
            if rank == 0:
                end = WeightSender(specs, "127.0.0.1", port, 2, backend, device, torch.bfloat16,
                                   mb << 20, 120)
            else:
                end = WeightReceiver(model, "127.0.0.1", port, 1, 2, backend, torch.bfloat16,
                                     mb << 20, 120)
            rows = []
            for i in range(args.reps + 2):
                # as in a run: trainer rank 0 casts the update into its wire buffers first, then
                # the workers pause and the broadcast + load is what they wait for
                g = end.prepare(full_parameters(model)) if rank == 0 else {}
                sync_barrier(pg, device)
                t0 = time.perf_counter()
                r = end.broadcast() if rank == 0 else end.receive()
                cuda_sync(device)
                r["wall_s"] = time.perf_counter() - t0
                r.update(g)
                if i >= 2:
                    rows.append(r)
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            med["GiB_per_s"] = wire_bytes / med["wall_s"] / 2**30
            med["buckets"] = len(end.buckets)
            res[f"bucket_{mb}MiB"] = med
            del end
        out[name] = res
        del model
        torch.cuda.empty_cache()
    q.put((rank, out))
    if rank == 0:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["1.5b", "135m"], choices=sorted(MODELS))
    ap.add_argument("--bucket-mb", nargs="+", type=int, default=[1024, 256])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--raw-mib", type=int, default=1024)
    ap.add_argument("--cpu", action="store_true",
                    help="gloo on CPU (a check of the script, no figures)")
    ap.add_argument("--out")
    args = ap.parse_args()
    assert args.cpu or torch.cuda.device_count() >= 2, "needs 2 GPUs"
    ports = {"raw": free_port(),
             **{f"{n}-{mb}": free_port() for n in args.models for mb in args.bucket_mb}}
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, args, ports, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    s, r = got[0], got[1]
    summary = {"device": s["device"], "torch": s["torch"], "date": time.strftime("%Y-%m-%d"),
               f"raw_{args.raw_mib}MiB_GiB_per_s": s["raw_1GiB"]["GiB_per_s"]}
    for name in args.models:
        m = {"params": s[name]["params"], "wire_MiB": s[name]["wire_bytes"] / 2**20,
             "raw_GiB_per_s": s[name]["raw"]["GiB_per_s"], "raw_s": s[name]["raw"]["median_s"]}
        for mb in args.bucket_mb:
            k = f"bucket_{mb}MiB"
            a, b = s[name][k], r[name][k]
            wall = max(a["wall_s"], b["wall_s"])
            m[k] = {"send_wall_s": a["wall_s"], "gather_s": a["weight_gather_s"],
                    "transfer_s": a["weight_transfer_s"],
                    "recv_wall_s": b["wall_s"], "recv_s": b["weight_recv_s"],
                    "load_s": b["weight_load_s"],
                    "buckets": a["buckets"], "GiB_per_s": s[name]["wire_bytes"] / wall / 2**30}
            # broadcast + load (what a paused worker waits for) against one raw broadcast of the
            # bytes
            m[k]["ratio_to_raw"] = m[k]["GiB_per_s"] / m["raw_GiB_per_s"]
            # the same with the trainer's gather (cast into the wire buffers) counted too
            m[k]["ratio_to_raw_with_gather"] = s[name]["raw"]["median_s"] / (wall
                                                                             + a["weight_gather_s"])
        summary[name] = m
    text = json.dumps({"summary": summary, "sender": s, "receiver": r}, indent=1)
    print(json.dumps(summary, indent=1))
    if args.out:
        open(args.out, "w").write(text)


if __name__ == "__main__":
    main()

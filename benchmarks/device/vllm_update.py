"""Weight updates into a real vLLM engine on two GPUs: raw NCCL against the in-place path, in one
call.

    python3 benchmarks/device/vllm_update.py CHECKPOINT [--tp 1] [--engines 1] [--versions 8]
    [--seqs 64] [--out FILE]

GPU 0 is trainer rank 0 (the checkpoint's architecture built with random weights of its own, bf16),
GPUs 1..tp a rollout worker's ``VLLMEngine`` (engine.weight_update=inplace, CUDA graphs on) built
exactly as ``areal train`` builds it, joined to a ``WeightSender`` group of 1 + tp ranks (each TP
rank receives every bucket and its weight loaders keep its slice). ``--engines 2``: two such workers
(data parallel, GPUs 1..tp and tp+1..2·tp, rollout worker indices 0 and 1), both in the one group of
1 + 2·tp ranks, so that every bucket reaches both in one broadcast.

1. raw: one NCCL ``broadcast`` of a bf16 tensor of the update's bytes from GPU 0 to the first GPU
   of every worker (median of 5 after 2 warm-ups), before the engines start.
2. updates: version 1 with the engine idle, versions 2..N while ``--seqs`` sequences decode
   (``ignore_eos``, refilled as they finish). Each version the trainer scales its embedding by 1.01
   (so every version differs), casts the update into its wire buffers (``prepare``) and broadcasts;
   the engine's ``update_weights`` receives it behind generation and pauses only for the swap.
   Reported per version: the trainer's transfer, the engine's receive (wire + loads into staging),
   the pause generation saw, decode tokens/s during the receive and over ``--between-s`` after each
   update (abort: re-prefill included) against a baseline with no update.
3. logits: vLLM's prompt logprobs of a fixed probe before version 1 and after the last version,
   against the trainer's own (transformers, bf16) for its final weights.

Random weights: label every figure so. Prints one JSON summary.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import statistics
import tempfile
import time

import torch
import torch.multiprocessing as mp

from areal_cli.runtime import physical_gpus

PROBE = 64


def probe_ids(vocab: int) -> list[int]:
    gen = random.Random(7)
    return [gen.randrange(100, vocab) for _ in range(PROBE)]


def trainer(args, ports: dict, stores: str, barrier, q) -> None:
    # where a hang waits, in the log
    faulthandler.dump_traceback_later(args.stacks_after_s, exit=False)
    from transformers import AutoConfig, AutoModelForCausalLM

    from areal_cli.transport.weights import WeightSender, _broadcast, new_group, param_specs
    from benchmarks.weight_broadcast import raw_bw

    torch.cuda.set_device(0)
    config = AutoConfig.from_pretrained(args.checkpoint)
    torch.manual_seed(1)  # weights other than the checkpoint's
    with torch.device("cuda", 0):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    specs = param_specs(model)
    nbytes = sum(s.numel for s in specs) * 2
    _, raw_pg = new_group("127.0.0.1", ports["raw"], 0, 1 + args.engines, "nccl", 600,
                          f"{stores}/raw")
    out = {"device": torch.cuda.get_device_name(0), "wire_bytes": nbytes, "params": nbytes // 2,
           "raw": raw_bw(raw_pg, torch.device("cuda", 0), nbytes, 5)}
    torch.cuda.empty_cache()
    _broadcast(raw_pg, torch.zeros(1, device="cuda")).wait()  # the engine is up when this returns
    tx = WeightSender(specs, "127.0.0.1", ports["weights"], 1 + args.engines * args.tp, "nccl",
                      torch.device("cuda", 0), torch.bfloat16,
                      args.bucket_mb << 20, timeout_s=600, staged=True,
                      store_path=f"{stores}/weights",
                      high_priority=not args.normal_priority)
    rows = []
    for _ in range(args.versions):
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(1.01)
        r = tx.prepare(iter(model.named_parameters()))
        barrier.wait()
        print("trainer sends", flush=True)
        r.update(tx.broadcast())
        print("trainer sent", r, flush=True)
        rows.append(r)
    with torch.no_grad():
        ids = torch.tensor([probe_ids(config.vocab_size)], device="cuda")
        lp = torch.log_softmax(model(ids).logits.float()[0, :-1], -1).gather(1, ids[0, 1:, None])[:,
                                                                                                  0]
    out.update(rows=rows, buckets=len(tx.buckets), probe_logprobs=lp.cpu().tolist())
    q.put(("trainer", out))


def produced(engine, finished: list) -> int:
    return sum(len(s.output_ids) for s in engine.seqs.values()) + sum(len(s.output_ids)
                                                                      for s in finished)


def refill(engine, args, vocab: int, n: list) -> None:
    from areal_cli.engines.base import Sequence

    gen = random.Random(n[0])
    while len(engine.seqs) < args.seqs:
        n[0] += 1
        engine.submit(Sequence(rid=f"s{n[0]}",
                               prompt_ids=[gen.randrange(100, vocab) for _ in range(args.prompt)],
                               max_new_tokens=args.max_new, ignore_eos=True))


def generate_for(engine, seconds: float, finished: list, args, vocab: int, n: list) -> float:
    """Decode for ``seconds``; tokens/s over that time."""
    t0, before = time.perf_counter(), produced(engine, finished)
    while time.perf_counter() - t0 < seconds:
        finished += engine.poll(0.05)
        refill(engine, args, vocab, n)
    return (produced(engine, finished) - before) / (time.perf_counter() - t0)


def probe_or_error(engine, probe: list[int]) -> list[float] | str:
    """vLLM's prompt logprobs of ``probe``, or what went wrong (the update figures stand without
    them)."""
    try:
        return engine.probe_logprobs(probe).tolist()
    except (RuntimeError, KeyError, IndexError, TypeError, AttributeError) as err:
        return f"{type(err).__name__}: {err}"


def rollout(args, ports: dict, stores: str, barrier, q, index: int = 0) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from areal_cli.config.schema import RootConfig
    from areal_cli.engines.base import EngineSetup, Sampling, WeightSource
    from areal_cli.engines.factory import make_engine
    from areal_cli.runconfig.autos import resolve_engine
    from areal_cli.transport.weights import _broadcast, new_group
    from benchmarks.weight_broadcast import raw_bw

    faulthandler.dump_traceback_later(args.stacks_after_s, exit=False)
    # CUDA_VISIBLE_DEVICES=1[,2...] for this process: the raw broadcast goes to GPU 1
    torch.cuda.set_device(0)
    config = AutoConfig.from_pretrained(args.checkpoint)
    vocab = config.vocab_size
    with torch.device("meta"):
        nbytes = 2 * sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    _, raw_pg = new_group("127.0.0.1", ports["raw"], 1 + index, 1 + args.engines, "nccl", 600,
                          f"{stores}/raw")
    raw_bw(raw_pg, torch.device("cuda", 0), nbytes, 5)
    torch.cuda.empty_cache()
    cfg = RootConfig()
    cfg.engine.name, cfg.engine.weight_update = "vllm", "inplace"
    v = cfg.engine.vllm
    cfg.engine.gpu_memory_utilization = args.gpu_memory_utilization
    v.max_model_len = args.prompt + args.max_new + 64
    v.max_num_seqs, v.tensor_parallel_size = max(args.seqs, 16), args.tp
    v.pause_mode, v.staged_tp, v.staging = args.pause_mode, args.staged_tp, not args.unstaged
    cfg.weights.high_priority = not args.normal_priority
    cfg.engine = resolve_engine(cfg.engine, args.checkpoint)
    cfg.weights.dtype, cfg.weights.bucket_mb = "bfloat16", args.bucket_mb
    cfg.weights.backend, cfg.weights.staged = "nccl", "true"
    cfg.launcher.peer_timeout_s, cfg.rollout.workers = 300, args.engines
    setup = EngineSetup(cfg.engine, args.checkpoint, 0, Sampling(1.0), args.seqs,
                        cfg.engine.vllm.max_model_len,
                        index=index,
                        weights=WeightSource(cfg, "127.0.0.1", ports["weights"],
                                             f"{stores}/weights"))
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    t0 = time.perf_counter()
    engine = make_engine(setup)
    print("engine up", flush=True)
    out = {"engine_start_s": time.perf_counter() - t0, "staged": bool(engine.receiver.background),
           "tp": args.tp,
           "pause_mode": args.pause_mode, "index": index}
    _broadcast(raw_pg, torch.zeros(1, device="cuda")).wait()
    probe = probe_ids(vocab)
    before = probe_or_error(engine, probe)
    print("probe", str(before)[:80], flush=True)
    finished, n, rows = [], [0], []
    for v in range(1, args.versions + 1):
        if v == 2:  # prefill of the first requests, then decode with no update for a baseline
            refill(engine, args, vocab, n)
            generate_for(engine, args.between_s, finished, args, vocab, n)
            out["baseline_tokens_per_s"] = generate_for(engine, args.between_s, finished, args,
                                                        vocab, n)
        steady = generate_for(engine, args.between_s, finished, args, vocab, n) if v > 2 else 0.0
        made = produced(engine, finished)
        barrier.wait()
        print("update", v, flush=True)
        r = engine.update_weights(v)
        print("updated", v, {k: r[k] for k in ("weight_recv_s", "pause_s") if k in r}, flush=True)
        r["generating"] = v > 1
        r["steady_tokens_per_s"] = steady
        r["tokens_during_receive"] = produced(engine, finished) - made
        rows.append(r)
    out.update(rows=rows, versions_applied=engine.version, probe_before=before,
               probe_after=probe_or_error(engine, probe))
    engine.close()
    q.put((f"rollout{index}", out))


def summarize(t: dict, r: dict) -> dict:
    med = statistics.median
    gen = [x for x in r["rows"] if x["generating"]]
    idle = r["rows"][0]
    raw_s = t["raw"]["median_s"]
    s = {
        "device": t["device"], "date": time.strftime("%Y-%m-%d"), "random_weights": True,
        "tp": r["tp"],
        "wire_GB": t["wire_bytes"] / 1e9, "buckets": t["buckets"], "staged": r["staged"],
        "engine_start_s": r["engine_start_s"],
        "raw_broadcast_s": raw_s, "raw_GB_per_s": t["wire_bytes"] / raw_s / 1e9,
        "idle_receive_s": idle["weight_recv_s"], "idle_ratio_to_raw": raw_s / idle["weight_recv_s"],
        "idle_pause_s": idle["pause_s"],
        "receive_s_median": med(x["weight_recv_s"] for x in gen),
        "trainer_transfer_s_median": med(x["weight_transfer_s"] for x in t["rows"][1:]),
        "trainer_prepare_s_median": med(x["weight_gather_s"] for x in t["rows"]),
        "pause_s_median": med(x["pause_s"] for x in gen),
        "pause_s_max": max(x["pause_s"] for x in gen),
        "swap_s_median": med(x.get("weight_swap_s", 0.0) for x in gen),
        "interrupted_median": med(x["interrupted"] for x in gen),
        "pause_mode": r["pause_mode"], "baseline_tokens_per_s": r["baseline_tokens_per_s"],
        "tokens_per_s_after_update_median": med(x["steady_tokens_per_s"] for x in gen[1:]),
        "resume_s_median": med(x["resume_s"] for x in gen),
        "tokens_per_s_during_receive_median": med(x["tokens_during_receive"] / x["weight_behind_s"]
                                                  for x in gen)
        if r["staged"] else None,
        "versions_sent": len(t["rows"]), "versions_applied": r["versions_applied"],
        # the engine's own verification of each update (engines/vllm/engine.py): weights
        # fingerprinted as changed, and how far the probe's logprobs moved (a probe vLLM did not
        # answer in time: skipped)
        "weights_changed": sum(int(x.get("weights_changed", 0)) for x in r["rows"]),
        "probe_skipped": sum(int(x.get("probe_skipped", 0)) for x in r["rows"]),
        "probe_logp_change_min": min((x["probe_logp_change"] for x in r["rows"]
                                      if "probe_logp_change" in x),
                                     default=None),
    }
    s["ratio_to_raw_median"] = raw_s / s["receive_s_median"]
    if isinstance(r["probe_before"], str) or isinstance(r["probe_after"], str):
        s["probe_error"] = [x for x in (r["probe_before"], r["probe_after"]) if isinstance(x, str)]
        return s
    hf = torch.tensor(t["probe_logprobs"])
    before, after = torch.tensor(r["probe_before"]), torch.tensor(r["probe_after"])
    s.update(probe_vs_trainer_before=(before - hf).abs().mean().item(),
             probe_vs_trainer_after=(after - hf).abs().mean().item(),
             probe_vs_trainer_after_max=(after - hf).abs().max().item(),
             probe_changed=(after - before).abs().mean().item())
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--tp", type=int, default=1,
                    help="the engine's tensor_parallel_size (GPUs 1..tp)")
    ap.add_argument("--engines", type=int, default=1,
                    help="rollout workers (data parallel), each on tp GPUs of its own")
    ap.add_argument("--versions", type=int, default=8)
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=4096)
    ap.add_argument("--between-s", type=float, default=2.0)
    ap.add_argument("--pause-mode", default="abort", choices=["abort", "keep"],
                    help="engine.vllm.pause_mode")
    ap.add_argument("--unstaged", action="store_true",
                    help="engine.vllm.staging=false: every update received in the pause")
    ap.add_argument("--normal-priority", action="store_true",
                    help="weights.high_priority=false: the broadcast and the receive's copies on "
                         "streams of normal priority")
    ap.add_argument("--staged-tp", action="store_true",
                    help="engine.vllm.staged_tp: at TP > 1 receive behind generation")
    ap.add_argument("--bucket-mb", type=int, default=1024)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.55)
    ap.add_argument("--stacks-after-s", type=float, default=300,
                    help="both processes print their stacks then")
    ap.add_argument("--out")
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    stores = tempfile.mkdtemp(prefix="areal-bench-stores-")
    ports = {"raw": 0, "weights": 0}  # both groups meet in FileStores under ``stores``
    ctx = mp.get_context("spawn")
    q, barrier = ctx.SimpleQueue(), ctx.Barrier(1 + args.engines)
    procs = []
    # GPU 0 trains, worker k generates on the tp GPUs after it: ids counted among this process's
    # visible GPUs
    roles = [(physical_gpus([0]), trainer, ())]
    roles += [(physical_gpus([1 + k * args.tp + i for i in range(args.tp)]), rollout, (k,))
              for k in range(args.engines)]
    for gpus, target, extra in roles:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus  # inherited by the spawned process
        procs.append(ctx.Process(target=target, args=(args, ports, stores, barrier, q, *extra)))
        procs[-1].start()
    got = {}
    while len(got) < len(procs):
        if q.empty():
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise SystemExit(f"a benchmark process failed (exit codes {dead}): see its "
                                 "traceback above")
            time.sleep(0.5)
            continue
        name, out = q.get()
        got[name] = out
    for p in procs:
        p.join(60)
    summary = summarize(got["trainer"], got["rollout0"])
    if args.engines > 1:  # every worker's own figures, and the worst of them at the top
        each = [summarize(got["trainer"], got[f"rollout{k}"]) for k in range(args.engines)]
        summary.update(engines=args.engines, per_engine=each,
                       ratio_to_raw_median=min(e["ratio_to_raw_median"] for e in each),
                       pause_s_median=max(e["pause_s_median"] for e in each),
                       pause_s_max=max(e["pause_s_max"] for e in each),
                       versions_applied=min(e["versions_applied"] for e in each))
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, **got}, f, indent=1)


if __name__ == "__main__":
    main()

"""vLLM's reload transfer's tensors built one parameter at a time from FSDP2 shards (two gloo
ranks) equal those of gathering the whole update first."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from areal_cli.engines.vllm.weights import transfer_plan, wire_tensors
from areal_cli.runtime import exit_now
from areal_cli.transport.weights import clean_name


def _rank(rank: int, init: str, path: str, out: str) -> None:
    from areal_cli.trainer.model import build_policy, full_parameters

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.manual_seed(0)
    model = build_policy(path, torch.device("cpu"), torch.float32, activation_checkpointing=False)
    assert hasattr(next(model.parameters()), "full_tensor")  # sharded over the two ranks
    specs = [(n, list(p.shape)) for n, p in model.named_parameters()]
    got = {}
    for fused in (False,):
        plan = transfer_plan(specs)
        # the reference: every full tensor gathered first, then each engine parameter's parts cast and stacked
        whole = {clean_name(n): t.detach().clone() for n, t in full_parameters(model)}
        reference = [(target, torch.cat([whole[p].to(torch.bfloat16) for p in parts])) for target, parts, _ in plan]
        # each engine parameter is due as soon as the last of its parts has been gathered
        at = {clean_name(n): i + 1 for i, (n, _) in enumerate(specs)}
        due = [max(at[p] for p in parts) for _, parts, _ in plan]
        consumed = [0]

        def counted(named, consumed=consumed):
            for item in named:
                consumed[0] += 1
                yield item

        streamed, left_at = [], []
        for target, tensor in wire_tensors(counted(full_parameters(model)), plan, torch.bfloat16):
            left_at.append(consumed[0])
            streamed.append((target, tensor.clone()))
        got[fused] = (reference, streamed, left_at, due)
    if rank == 0:
        torch.save(got, out)
    dist.destroy_process_group()
    exit_now(0)  # as every areal process ends: no interpreter teardown beside a gloo thread


def test_streamed_wire_tensors_equal_the_gathered_update(tiny_model, tmp_path):
    out = tmp_path / "rank0.pt"
    mp.spawn(_rank, args=(f"file://{tmp_path / 'store'}", str(tiny_model), str(out)), nprocs=2, join=True)
    for fused, (reference, streamed, left_at, due) in torch.load(out).items():
        assert [n for n, _ in streamed] == [n for n, _ in reference]  # the order the receiver expects
        assert all(a.dtype == torch.bfloat16 and torch.equal(a, b)
                   for (_, a), (_, b) in zip(streamed, reference, strict=True))
        assert left_at == due, fused  # none waited for a later parameter: never the whole update at once


def test_a_parameter_outside_the_plan_is_refused():
    plan = transfer_plan([("a.weight", [2, 2])])
    named = iter([("a.weight", torch.ones(2, 2)), ("b.weight", torch.ones(2))])
    stream = wire_tensors(named, plan, torch.bfloat16)
    assert next(stream)[0] == "a.weight"
    with pytest.raises(RuntimeError, match="b.weight is not in the transfer plan"):
        next(stream)

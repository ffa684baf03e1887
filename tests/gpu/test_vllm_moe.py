"""vLLM's MoE layers on a GPU (vLLM's MoE kernels staged: benchmarks/device/stage_moe.sh), on tiny
random MoE models of real layouts:

- the tensors the trainer sends (transformers 5's names, fused 3D experts), loaded in place through
  areal's routes (engines/vllm/inplace.py, experts.py), leave every engine parameter exactly as
  vLLM's own ``load_weights`` of the checkpoint's tensors does, and the engine then scores a
  sequence as transformers does with those weights;
- the experts vLLM returns for a request (``enable_return_routed_experts``, engines/vllm/routing.py)
  are those a teacher-forced transformers forward of the same tokens routes to.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from conftest import perturb, tiny_moe

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")

PROMPT = [1, 9690, 198, 504, 30, 2521, 77, 4102, 12]


def perturbed(src, out):
    """``src``'s checkpoint with every weight moved far (the policy after many steps)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    torch.manual_seed(1)
    perturb(model, 0.3)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def load_inplace_then_vllms_own(worker, path: str) -> dict:
    """In vLLM's worker: ``path``'s tensors as the trainer sends them, through areal's routes into
    the live parameters; then vLLM's own load_weights of the checkpoint's tensors on top, as
    stored on disk (per expert, Mixtral's ``block_sparse_moe``: vLLM loads those names, where
    transformers 5 renames and fuses on loading). Returns the parameters the second load changed
    (max |difference|)."""
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from areal_cli.engines.vllm.inplace import load_into, routes
    from areal_cli.transport.weights import param_specs

    model = worker.get_model()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    sent = {n: p.detach().cuda() for n, p in hf.named_parameters()}
    live = dict(model.named_parameters())
    with torch.no_grad():
        for name, (target, shard) in routes(param_specs(hf), live).items():
            load_into(live[target], sent[name], shard)
        ours = {n: p.detach().clone() for n, p in live.items()}
        disk = {}
        for f in sorted(Path(path).glob("*.safetensors")):
            disk.update(load_file(f, device="cuda"))
        model.load_weights(iter(disk.items()))
    return {n: float((p.detach() - ours[n]).abs().max()) for n, p in live.items()
            if not torch.equal(p.detach(), ours[n])}


def transformers_scores(path, ids: list[int]):
    """(log π(ids[t] | ids[:t]) for t ≥ 1, the experts of every position) in float32 on the GPU."""
    from transformers import AutoModelForCausalLM

    from areal_cli import moe

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()
    routers = moe.Routers.install(model)
    routers.record = True
    with torch.no_grad():
        logits = model(torch.tensor([ids], device="cuda")).logits[0].float()
    nxt = torch.tensor(ids[1:], device="cuda")[:, None]
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, nxt)[:, 0]
    return lp.cpu(), routers.take_recorded().cpu().numpy()


@pytest.mark.parametrize("kind", ["qwen3_moe", "olmoe", "qwen2_moe", "mixtral"])
def test_moe_weights_load_in_place_as_vllm_loads_them_and_routing_comes_back(kind, tmp_path,
                                                                           monkeypatch):
    import vllm

    from areal_cli.engines.vllm.routing import Routing

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker in this process
    a = tiny_moe(tmp_path / "a", kind, experts=8)
    b = perturbed(a, tmp_path / "b")
    # (a few sequences, a short context: vLLM's FlexAttention, which it picks for some of these
    # float32 layouts, keeps a table of sequences × KV blocks, 41 GiB at its defaults for a model
    # this small). Each case's engine stays in this process: 0.15 of the card each lets the four
    # start (at 0.3, four would ask for 1.2 cards)
    llm = vllm.LLM(model=str(a), dtype="float32", enforce_eager=True, gpu_memory_utilization=0.15,
                   enable_return_routed_experts=True, enable_prefix_caching=False, seed=0,
                   max_num_seqs=8, max_model_len=1024)
    changed = llm.collective_rpc(load_inplace_then_vllms_own, args=(str(b),))[0]
    assert changed == {}  # areal's routes wrote exactly what vLLM's own loader writes
    params = vllm.SamplingParams(max_tokens=4, temperature=1.0, prompt_logprobs=0, ignore_eos=True,
                                 detokenize=False)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    ids = PROMPT + list(out.outputs[0].token_ids)
    want_lp, want_routing = transformers_scores(b, ids)
    got_lp = torch.tensor([lp[t].logprob for t, lp in zip(PROMPT[1:], out.prompt_logprobs[1:],
                                                         strict=True)])
    assert (got_lp - want_lp[:len(PROMPT) - 1]).abs().max() < 2e-2  # B's weights, in place
    a_lp, _ = transformers_scores(a, ids)
    assert (a_lp - want_lp).abs().max() > 0.5  # and they are far from A's
    routing = Routing(llm.llm_engine.model_config.hf_config)
    got = np.stack(routing.of(out.outputs[0].routed_experts, len(ids) - 1))
    assert got.shape == want_routing[:-1].shape  # [prompt + output - 1, sparse layers, top-k]
    same = (np.sort(got, -1) == np.sort(want_routing[:-1], -1)).all(-1)
    assert same.mean() > 0.9, same  # the same experts, but for near ties between float32 kernels

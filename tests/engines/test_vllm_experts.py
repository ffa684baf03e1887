"""In-place updates of MoE models into vLLM (engines/vllm/experts.py), the parts that run without
vLLM: which engine parameter and which loader calls (shard id, expert id) each tensor the trainer
sends takes. The engine's parameter names are vLLM 0.26's (``Qwen3MoeSparseMoeBlock``: ``gate``,
then ``experts`` = FusedMoE holding ``routed_experts.w13_weight`` / ``w2_weight``; Mixtral's block
is ``block_sparse_moe``). vLLM's loaders run on a GPU (tests/gpu/test_vllm_moe.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_moe

from areal_cli.engines.vllm.experts import Experts, check_backends, expert_route, pieces
from areal_cli.engines.vllm.inplace import load_into, routes
from areal_cli.engines.vllm.weights import choose_weight_update
from areal_cli.transport.weights import param_specs


def engine_names(kind: str, layers: int = 2) -> set[str]:
    """vLLM 0.26's parameter names of ``tiny_moe``'s layouts (tied embeddings but OLMoE's and
    Mixtral's)."""
    block = "block_sparse_moe" if kind == "mixtral" else "mlp"
    out = {"model.embed_tokens.weight", "model.norm.weight"} | (
        {"lm_head.weight"} if kind in ("olmoe", "mixtral") else set())
    for i in range(layers):
        p = f"model.layers.{i}"
        out |= {f"{p}.self_attn.qkv_proj.weight", f"{p}.self_attn.o_proj.weight",
                f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight",
                f"{p}.{block}.gate.weight", f"{p}.{block}.experts.routed_experts.w13_weight",
                f"{p}.{block}.experts.routed_experts.w2_weight"}
        if kind in ("qwen3_moe", "olmoe"):
            out |= {f"{p}.self_attn.q_norm.weight", f"{p}.self_attn.k_norm.weight"}
        if kind == "qwen2_moe":
            out |= {f"{p}.self_attn.qkv_proj.bias", f"{p}.mlp.shared_expert.gate_up_proj.weight",
                    f"{p}.mlp.shared_expert.down_proj.weight",
                    f"{p}.mlp.shared_expert_gate.weight"}
    return out


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe", "olmoe", "mixtral"])
def test_every_tensor_the_trainer_sends_reaches_one_engine_parameter(kind, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_moe(tmp_path / kind, kind, experts=4))
    specs = param_specs(model)  # what the trainer sends: transformers 5's fused 3D experts
    shapes = {s.name: s.shape for s in specs}
    params = {}
    for name in engine_names(kind):  # each engine parameter shaped as vLLM holds it at TP 1
        src = name.replace("block_sparse_moe", "mlp").replace(".routed_experts", "")
        src = src.replace("w13_weight", "gate_up_proj").replace("w2_weight", "down_proj")
        params[name] = torch.zeros(shapes.get(src, (1,)))
    got = routes(specs, params)  # raises where a tensor or a parameter is left over
    block = "block_sparse_moe" if kind == "mixtral" else "mlp"
    experts = f"model.layers.1.{block}.experts.routed_experts"
    assert got["model.layers.1.mlp.experts.gate_up_proj"] == (f"{experts}.w13_weight",
                                                               Experts("w13_weight", ("w1", "w3"),
                                                                       None))
    assert got["model.layers.1.mlp.experts.down_proj"] == (f"{experts}.w2_weight",
                                                           Experts("w2_weight", ("w2",), None))
    assert got["model.layers.1.mlp.gate.weight"] == (f"model.layers.1.{block}.gate.weight", None)
    assert got["model.layers.0.self_attn.k_proj.weight"][1] == "k"
    assert choose_weight_update("auto", tmp_path / kind, 1)[0] == "inplace"


def test_one_experts_matrices_of_a_per_expert_checkpoint_route_with_its_id():
    params = {"model.layers.2.mlp.experts.w13_weight", "model.layers.2.mlp.experts.w2_weight"}
    assert expert_route("model.layers.2.mlp.experts.5.up_proj.weight", params) == (
        "model.layers.2.mlp.experts.w13_weight", Experts("w13_weight", ("w3",), 5))
    assert expert_route("model.layers.2.block_sparse_moe.experts.7.w2.weight", params) is None
    assert expert_route("model.layers.2.mlp.down_proj.weight", params) is None  # a dense MLP


def test_a_fused_tensor_whose_experts_do_not_match_names_the_fallback():
    params = {"model.layers.0.mlp.experts.routed_experts.w13_weight": torch.zeros(4, 16, 8),
              "model.layers.0.mlp.experts.routed_experts.w2_weight": torch.zeros(4, 8, 8)}
    from areal_cli.transport.weights import ParamSpec

    specs = [ParamSpec("model.layers.0.mlp.experts.gate_up_proj", (8, 16, 8), 1024),
             ParamSpec("model.layers.0.mlp.experts.down_proj", (4, 8, 8), 256)]
    with pytest.raises(ValueError,
                       match="gate_up_proj of shape \\[8, 16, 8\\].*weight_update=reload"):
        routes(specs, params)


def vllm_like_loader(tp_rank: int, tp: int):
    """vLLM's ``RoutedExperts.weight_loader`` for one expert's 2D matrix, unquantized (its
    ``_load_w13`` / ``_load_w2``): w1/w3 keep rows ``tp_rank`` of ``tp`` and go to the first/second
    half of the expert's w13 rows; w2 keeps columns ``tp_rank`` of ``tp``."""

    def load(param, weight, weight_name, shard_id, expert_id):
        assert "weight" in weight_name  # vLLM loads nothing for a name without it
        dst = param.data[expert_id]
        if shard_id == "w2":
            n = weight.shape[1] // tp
            dst.copy_(weight[:, tp_rank * n:(tp_rank + 1) * n])
            return
        n, half = weight.shape[0] // tp, dst.shape[0] // 2
        rows = dst[:half] if shard_id == "w1" else dst[half:]
        rows.copy_(weight[tp_rank * n:(tp_rank + 1) * n])

    return load


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_fused_experts_land_gate_then_up_per_expert_in_this_tp_ranks_slice(tp_rank):
    experts, inner, hidden, tp = 3, 4, 5, 2
    gate_up = torch.randn(experts, 2 * inner, hidden)  # transformers 5: gate rows, then up rows
    down = torch.randn(experts, hidden, inner)
    w13 = torch.nn.Parameter(torch.zeros(experts, 2 * inner // tp, hidden), requires_grad=False)
    w2 = torch.nn.Parameter(torch.zeros(experts, hidden, inner // tp), requires_grad=False)
    w13.weight_loader = w2.weight_loader = vllm_like_loader(tp_rank, tp)
    load_into(w13, gate_up, Experts("w13_weight", ("w1", "w3"), None))
    load_into(w2, down, Experts("w2_weight", ("w2",), None))
    n = inner // tp
    for e in range(experts):
        gate, up = gate_up[e, :inner], gate_up[e, inner:]
        want = torch.cat([gate[tp_rank * n:(tp_rank + 1) * n], up[tp_rank * n:(tp_rank + 1) * n]])
        assert torch.equal(w13[e], want)
        assert torch.equal(w2[e], down[e][:, tp_rank * n:(tp_rank + 1) * n])
    calls = [(e, s) for e, s, _ in pieces(gate_up, Experts("w13_weight", ("w1", "w3"), None))]
    assert calls == [(0, "w1"), (0, "w3"), (1, "w1"), (1, "w3"), (2, "w1"), (2, "w3")]


def test_a_backend_that_re_lays_the_experts_out_is_refused():
    check_backends({"model.layers.0.mlp.experts.routed_experts": "TRITON"})
    with pytest.raises(ValueError, match="FLASHINFER_CUTLASS.*engine.weight_update=reload"):
        check_backends({"a": "TRITON", "b": "FLASHINFER_CUTLASS"})

"""The one engine factory: the rollout worker and the evaluator both get their engine from
``make_engine``, the trainer its weight sender from ``make_sender``; a real gloo broadcast from
that sender lands in the engine's own ``update_weights`` on a tiny model."""

from __future__ import annotations

import dataclasses
import importlib.util
import socket
import threading

import pytest
import torch
from conftest import perturb
from transformers import AutoModelForCausalLM, AutoTokenizer

from areal_cli.config.schema import EngineConfig, RootConfig
from areal_cli.config.task import RewardConfig
from areal_cli.engines import engines
from areal_cli.engines.base import Engine, EngineSetup, Sampling
from areal_cli.engines.factory import make_engine, make_sender
from areal_cli.rollout.main import engine_setup
from areal_cli.runconfig.autos import resolve
from areal_cli.transport.channels import Endpoints
from areal_cli.transport.messages import WorkItem
from areal_cli.transport.weights import WeightSenderBase


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cfg(tiny_model) -> RootConfig:
    cfg = RootConfig(model=str(tiny_model))
    cfg.engine.dtype, cfg.engine.kv_cache_tokens, cfg.engine.page_size = "float32", 2048, 32
    cfg.rollout.temperature, cfg.rollout.top_p = 0.7, 0.9
    cfg.launcher.peer_timeout_s = 60
    return resolve(cfg)  # as the launcher plans a run on the CPU: gloo, float32 on the wire


def endpoints(port: int) -> Endpoints:
    return Endpoints("", "", "", "", "", "127.0.0.1", port)


def in_thread(fn):
    """Run ``fn`` in a thread (both ends of a group block until the other joins); join() → its
    result."""
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(out=fn()))
    t.start()

    def join():
        t.join(120)
        assert "out" in box, "the other end never finished"
        return box["out"]
    return join


def test_every_registered_engine_module_defines_its_engine_and_sender():
    """Adding an engine is one package with its spec: the module has what the factory calls
    (importing it imports no optional package: the vllm module loads here without vLLM)."""
    for name, s in engines().items():
        module = s.load()
        assert issubclass(module.ENGINE, Engine), name
        assert callable(module.make_sender), name


def test_an_unknown_engine_is_a_value_error_naming_the_choices(tiny_model):
    setup = EngineSetup(EngineConfig(name="sglang"), tiny_model, 2, Sampling(1.0), sequences=1)
    with pytest.raises(ValueError, match=r"engine='sglang': use engine=hf or engine=vllm"):
        make_engine(setup)
    cfg = RootConfig()
    cfg.engine.name = "sglang"
    with pytest.raises(ValueError, match=r"engine='sglang': use engine=hf or engine=vllm"):
        make_sender(cfg, "127.0.0.1", free_port(), torch.nn.Linear(2, 2), torch.device("cpu"))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_names_the_extra(tiny_model):
    setup = EngineSetup(EngineConfig(name="vllm"), tiny_model, 2, Sampling(1.0), sequences=1)
    with pytest.raises(ValueError, match=r"areal-cli\[vllm\]"):
        make_engine(setup)


def test_the_evaluator_gets_its_engine_from_the_factory_without_a_weight_source(tiny_model):
    from areal_cli.eval.runner import Evaluator

    with Evaluator(tiny_model, RewardConfig(workers=1), EngineConfig(dtype="float32"),
                   max_concurrent=4) as ev:
        assert isinstance(ev.engine, Engine) and ev.engine.receiver is None
        assert ev.engine._running[0].greedy  # greedy until a pass says otherwise
        with pytest.raises(RuntimeError, match="without a weight source"):
            ev.engine.update_weights(1)


def test_work_items_carry_no_sampling_settings_the_engine_takes_them_from_the_config():
    """Sampling is per run (rollout.temperature / top_p, the trainer divides by the same T), not per
    request: the wire type has no field that would pretend otherwise."""
    fields = {f.name for f in dataclasses.fields(WorkItem)}
    assert not fields & {"temperature", "top_p", "top_k", "seed"}


def test_sender_broadcasts_into_the_rollout_engines_own_update_weights(tiny_model):
    """Trainer rank 0's sender from make_sender, a rollout worker's engine from make_engine (the
    worker's own setup): a real gloo broadcast; the engine's weights equal the trainer's after."""
    cfg, port = run_cfg(tiny_model), free_port()
    tok = AutoTokenizer.from_pretrained(tiny_model)
    trainer = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    setup = dataclasses.replace(engine_setup(cfg, 0, tok, endpoints(port)), device="cpu")
    join_sender = in_thread(lambda: make_sender(cfg, "127.0.0.1", port, trainer,
                                                torch.device("cpu")))
    engine = make_engine(setup)
    sender = join_sender()
    try:
        assert isinstance(sender, WeightSenderBase) and engine.receiver is not None
        sampling = engine._running[0]  # rollout.temperature / top_p, as the config says
        assert not sampling.greedy and sampling.temperature == 0.7 and sampling.top_p == 0.9
        perturb(trainer, 0.1)
        assert not torch.equal(trainer.model.embed_tokens.weight,
                               engine.model.model.embed_tokens.weight)
        sender.prepare(iter(trainer.named_parameters()))
        join_broadcast = in_thread(lambda: sender.broadcast(digest=True))
        timings = engine.update_weights(1)
        sent = join_broadcast()
        assert set(timings) == {"weight_recv_s", "weight_load_s", "pause_s", "pause_wait_s",
                                "interrupted"}
        assert engine.version == 1 and sent["weights_sha"] == engine.weights_digest()
        got = dict(engine.model.named_parameters())
        for name, p in trainer.named_parameters():
            assert torch.equal(p, got[name]), f"{name} differs after the update"
    finally:
        engine.close()
        sender.close()

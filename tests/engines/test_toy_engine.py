"""Adding an engine is one package under engines/ with its spec, and no edit anywhere else: a toy
engine written into a package directory of its own is found by the registry, built by the factory,
its spec read where the config is resolved and the run is planned, and its name accepted in checks."""

from __future__ import annotations

import sys
import textwrap

import pytest

import areal_cli.engines
from areal_cli.config.schema import EngineConfig, RootConfig
from areal_cli.engines import engines, spec, unknown
from areal_cli.engines.base import EngineSetup, Sampling, Sequence
from areal_cli.engines.factory import make_engine, make_sender
from areal_cli.launcher.plan import lora_notes, weight_notes
from areal_cli.runconfig.autos import resolve, resolve_engine

SPEC = '''
from areal_cli.engines.spec import EngineSpec

SPEC = EngineSpec("toy", loads_model=False, tensor_parallel=False, fp32_logits=True, merges_lora=True,
                  lora_apply="the toy engine ignores adapters")
'''

ENGINE = '''
import contextlib

from areal_cli.engines.base import Engine


class ToyEngine(Engine):
    """Every sequence finishes at once with max_new_tokens copies of token 7."""

    def __init__(self, setup, doing):
        self.setup, self.seqs, self.done = setup, {}, []
        doing("loading the model")

    def _submit_segment(self, seq):
        n = seq.max_new_tokens
        seq.output_ids, seq.logprobs, seq.versions = [7] * n, [0.0] * n, [self.version] * n
        seq.finish_reason = "length"
        self.done.append(self.seqs.pop(seq.rid))

    def _abort_segment(self, seq):
        pass

    def poll(self, timeout_s):
        out, self.done = self.done, []
        return out

    def configure(self, sampling, context):
        self.setup = self.setup

    @contextlib.contextmanager
    def paused(self, version):
        yield {}
        self.version = version

    def close(self):
        pass


ENGINE = ToyEngine


def make_sender(cfg, host, port, model, device, store=""):
    return ("toy sender", host, port)
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """engines/toy/ (spec.py, engine.py) in a directory of its own, on the engines package's path."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text('"""engine=toy: a test\'s engine."""\n')
    (package / "spec.py").write_text(textwrap.dedent(SPEC))
    (package / "engine.py").write_text(textwrap.dedent(ENGINE))
    monkeypatch.setattr(areal_cli.engines, "__path__", [*areal_cli.engines.__path__, str(tmp_path)])
    yield "toy"
    for name in [m for m in sys.modules if m.startswith("areal_cli.engines.toy")]:
        del sys.modules[name]


def test_a_toy_engine_is_found_built_and_read_by_the_planner(toy, tmp_path):
    assert toy in engines() and spec(toy).lora_apply == "the toy engine ignores adapters"
    assert unknown(toy) == "" and "engine=toy" in unknown("sglang")
    heard = []
    engine = make_engine(EngineSetup(EngineConfig(name=toy), tmp_path, 2, Sampling(1.0), sequences=1), heard.append)
    engine.submit(Sequence("a", [1, 2], 3))
    assert [s.output_ids for s in engine.poll(0.0)] == [[7, 7, 7]] and heard == ["loading the model"]
    cfg = RootConfig()
    cfg.engine.name = toy
    assert make_sender(cfg, "127.0.0.1", 1, None, None) == ("toy sender", "127.0.0.1", 1)
    # the config's autos and the plan's notes come from its spec (the EngineSpec defaults where it has none)
    e = resolve_engine(cfg.engine)
    assert (e.lm_head_fp32, e.lora_merge, e.weight_update) == ("true", "true", "inplace")
    resolved = resolve(cfg)
    assert "each toy engine's parameters" in weight_notes(cfg, resolved, None)[0]
    resolved.trainer.lora.rank, resolved.engine.lora_merge = 8, "false"
    assert "the toy engine ignores adapters" in lora_notes(resolved, None)[0]


def test_without_its_package_the_toy_engine_is_unknown():
    assert "toy" not in engines()
    with pytest.raises(ValueError, match="engine='toy': use engine=hf or engine=vllm"):
        spec("toy")

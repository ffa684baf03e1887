"""engine.vllm.* and engine.hf.*: the keys only one engine reads, in that engine's section. A key
that moved there, given at its old flat place (command line, config file, a run's config.yaml),
is an error naming its new place."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from omegaconf import OmegaConf

from areal_cli.config.engine import MOVED_KEYS, EngineConfig, HFConfig, VLLMConfig
from areal_cli.eval.config import compose_eval
from areal_cli.runconfig.compose import ConfigError, compose, load_yaml, save_yaml, to_yaml


def test_an_old_flat_key_on_the_command_line_names_its_new_place():
    with pytest.raises(ConfigError) as err:
        compose(["engine=vllm", "engine.max_model_len=2048"])
    assert str(err.value) == "  - engine.max_model_len moved to engine.vllm.max_model_len"


def test_every_moved_key_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        compose([f"{old}=1" for old in MOVED_KEYS])
    assert err.value.problems == [f"{old} moved to {new}" for old, new in MOVED_KEYS.items()]


def test_an_old_flat_key_of_areal_eval_names_its_new_place():
    with pytest.raises(ConfigError, match="engine.tensor_parallel_size moved to "
                                          "engine.vllm.tensor_parallel_size"):
        compose_eval(["engine=vllm", "engine.tensor_parallel_size=2"])


def test_an_old_flat_key_in_a_config_file_names_its_new_place(tmp_path):
    tree = OmegaConf.to_container(OmegaConf.create(to_yaml(compose([]))))
    tree["engine"]["cpu_batching"] = "paged"
    tree["engine"]["pause_mode"] = "keep"
    path = tmp_path / "config.yaml"
    path.write_text(OmegaConf.to_yaml(tree))
    with pytest.raises(ConfigError) as err:
        load_yaml(path, check=False, private=False)
    assert err.value.problems == ["engine.pause_mode moved to engine.vllm.pause_mode",
                                  "engine.cpu_batching moved to engine.hf.cpu_batching"]


def test_the_sections_round_trip_through_config_yaml(tmp_path):
    cfg = compose(["engine=vllm", "engine.vllm.max_model_len=2048", "engine.vllm.pause_mode=keep",
                   "engine.vllm.tensor_parallel_size=2", "engine.vllm.staging=false",
                   "engine.hf.cpu_batching=paged"])
    assert (cfg.engine.vllm.max_model_len, cfg.engine.vllm.pause_mode,
            cfg.engine.vllm.tensor_parallel_size, cfg.engine.vllm.staging,
            cfg.engine.hf.cpu_batching) == (2048, "keep", 2, False, "paged")
    save_yaml(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "  vllm:\n" in text and "  hf:\n" in text
    assert load_yaml(tmp_path / "config.yaml", check=False, private=False) == cfg


def test_the_presets_set_their_engine_s_section():
    vllm, hf = compose(["engine=vllm"]).engine, compose(["engine=hf"]).engine
    assert vllm.vllm == VLLMConfig() and hf.hf == HFConfig()


def test_each_moved_key_is_gone_from_its_old_place_and_found_at_its_new_one():
    hints = typing.get_type_hints(EngineConfig)
    flat = {f.name for f in dataclasses.fields(EngineConfig)}
    for old, new in MOVED_KEYS.items():
        _, name = old.split(".")
        _, section, new_name = new.split(".")
        assert name not in flat and name == new_name
        assert name in {f.name for f in dataclasses.fields(hints[section])}
    moved = {new.split(".")[2] for new in MOVED_KEYS.values()}
    in_sections = {f.name for cls in (VLLMConfig, HFConfig) for f in dataclasses.fields(cls)}
    assert moved == in_sections  # every field of a section moved there from engine.*

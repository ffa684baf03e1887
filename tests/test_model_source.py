"""model= as a Hugging Face Hub id, offline against a real Hub-style cache built here (no network:
HF_HUB_OFFLINE=1 everywhere): resolution, the dry-run, and the errors that stop a run before any
process starts (not cached, unsupported architectures)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from conftest import AREAL, ROOT
from hub_cache import add_config_only, add_model, commit_of

from areal_cli.architectures import check_supported
from areal_cli.model_source import ModelError, hub_model, resolve_model

REPOS = {"Org/TinyLlama": "llama", "Org/TinyQwen2": "qwen2", "Org/TinyQwen3": "qwen3",
         "Qwen/Qwen2.5-1.5B-Instruct": "qwen2"}  # the last stands in for the docs' alias


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    """A Hub cache holding tiny models of every supported dense layout, and two unsupported ones (an
    MoE layout areal does not know, a vision model)."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    tok = resolve_model("smollm2-135m-instruct")
    snaps = {repo: add_model(cache, repo, kind, tok) for repo, kind in REPOS.items()}
    base = snaps["Org/TinyQwen2"]
    moe = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
           "n_routed_experts": 64}
    add_config_only(cache, "Org/TinyMoE", moe, base)
    vision = {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
              "vision_config": {"depth": 2}}
    add_config_only(cache, "Org/TinyVL", vision, base)
    return cache, snaps


@pytest.fixture
def offline(hub, monkeypatch):
    cache, snaps = hub
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache, snaps


def areal(cache, *args, timeout=180):
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(AREAL + list(args), capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


@pytest.mark.parametrize("repo", ["Org/TinyLlama", "Org/TinyQwen2", "Org/TinyQwen3"])
def test_hub_id_resolves_offline_to_its_cached_snapshot(offline, repo):
    cache, snaps = offline
    path = resolve_model(repo)
    assert path == snaps[repo] and path.parent.name == "snapshots" and path.name == commit_of(repo)
    check_supported(path, repo)  # Llama, Qwen2 and Qwen3 dense layouts pass
    assert resolve_model(f"{repo}@{commit_of(repo)}") == path  # a pinned commit, from the cache too


def test_aliases_and_paths_are_not_taken_for_hub_ids(offline, tmp_path):
    assert hub_model("qwen2.5-1.5b-instruct").repo_id == "Qwen/Qwen2.5-1.5B-Instruct"
    assert hub_model("smollm2-135m-instruct") is None  # the GGUF alias
    assert hub_model("Org/Name@v1.0").revision == "v1.0"
    (tmp_path / "runs" / "x").mkdir(parents=True)
    os.chdir(tmp_path)
    assert hub_model("runs/x") is None  # an existing relative path wins over the Org/Name reading
    assert hub_model("./a/b") is None and hub_model("/abs/path") is None


def test_not_cached_offline_names_the_switch_the_cache_and_a_local_copy(offline):
    cache, _ = offline
    with pytest.raises(ModelError) as err:
        resolve_model("Org/NotCached")
    msg = str(err.value)
    assert ("HF_HUB_OFFLINE" in msg and str(cache) in msg and "HF_HUB_CACHE" in msg
            and "HF_HOME" in msg)
    assert "model=/path/to/dir" in msg


def test_dry_run_of_a_cached_hub_id_says_where_it_is_and_changes_nothing(hub):
    cache, snaps = hub
    proc = areal(cache, "train", "model=Org/TinyQwen3", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"Org/TinyQwen3 (revision main): cached at {snaps['Org/TinyQwen3']}" in proc.stdout
    assert "# weight updates" in proc.stdout and "areal_cli.trainer.main" in proc.stdout


def test_not_cached_offline_exits_2_before_anything_starts(hub, tmp_path):
    cache, _ = hub
    for extra in ([], ["--dry-run"]):
        proc = areal(cache, "train", "model=Org/NotCached", f"run_dir={tmp_path / 'run'}", *extra)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "HF_HUB_OFFLINE" in proc.stderr and str(cache) in proc.stderr
        assert "model=/path/to/dir" in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "run").exists()  # no run directory, no process


@pytest.mark.parametrize("repo,reason",
                         [("Org/TinyMoE", "mixture-of-experts"), ("Org/TinyVL", "multimodal")])
def test_unsupported_model_types_exit_2_with_the_reason(hub, tmp_path, repo, reason):
    cache, _ = hub
    proc = areal(cache, "train", f"model={repo}", f"run_dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and reason in proc.stderr, proc.stderr
    assert "llama, qwen2, qwen3" in proc.stderr and not (tmp_path / "run").exists()


def test_unknown_architecture_in_a_local_directory_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "architectures": '
                                          '["GPT2LMHeadModel"]}')
    with pytest.raises(ModelError, match="model_type=gpt2"):
        check_supported(tmp_path, "model=x")
    (tmp_path / "config.json").write_text('{"model_type": "qwen2", "architectures": '
                                          '["Qwen2ForSequenceClassification"]}')
    with pytest.raises(ModelError, match="causal-LM head Qwen2ForCausalLM"):
        check_supported(tmp_path, "model=x")


@pytest.mark.slow  # 10-19 s: make test-slow (make test stays within 15 minutes)
def test_docs_examples_with_the_hub_alias_run_through_dry_run(hub):
    """docs/multinode.md's Slurm example and a local one, with the alias resolved from the cache."""
    cache, snaps = hub
    slurm = areal(cache, "train", "launcher=slurm", "launcher.nodes=2", "launcher.gpus_per_node=8",
                  "launcher.partition=gpu", "launcher.time=12:00:00", "model=qwen2.5-1.5b-instruct",
                  "engine=vllm", "--dry-run")
    assert slurm.returncode == 0, slurm.stderr
    assert "#SBATCH --nodes=2" in slurm.stdout
    local = areal(cache, "train", "model=qwen2.5-1.5b-instruct", "--dry-run")
    assert local.returncode == 0 and str(snaps["Qwen/Qwen2.5-1.5B-Instruct"]) in local.stdout


@pytest.mark.slow
def test_a_run_from_a_hub_id_loads_the_snapshot_in_every_process(hub, tmp_path):
    """One real step, offline: the launcher resolves the id once and every process loads the
    path."""
    from conftest import TINY_RUN

    cache, snaps = hub
    run = tmp_path / "run"
    proc = areal(cache, "train", "--quiet", f"run_dir={run}", "model=Org/TinyQwen2", *TINY_RUN,
                 "trainer.steps=1", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"model: Org/TinyQwen2 (revision main) → {snaps['Org/TinyQwen2']}" in proc.stdout
    assert f"model: {snaps['Org/TinyQwen2']}" in (run / "config.yaml").read_text()
    assert (run / "checkpoints" / "final" / "config.json").is_file()


def test_hub_failures_name_their_fix():
    """What the Hub answers (gated, missing, unreachable, wrapped by a dry run) as a message with
    the fix."""
    import httpx2
    from huggingface_hub.errors import DryRunError, GatedRepoError, RepositoryNotFoundError

    from areal_cli.hub import HubModel, hub_errors

    response = httpx2.Response(401, request=httpx2.Request("GET", "https://huggingface.co/api/models/a/b"))
    m = HubModel.parse("meta-llama/Llama-3.2-1B-Instruct")
    cases = [(GatedRepoError("gated", response=response), "hf auth login"),
             (RepositoryNotFoundError("404", response=response), "no such repository"),
             (httpx2.ConnectError("Name or service not known"),
              "could not be reached (ConnectError"),
             (DryRunError("cannot dry run"), "could not be reached (DryRunError")]
    wrapped = DryRunError("cannot dry run")
    wrapped.__cause__ = GatedRepoError("gated", response=response)
    cases.append((wrapped, "a gated repository"))
    for err, fix in cases:
        with pytest.raises(ModelError, match=re.escape(fix)), hub_errors(m):
            raise err
    with pytest.raises(KeyError), hub_errors(m):  # not the Hub's: raised as it is
        raise KeyError("x")


def test_a_gguf_needed_by_two_processes_at_once_is_converted_once(tmp_path, monkeypatch):
    """Two runs (or two test workers) resolving the alias at the same moment: one converts, the
    other waits for its lock and returns the finished directory."""
    import threading
    import time

    from areal_cli import model_source

    calls, out = [], tmp_path / "cache" / "m"

    def convert(gguf, to):
        calls.append(to)
        to.mkdir()
        (to / "config.json").write_text("{}")
        time.sleep(0.3)  # the other caller arrives while this one writes
        (to / "model.safetensors").write_text("w")

    monkeypatch.setattr(model_source, "_convert", convert)
    got = []
    threads = [threading.Thread(target=lambda: got.append(model_source.convert_gguf(tmp_path, out)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [out] and got == [out, out]
    assert (out / "model.safetensors").read_text() == "w"


def test_a_converted_tokenizer_decodes_byte_level_where_llguidance_reads_its_bytes(tmp_path):
    """Some transformers versions write a GGUF tokenizer's decoder as ByteFallback, Fuse, Replace
    "▁", ByteLevel: llguidance then takes the newline token "Ċ" for the two characters and masks
    the wrong tokens (vLLM's structured outputs sampled outside the grammar). A directory with
    that decoder, converted earlier, gets a plain ByteLevel one when resolved again, and decodes
    every token as before."""
    import json
    import shutil

    import llguidance.hf
    from transformers import AutoTokenizer

    from areal_cli import model_source

    src = resolve_model("smollm2-135m-instruct")
    out = tmp_path / "m"
    shutil.copytree(src, out)
    tj = json.loads((out / "tokenizer.json").read_text())
    tj["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    before = AutoTokenizer.from_pretrained(out)
    newline = before.convert_tokens_to_ids("Ċ")
    assert llguidance.hf.from_tokenizer(before).decode_bytes([newline]) == "Ċ".encode()
    text = '{"answer": 89, "confidence": "high"}\n<tool_call>\n  x = ü\n'
    ids = before.encode(text)

    assert model_source.convert_gguf(tmp_path, out) == out  # converted: only the decoder changes
    after = AutoTokenizer.from_pretrained(out)
    assert json.loads((out / "tokenizer.json").read_text())["decoder"]["type"] == "ByteLevel"
    assert llguidance.hf.from_tokenizer(after).decode_bytes([newline]) == b"\n"
    assert after.decode(ids) == before.decode(ids) and after.encode(text) == ids
    assert model_source._byte_level_fix(out / "tokenizer.json") is None  # nothing more to change
    assert model_source._byte_level_fix(src / "tokenizer.json") is None

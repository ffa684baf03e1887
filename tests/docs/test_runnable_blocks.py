"""Every command in a block of README.md or docs/ marked ``<!-- runnable -->`` runs here on the CPU,
rewritten by the rules of ``runnable.py`` (a full run is planned as ``--dry-run`` plans it), so a
renamed key, preset, option or command fails this test instead of a reader."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_RUN, run_train, tiny_classifier
from hub_cache import add_model, snapshot

sys.path.insert(0, str(Path(__file__).parent))
from runnable import check_line, documents, needs_run, runnable_lines  # noqa: E402

LINES = [line for doc in documents(ROOT) for line in runnable_lines(doc, ROOT)]


def test_readme_and_the_guides_have_runnable_blocks():
    where = {line.where.split(":")[0] for line in LINES}
    assert "README.md" in where and len(where) >= 5, where
    assert any(line.words[:2] == ["make", "train"] for line in LINES)


@pytest.fixture(scope="module")
def run(tiny_model, tmp_path_factory) -> Path:
    """A real 2-step run of the tiny model (with a checkpoint): what status, plot and resume
    read."""
    run_dir = tmp_path_factory.mktemp("docs") / "run"
    run_train(run_dir, f"model={tiny_model}", *TINY_RUN, "trainer.steps=2", "checkpoint.every=1")
    return run_dir


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    """A Hugging Face Hub cache (offline) holding a tiny model under every Hub id the documents name
    (``model=``, ``reward.model.path=``): the documented ids resolve as they would for a reader
    who has them cached, without a network."""
    from areal_cli.model_source import hub_model, resolve_model

    cache, tok = tmp_path_factory.mktemp("hf") / "hub", resolve_model("smollm2-135m-instruct")
    for line in LINES:
        for key, _, value in (w.partition("=") for w in line.words):
            hub_id = hub_model(value) if key in ("model", "reward.model.path") else None
            if hub_id is None or (cache / ("models--"
                                           + hub_id.repo_id.replace("/", "--"))).exists():
                continue
            if key == "reward.model.path":
                tiny_classifier(snapshot(cache, hub_id.repo_id), 1)
            else:
                name = hub_id.repo_id.lower()
                add_model(cache, hub_id.repo_id,
                          "qwen3" if "qwen3" in name else "qwen2" if "qwen" in name
                          else "llama", tok)
    return cache


# the commands that read a run share one worker, so that one real run serves them all
@pytest.mark.parametrize("line", [
    pytest.param(line, marks=[pytest.mark.xdist_group("docs-run")] if needs_run(line) else [])
    for line in LINES], ids=str)
def test_documented_command(line, hub, tmp_path, monkeypatch, request):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = request.getfixturevalue("run") if needs_run(line) else tmp_path / "no-run"
    check_line(line, tmp_path, run, ROOT / "Makefile")

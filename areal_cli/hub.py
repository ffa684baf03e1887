"""Hugging Face Hub ids (``model=Qwen/Qwen2.5-7B-Instruct``): the cache, the download, offline
errors.

A Hub id resolves to a snapshot directory in huggingface_hub's own cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``): the launcher resolves it once, before any
process starts, and every process gets the snapshot path. Only the files a run reads are fetched
(``PATTERNS``); downloads resume where they stopped and show huggingface_hub's progress bars.
Offline (``HF_HUB_OFFLINE=1``, or the Hub cannot be reached) a cached snapshot is used as is, and
a model that is not cached is an error naming the cache and how to point at a local copy.
``model=Org/Name@revision`` pins a branch, tag or commit (default ``main``).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from areal_cli.architectures import ModelError, check_supported

# config + generation config + tokenizer (json, sentencepiece, BPE merges) + safetensors weights
PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.txt"]
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


def looks_like_hub_id(name: str) -> bool:
    """``Org/Name`` or ``Org/Name@revision`` (``hub_model`` first rules out paths that exist)."""
    return bool(HUB_ID.match(name)) and not name.startswith((".", "/", "~"))


def hub_cache() -> Path:
    """huggingface_hub's cache directory, read from the environment now (not at import)."""
    env = os.environ
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    """HF_HUB_OFFLINE set: no request leaves the machine."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


@dataclass(frozen=True)
class HubModel:
    repo_id: str  # "Org/Name"
    revision: str  # branch, tag or commit ("main")

    @classmethod
    def parse(cls, name: str) -> HubModel:
        repo, _, rev = name.partition("@")
        return cls(repo, rev or "main")

    @property
    def folder(self) -> Path:
        """This repository's folder in the cache (``models--Org--Name``)."""
        return hub_cache() / ("models--" + self.repo_id.replace("/", "--"))

    def cached(self) -> Path | None:
        """The cached snapshot of this revision, complete for ``PATTERNS``; never touches the
        network."""
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            path = snapshot_download(self.repo_id, revision=self.revision, cache_dir=hub_cache(),
                                     allow_patterns=PATTERNS, local_files_only=True)
        except LocalEntryNotFoundError:
            return None
        return Path(path) if complete(Path(path)) else None

    def fetch(self) -> Path:
        """The snapshot directory: from the cache, else downloaded (config.json first, so that
        ``check`` can refuse an unsupported model before gigabytes of weights arrive)."""
        path = self.cached()
        if path is not None:
            return path
        if offline():
            raise ModelError(self.not_cached("HF_HUB_OFFLINE is set"))
        from huggingface_hub import hf_hub_download, snapshot_download

        with hub_errors(self):
            config = hf_hub_download(self.repo_id, "config.json", revision=self.revision,
                                     cache_dir=hub_cache())
            check_supported(Path(config).parent, f"model={self.repo_id}")
            path = Path(snapshot_download(self.repo_id, revision=self.revision,
                                          cache_dir=hub_cache(),
                                          allow_patterns=PATTERNS))
        if not complete(path):
            raise ModelError(f"model={self.repo_id}: {path} lacks *.safetensors weights or a "
                             "tokenizer (the repository may hold other formats only); save the "
                             "model with save_pretrained and point model= at that directory")
        return path

    def plan(self) -> list[str]:
        """What ``fetch`` would do, for ``--dry-run``: the cached path, or the files it would fetch
        from where (asks the Hub for the file list; downloads nothing)."""
        path = self.cached()
        if path is not None:
            return [f"{self.repo_id} (revision {self.revision}): cached at {path}"]
        if offline():
            raise ModelError(self.not_cached("HF_HUB_OFFLINE is set"))
        from huggingface_hub import snapshot_download

        with hub_errors(self):
            files = snapshot_download(self.repo_id, revision=self.revision, cache_dir=hub_cache(),
                                      allow_patterns=PATTERNS, dry_run=True)
        todo = [f for f in files if f.will_download]
        size = sum(f.file_size or 0 for f in todo)
        lines = [f"{self.repo_id} (revision {self.revision}, commit "
                 f"{files[0].commit_hash if files else '?'}): would fetch {len(todo)} files, "
                 f"{size / 2**30:.2f} GiB, from {endpoint()} into {self.folder}",
                 f"  files matching {' '.join(PATTERNS)}; config.json first (the architecture is "
                 "checked before the weights are fetched)"]
        lines += [f"  {f.filename}  {(f.file_size or 0) / 2**20:.1f} MiB" for f in todo]
        return lines

    def not_cached(self, why: str) -> str:
        return (f"model={self.repo_id}: revision {self.revision} is not in the Hugging Face cache "
                f"{hub_cache()} (set by HF_HUB_CACHE, or HF_HOME/hub) and {why}. Download it once "
                "where the Hub is reachable, with HF_HUB_OFFLINE unset (`hf download "
                f"{self.repo_id}`, or this same command), into that cache; or point at a local "
                "copy: model=/path/to/dir (a directory with config.json, *.safetensors and the "
                "tokenizer files)")


def complete(path: Path) -> bool:
    """A snapshot a run can load: config.json, every safetensors shard, a tokenizer."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        import json

        shards = set(json.loads(index.read_text())["weight_map"].values())
        weights = all((path / s).is_file() for s in shards)
    else:
        weights = any(path.glob("*.safetensors"))
    tokenizer = any((path / f).is_file()
                    for f in ("tokenizer.json", "tokenizer.model", "vocab.json"))
    return (path / "config.json").is_file() and weights and tokenizer


@contextlib.contextmanager
def hub_errors(model: HubModel):
    """huggingface_hub's exceptions as a ModelError naming the fix (a dry run wraps the cause)."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 — anything not recognised below is raised again
        message = _message(model,
                           err.__cause__ if type(err).__name__ == "DryRunError"
                           and err.__cause__ else err)
        if message is None:
            raise
        raise ModelError(message) from None


def _message(m: HubModel, err: Exception) -> str | None:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(err, GatedRepoError):
        return (f"model={m.repo_id}: a gated repository; accept its licence on "
                f"{endpoint()}/{m.repo_id} and log in (`hf auth login`, or set HF_TOKEN)")
    if isinstance(err, RepositoryNotFoundError):
        return (f"model={m.repo_id}: no such repository on {endpoint()} (or a private one: log in "
                "with `hf auth login` or set HF_TOKEN); check the spelling, or give a local "
                "directory (model=/path/to/dir)")
    if isinstance(err, RevisionNotFoundError):
        return (f"model={m.repo_id}@{m.revision}: no such revision (branch, tag or commit); drop "
                f"@{m.revision} for main")
    if isinstance(err, (LocalEntryNotFoundError, HfHubHTTPError, OSError, ConnectionError)) or (
            type(err).__module__.startswith(("httpx", "requests", "urllib3"))):
        return m.not_cached(f"the Hub ({endpoint()}) could not be reached ({type(err).__name__}: "
                            f"{str(err).splitlines()[0][:160] if str(err) else ''})")
    return None

"""`pip install .` into a fresh environment, then `areal` from an empty directory: the package
carries conf/ (as areal_cli/conf), so nothing depends on a checkout or the working directory.

The new environment reuses this one's installed dependencies (a .pth naming its site-packages)
and builds without isolation, so the test needs no network and takes seconds, not minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCES = (".git", ".venv", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
               ".ruff_cache", ".cache")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ directory of a fresh venv with areal-cli installed from a copy of this checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, venv = tmp / "src", tmp / "venv"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "areal_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--ignore-installed", "--no-index", "--disable-pip-version-check", str(src)],
                          capture_output=True, text=True, env=clean_env(), cwd=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv / "bin"


def clean_env() -> dict:
    """This environment less what would point Python or areal at the checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AREAL_CONF_DIR", "VIRTUAL_ENV")}


def run_in_empty_dir(tmp_path: Path, *cmd) -> subprocess.CompletedProcess:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=empty, env=clean_env(),
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_the_installed_package_is_used_and_finds_its_conf(installed, tmp_path):
    proc = run_in_empty_dir(tmp_path, installed / "python", "-c",
                            "import areal_cli; from areal_cli.runconfig.compose import conf_dir; "
                            "print(areal_cli.__file__); print(conf_dir())")
    package, conf = (Path(x) for x in proc.stdout.split())
    venv = installed.parent
    assert package.is_relative_to(venv) and conf == package.parent / "conf"
    shipped = sorted(p.relative_to(conf) for p in conf.rglob("*.yaml"))
    assert shipped == sorted(p.relative_to(ROOT / "conf") for p in (ROOT / "conf").rglob("*.yaml"))


def test_areal_train_dry_run_prints_the_resolved_config_from_an_empty_directory(installed, tmp_path):
    proc = run_in_empty_dir(tmp_path, installed / "areal", "train", "--dry-run", "trainer.steps=3")
    assert proc.stdout.startswith("# resolved config") and "\n  steps: 3\n" in proc.stdout
    assert "max_staleness" in proc.stdout and "task:\n  name: " in proc.stdout
    assert list((tmp_path / "empty").iterdir()) == []  # a dry run writes nothing


def test_areal_tasks_lists_the_shipped_presets(installed, tmp_path):
    proc = run_in_empty_dir(tmp_path, installed / "areal", "tasks")
    presets = [p.stem for p in (ROOT / "conf" / "task").glob("*.yaml")]
    assert presets and all(name in proc.stdout for name in presets)


def test_every_module_of_the_tree_is_installed(installed, tmp_path):
    """pyproject lists the packages (a mapped conf/ defeats discovery): none may be left out."""
    proc = run_in_empty_dir(tmp_path, installed / "python", "-c", "import areal_cli; print(areal_cli.__file__)")
    package = Path(proc.stdout.strip()).parent
    got = {p.relative_to(package) for p in package.rglob("*.py")}
    assert got == {p.relative_to(ROOT / "areal_cli") for p in (ROOT / "areal_cli").rglob("*.py")}

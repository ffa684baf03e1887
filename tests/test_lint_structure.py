"""The structure check of ``make lint`` (tests/lint_structure.py): it finds what is planted in a
small package tree, and finds nothing in areal_cli."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lint_structure

ROOT = Path(__file__).resolve().parents[1]


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package ``pkg`` under tmp_path with ``files`` (path -> source); every folder a package."""
    root = tmp_path / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d in [root, *root.rglob("*")]:
        if d.is_dir():
            (d / "__init__.py").touch()
    return root


def test_a_cycle_through_a_function_level_import_is_reported_as_its_path(tmp_path):
    root = plant(tmp_path, {
        "a.py": "from pkg.b import f\n",
        "b.py": "def f():\n    from pkg.c import g\n    return g\n",
        "c.py": "import pkg.a\n",
        "d.py": "from pkg import a\n",  # imports into the loop, is not part of it
    })
    found = lint_structure.problems(root)
    assert found == ["import cycle: pkg.a (pkg/a.py:1) -> pkg.b (pkg/b.py:2) -> pkg.c (pkg/c.py:1) -> pkg.a; "
                     "move what both need into a module that neither imports back"]


def test_relative_imports_close_a_cycle_too(tmp_path):
    root = plant(tmp_path, {"x/one.py": "from . import two\n", "x/two.py": "from .one import thing\n"})
    assert [c[0].source for c in lint_structure.cycles(lint_structure.scan(root))] == ["pkg.x.one"]


def test_one_role_importing_another_is_reported_shared_code_is_not(tmp_path):
    root = plant(tmp_path, {
        "trainer/main.py": "from pkg.controller.state import latest\nfrom pkg.transport import wire\n",
        "controller/state.py": "latest = 1\n",
        "transport/wire.py": "",
        "checkpoints.py": "from pkg.controller import state\n",  # neutral modules may
    })
    found = lint_structure.problems(root)
    assert len(found) == 1 and found[0].startswith("pkg/trainer/main.py:1: role 'trainer' imports "
                                                   "pkg.controller.state of role 'controller'")


def test_a_shared_component_is_open_to_every_role_but_may_not_pull_in_its_own(tmp_path):
    root = plant(tmp_path, {
        "trainer/main.py": "from pkg.rollout.engines import spec\n",
        "rollout/engines/__init__.py": "spec = None\n",
        "rollout/engines/hf.py": "from pkg.rollout.main import Worker\n",
        "rollout/main.py": "Worker = None\n",
    })
    found = lint_structure.problems(root)
    assert len(found) == 1 and found[0].startswith("pkg/rollout/engines/hf.py:1: the shared rollout.engines "
                                                   "imports pkg.rollout.main")


def test_an_allowed_crossing_is_exactly_the_module_pair_listed(tmp_path):
    root = plant(tmp_path, {
        "launcher/plan.py": "from pkg.rollout.length_profile import load\n",
        "launcher/run.py": "from pkg.rollout.length_profile import load\n",
        "rollout/length_profile.py": "load = None\n",
    })
    found = lint_structure.problems(root)
    assert [f.split(":")[0] for f in found] == ["pkg/launcher/run.py"]


def test_vllm_comparisons_are_found_outside_the_engine_package_and_the_plan(tmp_path):
    root = plant(tmp_path, {
        "config/load.py": 'ok = name in ("hf", "vllm")\n',
        "trainer/main.py": 'if cfg.engine.name == "vllm":\n    pass\nx = "vllm" != y\n',
        "rollout/engines/vllm.py": 'same = name == "vllm"\n',
        "launcher/plan.py": 'same = name != "vllm"\n',
        "launcher/run.py": 'label = "vllm"\n',  # a string, not a comparison
    })
    found = lint_structure.problems(root)
    assert [f.split(": ")[0] for f in found] == ["pkg/config/load.py:1", "pkg/trainer/main.py:1",
                                                 "pkg/trainer/main.py:3"]


def test_engine_modules_are_imported_only_inside_the_engine_package(tmp_path):
    root = plant(tmp_path, {
        "rollout/engines/__init__.py": "spec = None\n",
        "rollout/engines/base.py": "Engine = None\n",
        "rollout/engines/factory.py": "make_engine = None\n",
        "rollout/engines/setup.py": "from pkg.rollout.engines.base import Engine\n",
        "rollout/engines/hf.py": "from pkg.rollout.engines.setup import Engine\n",
        "rollout/main.py": "from pkg.rollout.engines.factory import make_engine\n",
        "evaluator/runner.py": "from pkg.rollout.engines.base import Engine\nfrom pkg.rollout.engines.hf import X\n",
        "trainer/main.py": "import pkg.rollout.engines.hf\n",
    })
    found = lint_structure.problems(root)
    assert [f.split(": ")[0] for f in found] == ["pkg/evaluator/runner.py:2", "pkg/trainer/main.py:1"]
    assert "make_engine" in found[0]


def test_areal_cli_passes_and_make_lint_fails_on_a_finding(tmp_path):
    assert lint_structure.problems(ROOT / "areal_cli") == []
    bad = plant(tmp_path, {"a.py": "import pkg.b\n", "b.py": "import pkg.a\n"})
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "lint_structure.py"), str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "import cycle: pkg.a (pkg/a.py:1) -> pkg.b (pkg/b.py:1) -> pkg.a" in proc.stdout


def test_a_package_missing_from_pyproject_is_reported(tmp_path):
    root = plant(tmp_path, {"a.py": "", "sub/b.py": ""})
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackages = ["pkg"]\n')
    assert lint_structure.problems(root) == ['pyproject.toml: package pkg.sub is not in [tool.setuptools] '
                                             'packages; add "pkg.sub" there, or a wheel leaves it out']

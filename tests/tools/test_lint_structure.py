"""The structure check of ``make lint`` (tools/lint_structure.py): it finds what is planted in a
small package tree, and finds nothing in areal_cli."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import lint_structure  # noqa: E402


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
        "config/a.py": "from pkg.config.b import f\n",
        "config/b.py": "def f():\n    from pkg.config.c import g\n    return g\n",
        "config/c.py": "import pkg.config.a\n",
        "config/d.py": "from pkg.config import a\n",  # imports into the loop, is not part of it
    })
    found = lint_structure.problems(root)
    assert found == ["import cycle: pkg.config.a (pkg/config/a.py:1) -> pkg.config.b "
                     "(pkg/config/b.py:2) -> pkg.config.c (pkg/config/c.py:1) -> pkg.config.a; "
                     "move what both need into a module that neither imports back"]


def test_relative_imports_close_a_cycle_too(tmp_path):
    root = plant(tmp_path,
                 {"config/one.py": "from . import two\n",
                  "config/two.py": "from .one import thing\n"})
    assert [c[0].source
            for c in lint_structure.cycles(lint_structure.scan(root))] == ["pkg.config.one"]


def test_an_import_to_a_higher_layer_is_reported_lazy_or_not(tmp_path):
    root = plant(tmp_path, {
        # ground -> components
        "config/load.py": "def check():\n    from pkg.engines import spec\n",
        "engines/__init__.py": "spec = None\n",
        # sideways, down
        "rewards/judge.py": "from pkg.engines import spec\nfrom pkg.config import load\n",
        "eval/runner.py": "from pkg.rewards import judge\n",
        "trainer/main.py": "from pkg.eval import runner\n",  # a role calls the evaluator: down
        "tasks/files.py": "from pkg.eval import runner\n",  # components -> evaluation
    })
    found = lint_structure.problems(root)
    assert [f.split(": ")[0] for f in found] == ["pkg/config/load.py:2", "pkg/tasks/files.py:1"]
    assert "the ground layer imports pkg.engines of the components layer above it" in found[0]


def test_one_role_importing_another_is_reported(tmp_path):
    root = plant(tmp_path, {
        "trainer/main.py": "from pkg.controller.state import latest\nfrom pkg.transport import "
                           "wire\n",
        "controller/state.py": "latest = 1\n",
        "transport/wire.py": "",
        "bench/run.py": "from pkg.controller import state\n",  # a command drives roles
    })
    found = lint_structure.problems(root)
    assert len(found) == 1 and found[0].startswith("pkg/trainer/main.py:1: role 'trainer' imports "
                                                   "pkg.controller.state of role 'controller'")


def test_a_module_in_no_layer_is_reported(tmp_path):
    root = plant(tmp_path, {"helpers.py": "", "config/schema.py": ""})
    assert [f.split(":")[0] for f in lint_structure.problems(root)] == ["pkg/helpers.py"]


def test_engine_name_comparisons_are_found_outside_the_engines(tmp_path):
    root = plant(tmp_path, {
        "engines/vllm/spec.py": "", "engines/hf/spec.py": "",
        "config/load.py": 'ok = name in ("hf", "sglang")\n',
        "trainer/main.py": 'if cfg.engine.name == "vllm":\n    pass\nx = "vllm" != y\n',
        "engines/vllm/engine.py": 'same = name == "vllm"\n',
        "launcher/run.py": 'label = "vllm"\n',  # a string, not a comparison
    })
    found = lint_structure.problems(root)
    assert [f.split(": ")[0] for f in found] == ["pkg/config/load.py:1", "pkg/trainer/main.py:1",
                                                 "pkg/trainer/main.py:3"]


def test_workflow_name_comparisons_are_found_outside_the_workflows(tmp_path):
    root = plant(tmp_path, {
        "workflows/tool_use.py": "WORKFLOW = object\n",
        "workflows/turns.py": "class TurnWorkflow:\n    pass\n",  # a helper, not a workflow
        "workflows/agent/workflow.py": "WORKFLOW = object\n",
        "workflows/single_turn.py": 'WORKFLOW = object\nmine = name == "tool_use"\n',
        "rewards/sandbox.py": 'needs = workflow == "tool_use"\n',
        "eval/config.py": 'ok = name in ("single_turn", "agent")\nhelper = name == "turns"\n',
        "controller/records.py": 'label = "agent"\n',  # a string, not a comparison
    })
    found = lint_structure.problems(root)
    assert [f.split(";")[0] for f in found] == [
        'pkg/eval/config.py:1: compares a workflow name with "agent"',
        'pkg/eval/config.py:1: compares a workflow name with "single_turn"',
        'pkg/rewards/sandbox.py:1: compares a workflow name with "tool_use"']
    assert "areal_cli.workflows.workflow_spec" in found[0]


def test_an_engines_own_modules_are_imported_only_inside_engines(tmp_path):
    root = plant(tmp_path, {
        "engines/__init__.py": "spec = None\n",
        "engines/base.py": "Engine = None\n",
        "engines/factory.py": "make_engine = None\n",
        "engines/hf/spec.py": "from pkg.engines.base import Engine\n",
        "engines/hf/engine.py": "from pkg.engines.base import Engine\n",
        "rollout/main.py": "from pkg.engines.factory import make_engine\n",
        "eval/runner.py": "from pkg.engines.base import Engine\nfrom pkg.engines.hf.engine import "
                          "X\n",
        "trainer/main.py": "import pkg.engines.hf.engine\n",
    })
    found = lint_structure.problems(root)
    assert [f.split(": ")[0] for f in found] == ["pkg/eval/runner.py:2", "pkg/trainer/main.py:1"]
    assert "make_engine" in found[0]


def test_areal_cli_passes_and_make_lint_fails_on_a_finding(tmp_path):
    assert lint_structure.problems(ROOT / "areal_cli") == []
    bad = plant(tmp_path,
                {"config/a.py": "import pkg.config.b\n", "config/b.py": "import pkg.config.a\n"})
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "lint_structure.py"), str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and ("import cycle: pkg.config.a (pkg/config/a.py:1) -> "
                                     "pkg.config.b (pkg/config/b.py:1) -> "
                                     "pkg.config.a") in proc.stdout


def test_a_package_missing_from_pyproject_is_reported(tmp_path):
    root = plant(tmp_path, {"config/a.py": "", "config/sub/b.py": ""})
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackages = ["pkg", "pkg.config"]\n')
    assert lint_structure.problems(root) == ['pyproject.toml: package pkg.config.sub is not in '
                                             '[tool.setuptools] packages; add "pkg.config.sub" '
                                             'there, or a wheel leaves it out']

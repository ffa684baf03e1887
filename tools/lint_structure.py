"""Structure checks that ruff cannot make; ``make lint`` runs this file, exit 1 on any finding.

The package is built in layers, each importing only its own layer and those below it (``LAYERS``,
lowest first):

- ground: the config schema (``config/``), the wire (``transport/``) and the primitives every
  process shares: the run directory and its files, checkpoints, the model's source, LoRA's wire
  format, MoE routing, the staleness rule, logging and faults, loading a user's ``module:function``;
- components: the engines, the workflows, the rewards, the tasks, the trackers;
- the run's config made whole against the components (``runconfig/``: compose, check, resolve);
- scoring a model (``eval/``), which the trainer, the launcher and ``areal eval`` call;
- the process roles (controller, trainer, rollout, launcher), which talk only through
  ``transport/``, never by importing one another;
- the commands that drive roles (``bench/``, ``cli.py``).

Checks, every ``import`` counting, the ones inside functions too (a lazy import hides a dependency
from Python, not from the reader):

1. No import cycles; each is printed as a path.
2. Every module of the package is in a layer, and no import points to a higher layer, or from one
   role to another.
3. The engine owns what differs between engines: outside ``engines/`` no string comparison with an
   engine's name (everything else asks ``areal_cli.engines.spec(name)``), and no import of a module
   inside an engine's own package (``engines/<name>/``): engines come from
   ``engines.factory.make_engine``, weight senders from ``make_sender``.
4. The workflow owns what differs between workflows: outside ``workflows/`` no string comparison
   with a workflow's name (everything else asks ``areal_cli.workflows.workflow_spec(name)``).
5. ``pyproject.toml`` lists every package of the tree: it maps ``conf/`` into the package, which
   rules out package discovery, so a package missing from the list would be missing from a wheel.

``python tools/lint_structure.py [PACKAGE_DIR]`` (default: ``areal_cli`` beside ``tools/``).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

# (layer, its top-level packages and modules, below the package's own name), lowest first
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("config", "transport", "rundir", "durable", "private", "checkpoint_dirs", "faults",
                "runtime", "architectures", "hub", "model_source", "lora", "moe", "staleness",
                "user_code")),
    ("components", ("engines", "workflows", "rewards", "tasks", "tracking")),
    ("run config", ("runconfig",)),
    ("evaluation", ("eval",)),
    ("roles", ("controller", "trainer", "rollout", "launcher")),
    ("commands", ("bench", "cli")),
)
ROLES_LAYER = "roles"
ENGINES = "engines"
WORKFLOWS = "workflows"


@dataclass
class Edge:
    """``source`` imports ``target`` at ``line`` of ``source``'s file."""

    source: str
    target: str
    line: int


@dataclass
class Package:
    """The modules of one package tree and the imports between them."""

    root: Path
    modules: dict[str, Path] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.root.name

    def rel(self, module: str) -> str:
        return str(self.modules[module].relative_to(self.root.parent))


def scan(root: Path) -> Package:
    """Every module under ``root`` and every import of a module under ``root``."""
    pkg = Package(root)
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        pkg.modules[".".join(parts)] = path
    for module, path in pkg.modules.items():
        is_package = path.name == "__init__.py"
        seen = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, module, is_package, pkg.modules):
                if target != module and (target, node.lineno) not in seen:
                    seen.add((target, node.lineno))
                    pkg.edges.append(Edge(module, target, node.lineno))
    return pkg


def _imported(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    """The modules of the tree that an import node loads: ``from a import b`` loads the module
    ``a.b`` if there is one, else ``a`` (b is a name defined in a)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join(here + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    else:
        return []
    return [m for m in (_resolve(n, modules) for n in names) if m]


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest module of the tree that ``name`` names (``a.b.func`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def cycles(pkg: Package) -> list[list[Edge]]:
    """One shortest cycle per strongly connected component with a cycle, as its edges."""
    graph: dict[str, dict[str, Edge]] = {m: {} for m in pkg.modules}
    for e in pkg.edges:
        graph[e.source].setdefault(e.target, e)
    found = []
    for comp in _components(graph):
        if len(comp) > 1:
            found.append(_shortest_cycle(graph, comp))
    return found


def _components(graph: dict[str, dict[str, Edge]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iterative (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    comps.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return comps


def _shortest_cycle(graph: dict[str, dict[str, Edge]], comp: list[str]) -> list[Edge]:
    """Breadth-first from the component's first module back to itself, inside the component."""
    start, members = comp[0], set(comp)
    parent: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child, edge in sorted(graph[node].items()):
                if child not in members:
                    continue
                if child == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, parent[path[0].source])
                    return path
                if child not in parent:
                    parent[child] = edge
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"component without a cycle: {comp}")


def layer_of(module: str, layers=LAYERS) -> tuple[int, str] | None:
    """(index, name) of the layer ``module`` belongs to (``pkg.trainer.step`` -> roles); None if
    none."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return next(((i, name) for i, (name, members) in enumerate(layers) if top in members), None)


def top_of(module: str) -> str:
    """The top-level package or module of ``module`` under the root (``pkg.trainer.step`` ->
    trainer)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def unlayered(pkg: Package, layers=LAYERS) -> list[str]:
    """Modules of the tree (other than the root package itself) in no layer."""
    return [m for m in pkg.modules if "." in m and layer_of(m, layers) is None]


def against_layers(pkg: Package, layers=LAYERS) -> list[tuple[Edge, str]]:
    """Each import to a higher layer, or from one role to another, with what is wrong."""
    bad = []
    for e in pkg.edges:
        src, dst = layer_of(e.source, layers), layer_of(e.target, layers)
        if src is None or dst is None:
            continue  # reported by ``unlayered`` (or the root package's own __init__)
        if dst[0] > src[0]:
            bad.append((e, f"the {src[1]} layer imports {e.target} of the {dst[1]} layer above it"))
        elif src[1] == dst[1] == ROLES_LAYER and top_of(e.source) != top_of(e.target):
            bad.append((e, f"role {top_of(e.source)!r} imports {e.target} of role "
                           f"{top_of(e.target)!r}; roles talk through transport/, shared code goes "
                           "a layer down"))
    return bad


def engine_names(root: Path) -> set[str]:
    """The engines of the tree: the packages under ``engines/`` with a ``spec.py``."""
    return {p.parent.name for p in (root / ENGINES).glob("*/spec.py")}


def workflow_names(root: Path) -> set[str]:
    """The workflows of the tree: the modules under ``workflows/`` that assign ``WORKFLOW``, and
    the packages there with a ``workflow.py``."""
    found = {p.parent.name for p in (root / WORKFLOWS).glob("*/workflow.py")}
    for path in (root / WORKFLOWS).glob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        if any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "WORKFLOW"
                                                 for t in n.targets) for n in tree.body):
            found.add(path.stem)
    return found


def name_tests(pkg: Package, owner: str, names: set[str]) -> list[tuple[str, int, str]]:
    """(file, line, name) of each comparison with one of ``names`` as a string outside the
    package ``owner``."""
    found = []
    for module, path in pkg.modules.items():
        if top_of(module) == owner:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                for name in sorted(_compared(node) & names):
                    found.append((pkg.rel(module), node.lineno, name))
    return found


def engine_module_imports(pkg: Package) -> list[Edge]:
    """Imports of a module inside an engine's own package (``engines.<name>.*``) from outside
    ``engines/``."""
    names = engine_names(pkg.root)

    def own(module: str) -> bool:
        parts = module.split(".")
        return len(parts) > 2 and parts[1] == ENGINES and parts[2] in names

    return [e for e in pkg.edges if own(e.target) and top_of(e.source) != ENGINES]


def _compared(node: ast.Compare) -> set[str]:
    out = set()
    for operand in [node.left, *node.comparators]:
        items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
        out |= {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
    return out


def unlisted_packages(root: Path) -> list[str]:
    """Packages under ``root`` that the ``pyproject.toml`` beside it does not list (none when
    there is no such file, or Python lacks tomllib)."""
    pyproject = root.parent / "pyproject.toml"
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return []
    if not pyproject.is_file():
        return []
    listed = tomllib.loads(pyproject.read_text()).get("tool", {}).get("setuptools",
                                                                      {}).get("packages", [])
    tree = {".".join(p.parent.relative_to(root.parent).parts) for p in root.rglob("__init__.py")}
    return sorted(tree - set(listed))


def problems(root: Path) -> list[str]:
    """Every finding, one readable line (or block) each."""
    pkg = scan(root)
    out = []
    for cycle in cycles(pkg):
        steps = " -> ".join(f"{e.source} ({pkg.rel(e.source)}:{e.line})" for e in cycle)
        out.append(f"import cycle: {steps} -> {cycle[0].source}; move what both need into a module "
                   "that neither imports back")
    for module in unlayered(pkg):
        out.append(f"{pkg.rel(module)}: {top_of(module)} is in no layer; add it to LAYERS in "
                   "tools/lint_structure.py, where what it imports and what imports it puts it")
    for e, why in against_layers(pkg):
        out.append(f"{pkg.rel(e.source)}:{e.line}: {why}")
    for rel, line, name in name_tests(pkg, ENGINES, engine_names(root)):
        out.append(f'{rel}:{line}: compares an engine name with "{name}"; ask the engine\'s spec '
                   "(areal_cli.engines.spec) instead")
    for rel, line, name in name_tests(pkg, WORKFLOWS, workflow_names(root)):
        out.append(f'{rel}:{line}: compares a workflow name with "{name}"; ask the workflow\'s '
                   "spec (areal_cli.workflows.workflow_spec) instead")
    for e in engine_module_imports(pkg):
        out.append(f"{pkg.rel(e.source)}:{e.line}: imports the engine module {e.target}; build "
                   "engines with engines.factory.make_engine (weight senders with make_sender), "
                   "ask engines.spec")
    for name in unlisted_packages(root):
        out.append(f'pyproject.toml: package {name} is not in [tool.setuptools] packages; add '
                   f'"{name}" '
                   "there, or a wheel leaves it out")
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "areal_cli"
    found = problems(root)
    for p in found:
        print(p)
    print(f"{root.name}: {len(found)} structure problem(s)"
          if found else f"{root.name}: structure ok")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Structure checks that ruff cannot make; ``make lint`` runs this file, exit 1 on any finding.

1. No import cycles inside the package. Every ``import`` counts, the ones inside functions too:
   a lazy import hides a loop from Python, not from the reader. Each cycle is printed as a path.
2. Process roles talk through ``transport/``, never by importing each other: no module of one
   role package (``ROLES``) imports a module of another, except a ``SHARED`` component (which
   may not import the rest of its role) and the few ``ALLOWED`` crossings, each with its reason.
3. The engine owns what differs between engines: no ``== "vllm"`` / ``!= "vllm"`` /
   ``in (..., "vllm")`` outside the engine package and the launcher's planning (``ENGINE_OWNERS``);
   everything else asks ``areal_cli.rollout.engines.spec(name)``.
4. An engine's own module is the engine package's business: outside ``rollout/engines/`` nothing
   imports a module of that package other than its interface (``ENGINE_API``: the registry, the
   ``Engine`` base, ``EngineSetup`` and the factory); engines come from ``make_engine``, weight
   senders from ``make_sender``, so adding an engine is one module and one registry entry.
5. ``pyproject.toml`` lists every package of the tree: it maps ``conf/`` into the package, which
   rules out package discovery, so a package missing from the list would be missing from a wheel.

``python tests/lint_structure.py [PACKAGE_DIR]`` (default: ``areal_cli`` beside ``tests/``).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROLES = ("controller", "trainer", "rollout", "launcher")

# Packages inside a role package that any module may import: a component, not the role's process.
# A shared component may not import the rest of its role (that would bring the role along).
SHARED: dict[str, str] = {
    "rollout.agent": "the agent endpoint and episodes: rollout workers run agents while training, the "
                     "evaluator runs them in `areal eval workflow=agent`, preflight imports the agent",
    "rollout.engines": "the generation engines: rollout workers and the evaluator both generate "
                       "with them; configs, the trainer and the launcher read their specs, and the "
                       "trainer builds its weight sender through them",
}

# (importing module, imported module), without the package name -> why this crossing is right.
ALLOWED: dict[tuple[str, str], str] = {
    ("launcher.plan", "rollout.length_profile"):
        "the plan checks rollout.length_profile and prints its draws (--dry-run) before any "
        "process starts",
    ("launcher.preflight", "rollout.workflows.episodes"):
        "preflight imports a custom workflow=module:fn before any process starts, so a wrong "
        "path stops the run at once",
}

ENGINE_OWNERS = ("rollout/engines/", "launcher/plan.py")

# The modules of the engine package that code outside it may import (without the package name).
ENGINE_PACKAGE = "rollout.engines"
ENGINE_API = ("rollout.engines", "rollout.engines.base", "rollout.engines.setup", "rollout.engines.factory")


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


def role_of(module: str) -> str | None:
    """The role package ``module`` belongs to, if any (``pkg.trainer.step`` -> ``trainer``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROLES else None


def shared_component(module: str, shared: dict[str, str] = SHARED) -> str | None:
    """The shared component ``module`` is part of, if any (``pkg.rollout.engines.hf`` ->
    ``rollout.engines``)."""
    rest = module.split(".", 1)[1] if "." in module else ""
    return next((c for c in shared if rest == c or rest.startswith(c + ".")), None)


def cross_role(pkg: Package, allowed: dict[tuple[str, str], str] = ALLOWED,
               shared: dict[str, str] = SHARED) -> list[Edge]:
    """Imports from one role package into another that ``allowed`` does not list, and imports
    from a shared component into the rest of its role."""
    bad = []
    for e in pkg.edges:
        src, dst = role_of(e.source), role_of(e.target)
        from_shared, to_shared = shared_component(e.source, shared), shared_component(e.target, shared)
        pair = (e.source.split(".", 1)[1], e.target.split(".", 1)[1])
        if from_shared and src == dst and not to_shared:
            bad.append(e)  # the component would bring its role along to every importer
        elif src and dst and src != dst and not to_shared and pair not in allowed:
            bad.append(e)
    return bad


def engine_name_tests(pkg: Package, owners: tuple[str, ...] = ENGINE_OWNERS) -> list[tuple[str, int]]:
    """(file, line) of each comparison with the string "vllm" outside ``owners``."""
    found = []
    for module, path in pkg.modules.items():
        rel = path.relative_to(pkg.root).as_posix()
        if any(rel == o or rel.startswith(o) for o in owners):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare) and _mentions_vllm(node):
                found.append((pkg.rel(module), node.lineno))
    return found


def engine_module_imports(pkg: Package, api: tuple[str, ...] = ENGINE_API) -> list[Edge]:
    """Imports of an engine package module outside ``api`` from a module outside the package."""
    def inside(module: str) -> bool:
        rest = module.split(".", 1)[1] if "." in module else ""
        return rest == ENGINE_PACKAGE or rest.startswith(ENGINE_PACKAGE + ".")

    return [e for e in pkg.edges if inside(e.target) and not inside(e.source)
            and e.target.split(".", 1)[1] not in api]


def _mentions_vllm(node: ast.Compare) -> bool:
    for operand in [node.left, *node.comparators]:
        items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
        if any(isinstance(i, ast.Constant) and i.value == "vllm" for i in items):
            return True
    return False


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
    listed = tomllib.loads(pyproject.read_text()).get("tool", {}).get("setuptools", {}).get("packages", [])
    tree = {".".join(p.parent.relative_to(root.parent).parts) for p in root.rglob("__init__.py")}
    return sorted(tree - set(listed))


def problems(root: Path) -> list[str]:
    """Every finding, one readable line (or block) each."""
    pkg = scan(root)
    out = []
    for cycle in cycles(pkg):
        steps = " -> ".join(f"{e.source} ({pkg.rel(e.source)}:{e.line})" for e in cycle)
        out.append(f"import cycle: {steps} -> {cycle[0].source}; move what both need into a "
                   "module that neither imports back")
    for e in cross_role(pkg):
        if role_of(e.source) == role_of(e.target):
            out.append(f"{pkg.rel(e.source)}:{e.line}: the shared {shared_component(e.source)} imports "
                       f"{e.target}, which is its role's own; every importer would load it too")
            continue
        out.append(f"{pkg.rel(e.source)}:{e.line}: role {role_of(e.source)!r} imports "
                   f"{e.target} of role {role_of(e.target)!r}; roles talk through transport/, "
                   "shared code goes to a module outside the role packages")
    for rel, line in engine_name_tests(pkg):
        out.append(f'{rel}:{line}: compares an engine name with "vllm"; ask the engine\'s spec '
                   "(areal_cli.rollout.engines.spec) instead")
    for e in engine_module_imports(pkg):
        out.append(f"{pkg.rel(e.source)}:{e.line}: imports the engine module {e.target}; build engines "
                   "with rollout.engines.factory.make_engine (weight senders with make_sender)")
    for name in unlisted_packages(root):
        out.append(f'pyproject.toml: package {name} is not in [tool.setuptools] packages; add "{name}" '
                   "there, or a wheel leaves it out")
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "areal_cli"
    found = problems(root)
    for p in found:
        print(p)
    print(f"{root.name}: {len(found)} structure problem(s)" if found else f"{root.name}: structure ok")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

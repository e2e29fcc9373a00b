"""The package's shape, read from its import statements (every ``import`` anywhere in a module,
function-level ones too): no circle of modules, no arrow from a shared stage up into a process or
command package, and no new circle of packages among the stages."""
from __future__ import annotations

import ast
from pathlib import Path

import stalldoc

ROOT = Path(stalldoc.__file__).resolve().parent
# the processes and the one-shot commands: they use the stages, never the other way round
PROCESSES = frozenset({"relay", "sidecar", "check", "attach", "doctor", "demo", "cli",
                       "__main__"})
# back arrows between stages that circle today, to be taken out (issue 29); no new one may come
KNOWN_PACKAGE_CIRCLES = frozenset({("probes", "cluster"), ("cluster", "probes"),
                                   ("probes", "run"), ("run", "probes"), ("cluster", "run")})


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the stalldoc modules it imports."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py") if "bootstrap" not in p.parts}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = (package.split(".")[:len(package.split(".")) - node.level + 1]
                        if node.level else [])
                module = ".".join(base + ([node.module] if node.module else []))
                targets |= {f"{module}.{a.name}" if f"{module}.{a.name}" in paths else module
                            for a in node.names}
        graph[name] = {t if t in paths else t.rsplit(".", 1)[0] for t in targets
                       if t.split(".")[0] == "stalldoc"} - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_graph_is_read():
    graph = import_graph()
    assert "stalldoc.sidecar.watcher" in graph["stalldoc.sidecar.process"]
    assert "stalldoc.agent.runtime" in graph["stalldoc.agent.start"]
    assert sum(len(targets) for targets in graph.values()) > 400


def test_no_module_circle():
    assert circles(import_graph()) == []


def test_no_stage_imports_a_process_or_a_command():
    upward = sorted((module, target) for module, targets in import_graph().items()
                    for target in targets
                    if package_of(module) not in PROCESSES and package_of(target) in PROCESSES)
    assert upward == []


def test_no_new_circle_of_packages_among_the_stages():
    packages: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        source = package_of(module)
        if source in PROCESSES or not (ROOT / source).is_dir():
            continue
        packages.setdefault(source, set()).update(
            package_of(t) for t in targets
            if package_of(t) != source and (ROOT / package_of(t)).is_dir())
    arrows = {(a, b) for a, targets in packages.items() for b in targets}
    circling = {(a, b) for group in circles(packages) for a, b in arrows
                if a in group and b in group}
    assert circling <= KNOWN_PACKAGE_CIRCLES, sorted(circling - KNOWN_PACKAGE_CIRCLES)

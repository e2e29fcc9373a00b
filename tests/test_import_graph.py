"""The package's shape, read from its import statements (every ``import`` anywhere in a module,
function-level ones too): no circle of modules, no circle of packages, no arrow from a shared
stage up into a process or command package, and no stage reaching into the agent's in-rank
machinery (only the files it publishes are the stages' business)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import stalldoc

ROOT = Path(stalldoc.__file__).resolve().parent
# the processes and the one-shot commands: they use the stages, never the other way round
# (``run`` is what the relay, the sidecar and attach share: the run directory, the job, options)
PROCESSES = frozenset({"relay", "sidecar", "run", "check", "attach", "doctor", "demo", "logs",
                       "cli", "__main__"})
# the agent's modules the rest may read: the files it publishes (state file, Flight Recorder
# requests, identity), the versions it was built with, and the public ``stalldoc.phase``
AGENT_INTERFACE = frozenset({"statefile", "state_reader", "flight", "identity", "versions",
                             "phase", "ray_facts"})


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


def test_the_watchers_parts_never_import_the_watcher():
    # the watcher is the loop that calls its parts (roster, exit judge, diagnosis, publishing):
    # they get what they share from sidecar/context.py, and only its runners import it
    importers = sorted(module for module, targets in import_graph().items()
                       if "stalldoc.sidecar.watcher" in targets)
    assert importers == ["stalldoc.attach.session", "stalldoc.sidecar.process"]


def test_no_module_circle():
    assert circles(import_graph()) == []


def test_no_stage_imports_a_process_or_a_command():
    upward = sorted((module, target) for module, targets in import_graph().items()
                    for target in targets
                    if package_of(module) not in PROCESSES and package_of(target) in PROCESSES)
    assert upward == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the other packages (and top-level modules) its modules import."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = package_of(module)
        packages.setdefault(source, set()).update(
            package_of(t) for t in targets if package_of(t) != source)
    return packages


def test_no_circle_of_packages():
    assert circles(package_graph(import_graph())) == []


def test_no_stage_reaches_into_the_agents_machinery():
    # the runtime, its wrappers and hooks run inside the ranks; the sidecar's stages read what
    # the agent publishes, through its interface modules (run/inject and the doctor, which start
    # or load the agent, are process-side)
    inside = sorted((module, target) for module, targets in import_graph().items()
                    for target in targets
                    if package_of(target) == "agent" and package_of(module) not in PROCESSES
                    and package_of(module) != "agent"
                    and target.split(".")[2:3] and target.split(".")[2] not in AGENT_INTERFACE)
    assert inside == []


def test_the_checks_see_a_planted_circle_and_a_planted_upward_arrow():
    graph = {name: set(targets) for name, targets in import_graph().items()}
    graph["stalldoc.probes.host"].add("stalldoc.sidecar.watcher")
    assert circles(package_graph(graph))          # sidecar -> probes -> sidecar
    graph = {name: set(targets) for name, targets in import_graph().items()}
    graph["stalldoc.model.window"].add("stalldoc.rules.base")
    assert circles(graph)                          # rules.base -> model.window -> rules.base


def declared_imports(package: str) -> set[str] | None:
    """What the package's docstring says it may import (its "May import:" paragraph): the
    packages and top-level modules named there in double backquotes, ``stalldoc`` as ""."""
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""
    said = re.search(r"May import:(.*?)(?:\n\n|$)", doc, re.S)
    if said is None:
        return None
    return {"" if name == "stalldoc" else name.split(".")[0]
            for name in re.findall(r"``([a-z_.]+)``", said.group(1))}


def test_every_package_says_what_it_may_import_and_keeps_to_it():
    packages = package_graph(import_graph())
    for init in sorted(ROOT.glob("*/__init__.py")):
        package = init.parent.name
        declared = declared_imports(package)
        assert declared is not None, f"stalldoc/{package}/__init__.py: no 'May import:'"
        unknown = {name for name in declared
                   if name and not (ROOT / name).is_dir() and not (ROOT / f"{name}.py").exists()}
        assert not unknown, (package, unknown)
        undeclared = packages.get(package, set()) - declared - {package}
        assert not undeclared, f"stalldoc/{package} imports {sorted(undeclared)}, not declared"

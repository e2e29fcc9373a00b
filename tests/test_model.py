"""model.py is a leaf: every part imports it, so it imports nothing of stalldoc."""
from __future__ import annotations

import ast
from pathlib import Path

import stalldoc.model


def imported_modules(path: Path) -> list[str]:
    """Every module an ``import`` or ``from ... import`` anywhere in the file names (relative
    imports as written, with their dots)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


def test_model_imports_nothing_of_stalldoc():
    names = imported_modules(Path(stalldoc.model.__file__))
    assert names, "the parser found no import at all: it did not read model.py"
    ours = [n for n in names if n.startswith(".") or n.split(".")[0] == "stalldoc"]
    assert ours == []


def test_the_records_moved_to_model_are_still_importable_from_their_old_homes():
    from stalldoc.agent import state_reader
    from stalldoc.launch import config, resources
    for module, name in ((state_reader, "AgentSnapshot"), (state_reader, "CudaState"),
                         (state_reader, "EngineSleepState"), (state_reader, "PhaseDetail"),
                         (config, "LaunchConfig"), (resources, "Resources"),
                         (resources, "ModelInfo")):
        assert getattr(module, name) is getattr(stalldoc.model, name)

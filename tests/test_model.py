"""model/ is a leaf: every part imports it, so its modules import nothing of stalldoc but each
other."""
from __future__ import annotations

import ast
from pathlib import Path

import stalldoc.model

MODEL = Path(stalldoc.model.__file__).parent


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


def test_model_imports_nothing_of_stalldoc_but_itself():
    modules = sorted(MODEL.glob("*.py"))
    assert len(modules) >= 10, "the model's domain modules were not found"
    for path in modules:
        names = imported_modules(path)
        assert names or path.name == "__init__.py", f"the parser read no import in {path.name}"
        ours = [n for n in names if n.startswith(".") or n.split(".")[0] == "stalldoc"]
        assert all(n.startswith("stalldoc.model.") for n in ours), (path.name, ours)


def test_the_package_exports_nothing_so_importing_one_domain_loads_no_other():
    assert imported_modules(MODEL / "__init__.py") == []


def test_the_records_are_still_importable_from_their_readers():
    from stalldoc.agent import state_reader
    from stalldoc.launch import config, resources
    from stalldoc.model import agent, launch
    for module, name, home in ((state_reader, "AgentSnapshot", agent),
                               (state_reader, "CudaState", agent),
                               (state_reader, "EngineSleepState", agent),
                               (state_reader, "PhaseDetail", agent),
                               (config, "LaunchConfig", launch), (resources, "Resources", launch),
                               (resources, "ModelInfo", launch)):
        assert getattr(module, name) is getattr(home, name)


def test_a_stack_keeps_the_agents_own_code_and_leaves_out_its_pass_through_wrappers() -> None:
    from stalldoc.model.stacks import Frame, as_written

    agent = "/venv/site-packages/stalldoc/agent/"
    user = Frame("_run_engine", "/home/u/rollout.py", 40)
    step = Frame("LLMEngine.step", "/venv/site-packages/vllm/engine/llm_engine.py", 1210)
    wrapper = Frame("marked.<locals>.wrapper", agent + "hooks.py", 262)
    # a wrapper between the library's call and the user's: left out
    assert as_written((step, wrapper, user)) == (step, user)
    # the wrapper running the agent's own code (its phase mark): kept, as stalldoc works there
    enter = Frame("Agent.phase_enter", agent + "runtime.py", 120)
    assert as_written((enter, wrapper, user)) == (enter, wrapper, user)
    # the agent's heartbeat thread, and a user function that happens to be named wrapper
    beat = (Frame("Agent._beat", agent + "runtime.py", 81),)
    assert as_written(beat) == beat
    own = (step, Frame("wrapper", "/home/u/decorators.py", 9), user)
    assert as_written(own) == own

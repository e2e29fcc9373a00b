"""The versions a rank publishes for the watcher: read from package metadata without importing
the packages; torch's CUDA and NCCL only from a torch the process imported itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from stalldoc.agent.versions import (WAIT_BEATS, VersionsPublisher, collect, cuda_in,
                                     installed_torch_cuda, versions_path)
from stalldoc.run.inject import agent_environment


def test_a_rank_that_imports_torch_publishes_once_it_has(tmp_path):
    code = ("import time, torch, sys; time.sleep(1.5); "
            "print(torch.cuda.is_initialized(), 'vllm' in sys.modules, 'deepspeed' in sys.modules);"
            " import os; print(os.getpid())")
    env = agent_environment(tmp_path, dict(os.environ), 0)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    *flags, pid = out.stdout.split()
    assert flags == ["False", "False", "False"]    # no CUDA initialised, nothing else imported
    published = json.loads(open(versions_path(str(tmp_path / "agents"), int(pid))).read())
    assert published["torch"] == torch.__version__ and published["torch_imported"] is True
    assert published["python"] == sys.version.split()[0]
    assert published["cuda"] == torch.version.cuda           # None on this CPU build
    assert published["nccl"] is None                         # this build has no NCCL
    assert published["vllm"] is None                         # not installed here


def test_a_process_without_torch_publishes_after_a_while_then_again_with_it(tmp_path):
    modules: dict = {}
    publisher = VersionsPublisher(str(tmp_path), 4242, modules)
    path = versions_path(str(tmp_path), 4242)
    for _ in range(WAIT_BEATS - 1):
        publisher.tick()
    assert not (tmp_path / "versions-4242.json").exists()
    publisher.tick()
    first = json.loads(open(path).read())
    assert first["torch_imported"] is False and "nccl" not in first
    assert first["torch"] == torch.__version__                # from its metadata
    modules["torch"] = torch                                  # the process imports it
    publisher.tick()
    assert json.loads(open(path).read())["torch_imported"] is True and publisher.done


def test_cuda_is_read_from_the_installed_torch_without_importing_it():
    assert installed_torch_cuda() == torch.version.cuda
    assert cuda_in("cuda: Optional[str] = '12.4'\nhip = None\n") == "12.4"
    assert cuda_in("cuda = \"11.8\"") == "11.8"
    assert cuda_in("cuda: Optional[str] = None\n") is None


def test_a_half_imported_torch_is_not_read():
    class Spec:
        _initializing = True

    class Torch:
        __spec__ = Spec()

    assert collect({"torch": Torch()})["torch_imported"] is False

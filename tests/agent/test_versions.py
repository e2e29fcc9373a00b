"""The versions a rank publishes for the watcher: read from package metadata without importing
the packages (nor importlib.metadata, whose imports read more than a rank's rate of work); torch's
CUDA and NCCL only from a torch the process imported itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from stalldoc.agent.versions import (PACKAGES, WAIT_BEATS, VersionsPublisher, collect, cuda_in,
                                     installed_torch_cuda, package_versions, versions_path)
from stalldoc.detect.work import IO_WORK_BPS
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


def test_versions_are_read_as_importlib_metadata_reads_them_with_no_bytes_read():
    # GIVEN this interpreter's installed packages; WHEN a fresh process reads them as the agent
    # does, counting the bytes it reads and writes (its rchar + wchar, as the watcher does)
    code = ("import json; from stalldoc.agent.versions import package_versions\n"
            "def io():\n"
            "    d = dict(l.split(': ') for l in open('/proc/self/io').read().splitlines())\n"
            "    return int(d['rchar']) + int(d['wchar'])\n"
            "before = io(); found = package_versions(); after = io()\n"
            "print(json.dumps([found, after - before]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60)
    found, io_bytes = json.loads(out.stdout)
    # THEN the versions are importlib.metadata's, read with a few bytes (its imports read 1.3 MB,
    # which the watcher took for a rank's work: a hung script's stall "resumed")
    import importlib.metadata as metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    assert found == {name: version(name) for name in PACKAGES}
    assert found["torch"] == torch.__version__ and io_bytes < IO_WORK_BPS / 4, (found, io_bytes)


def test_a_version_comes_from_the_first_metadata_folder_on_the_path(tmp_path):
    # an egg-info without its version in its name (a develop install), a dist-info shadowed by
    # one earlier on the path, names normalised (ms_swift is ms-swift)
    first, second = tmp_path / "first", tmp_path / "second"
    (first / "ms_swift-3.9.1.dist-info").mkdir(parents=True)
    (first / "trl.egg-info").mkdir()
    (first / "trl.egg-info" / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: trl\n"
                                                    "Version: 0.20.0.dev0\n")
    (second / "ms_swift-2.0.0.dist-info").mkdir(parents=True)
    (second / "torch-2.13.0+cu126.dist-info").mkdir()
    (second / "torch").mkdir()
    (second / "torch" / "version.py").write_text("cuda: Optional[str] = '12.6'\n")
    found = package_versions(("ms-swift", "trl", "torch", "vllm"), [str(first), str(second)])
    assert found == {"ms-swift": "3.9.1", "trl": "0.20.0.dev0", "torch": "2.13.0+cu126",
                     "vllm": None}
    assert installed_torch_cuda([str(first), str(second)]) == "12.6"

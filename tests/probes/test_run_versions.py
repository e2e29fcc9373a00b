"""Which versions the watcher stores: a rank's that imported torch, else the lowest rank's at the
end, else its own environment; a rank's file is the job's, read with care."""
from __future__ import annotations

import json
import os
import platform

from stalldoc.agent.versions import collect, publish, versions_path
from stalldoc.model.ranks import RankProcess
from stalldoc.probes.versions import MAX_BYTES, RunVersions, read_published


def ranks(*pids: int) -> list[RankProcess]:
    return [RankProcess(rank, pid, rank, ("python",)) for rank, pid in enumerate(pids)]


def test_the_lowest_rank_that_imported_torch_is_stored_once(tmp_path):
    import torch   # noqa: F401 - in sys.modules, as in a rank that imported it
    import sys
    publish(str(tmp_path), 101, collect({}))                   # rank 0: before torch
    recorder = RunVersions(str(tmp_path), driver="550.54.15")
    assert recorder.update(ranks(101, 102)) is None             # nothing final yet
    publish(str(tmp_path), 102, collect(sys.modules))           # rank 1: with torch
    stored = recorder.update(ranks(101, 102))
    assert stored is not None and stored["source"] == "rank 1"
    assert stored["torch"] == torch.__version__ and stored["driver"] == "550.54.15"
    assert recorder.update(ranks(101, 102), final=True) is None    # stored once


def test_at_the_end_a_rank_before_torch_beats_the_watcher(tmp_path):
    publish(str(tmp_path), 101, collect({}))
    stored = RunVersions(str(tmp_path)).update(ranks(101), final=True)
    assert stored is not None and stored["source"] == "rank 0 (before it imported torch)"


def test_without_any_rank_the_watcher_says_it_is_its_own_environment(tmp_path):
    stored = RunVersions(str(tmp_path)).initial()
    assert stored["source"].startswith("watcher") and stored["python"] == platform.python_version()
    assert stored["stalldoc"] and "driver" not in stored        # no NVML here


def test_files_that_are_not_an_agents_are_refused_or_cleaned(tmp_path):
    path = versions_path(str(tmp_path), 7)
    os.mkfifo(path)                                             # would block a plain open
    assert read_published(str(tmp_path), 7, 0) is None
    os.unlink(path)
    os.symlink("/etc/passwd", path)
    assert read_published(str(tmp_path), 7, 0) is None
    os.unlink(path)
    with open(path, "w") as fh:
        fh.write(json.dumps({"torch": "x" * MAX_BYTES}))
    assert read_published(str(tmp_path), 7, 0) is None
    with open(path, "w") as fh:
        fh.write(json.dumps({"torch": "2.0; rm -rf /", "python": 3, "trl": "0.29.1",
                             "evil": "1.0", "torch_imported": "yes"}))
    found = read_published(str(tmp_path), 7, 0)
    assert found is not None and not found.torch_imported
    assert dict(found.values) == {"torch": None, "python": None, "trl": "0.29.1"}

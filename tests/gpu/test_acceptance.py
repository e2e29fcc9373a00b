"""The GPU acceptance suite: what has only met stand-ins elsewhere, on the real device, through
the cases ``stalldoc doctor --gpu`` runs (``stalldoc/doctor/gpu_job.py`` under a real
``stalldoc watch``). Run with ``python -m pytest -m gpu`` on a GPU machine (one GPU is enough;
about 3 minutes on an H100); skipped with the reason where there is none."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stalldoc.doctor import gpu
from stalldoc.probes.interpreter import resolve
from support import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240),
              pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU and driver")]


@pytest.mark.parametrize("case,timeout,env,judge", gpu.CASES, ids=[c[0] for c in gpu.CASES])
def test_case_on_the_device(tmp_path: Path, case, timeout, env, judge):
    # GIVEN one case of the doctor's GPU end-to-end, watched in this interpreter
    run = gpu.watch_case(resolve([sys.executable]), case, tmp_path, timeout, env)
    # THEN each of its checks holds (they say what they saw either way)
    checks = judge(run)
    assert checks and all(c.status == "ok" for c in checks), [
        (c.name, c.status, c.summary) for c in checks]

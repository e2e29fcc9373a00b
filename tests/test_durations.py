"""The costs that order the suite's parallel run (tests/durations.py), read from pytest's
``--durations=0`` lines as pytest-xdist prints them: a test's phases summed, under the nodeid its
item has, whatever xdist group it ran in."""
from __future__ import annotations

from durations import from_log

LOG = """\
============================== slowest durations ===============================
83.70s setup    tests/test_stall_decision.py::test_healthy[loaded]@tests/test_stall_decision.py
0.50s call     tests/test_stall_decision.py::test_healthy[loaded]@tests/test_stall_decision.py
29.60s call     tests/test_framework_ranks.py::test_ray_train_restart@ray_clusters
30.20s call     tests/test_classic_hangs.py::test_sharding[3-zero3-lengths]@deepspeed_ops
2.00s call     tests/test_redact.py::test_url[user@host]
1.50s teardown tests/test_redact.py::test_url[user@host]
0.40s call     tests/test_model.py::test_quick
"""


def test_a_tests_phases_are_summed_under_its_own_nodeid_whatever_its_group() -> None:
    costs = from_log(LOG)
    assert costs == {
        "tests/test_stall_decision.py::test_healthy[loaded]": 84.2,
        "tests/test_framework_ranks.py::test_ray_train_restart": 29.6,
        "tests/test_classic_hangs.py::test_sharding[3-zero3-lengths]": 30.2,
        "tests/test_redact.py::test_url[user@host]": 3.5,   # an @ of its own parameters kept
    }   # and one under a second left out

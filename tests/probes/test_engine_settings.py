"""The engine settings a process's agent recorded (``vllm-<pid>.json``), read at a stall."""
from __future__ import annotations

import json

from stalldoc.analysis.causes import colocated_tp_size
from stalldoc.probes.engine_settings import read_engine_settings

COLOCATED = {"gpu_memory_utilization": 0.3, "max_model_len": 256, "tensor_parallel_size": 2,
             "enable_sleep_mode": False, "max_num_seqs": None, "enable_prefix_caching": None,
             "distributed_executor_backend": "external_launcher"}


def test_the_last_engine_a_process_created_is_read(tmp_path):
    # GIVEN a rank that created two engines (the file as the agent appends it), the second
    # line cut by a write in progress, and keys and values no rule reads
    first = {**COLOCATED, "tensor_parallel_size": 1}
    second = {**COLOCATED, "api_key": "sk-secret", "hf_overrides": {"a": 1}}
    (tmp_path / "vllm-42.json").write_text(
        json.dumps(first) + "\n" + json.dumps(second) + "\n" + '{"tensor_par')
    # THEN the last whole line, with only the known scalar fields
    assert read_engine_settings(str(tmp_path), 42) == COLOCATED
    assert colocated_tp_size(read_engine_settings(str(tmp_path), 42)) == 2


def test_no_file_or_no_colocated_engine_says_nothing(tmp_path):
    assert read_engine_settings(str(tmp_path), 7) is None
    assert read_engine_settings(None, 7) is None
    (tmp_path / "vllm-7.json").write_text("not json\n[1, 2]\n")
    assert read_engine_settings(str(tmp_path), 7) is None
    # an engine of its own processes (mp, ray) has a TP group of its own, not of the job's ranks
    assert colocated_tp_size({**COLOCATED, "distributed_executor_backend": "mp"}) is None
    assert colocated_tp_size({**COLOCATED, "distributed_executor_backend": None}) is None
    assert colocated_tp_size({**COLOCATED, "tensor_parallel_size": True}) is None
    assert colocated_tp_size(None) is None

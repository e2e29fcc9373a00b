"""SD536 vllm-engine-not-started on real lines: vLLM's front end prints its wait every 10 s
while the engine core starts, so one line (or a few) is a normal start and only a run of them is
a finding. Lines quoted verbatim from public threads; no fixtures/log file, since a single line
is by design no finding."""
from __future__ import annotations

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import RULES, STICKY, by_code, run_rules
from stalldoc.rules.log_signature import LogSignature

# Project-HAMi/HAMi-core#261: vLLM 0.25 with TP > 1, the line every 10 s (20:55:20 - 20:56:40)
HAMI = (
    ("(APIServer pid=1) DEBUG 08-09 20:55:20 [v1/engine/utils.py:1262] Waiting for 1 local, "
     "0 remote core engine proc(s) to start."),
    ("(APIServer pid=1) DEBUG 08-09 20:55:30 [v1/engine/utils.py:1262] Waiting for 1 local, "
     "0 remote core engine proc(s) to start."),
    ("(APIServer pid=1) DEBUG 08-09 20:55:40 [v1/engine/utils.py:1262] Waiting for 1 local, "
     "0 remote core engine proc(s) to start."),
    ("(APIServer pid=1) DEBUG 08-09 20:55:50 [v1/engine/utils.py:1262] Waiting for 1 local, "
     "0 remote core engine proc(s) to start."),
    ("(APIServer pid=1) DEBUG 08-09 20:56:00 [v1/engine/utils.py:1262] Waiting for 1 local, "
     "0 remote core engine proc(s) to start."),
    ("(APIServer pid=1) DEBUG 08-09 20:56:10 [v1/engine/utils.py:1262] Waiting for 1 local, "
     "0 remote core engine proc(s) to start."),
    ("(APIServer pid=1) DEBUG 08-09 20:56:20 [v1/engine/utils.py:1262] Waiting for 1 local, "
     "0 remote core engine proc(s) to start."),
    ("(APIServer pid=1) DEBUG 08-09 20:56:30 [v1/engine/utils.py:1262] Waiting for 1 local, "
     "0 remote core engine proc(s) to start."),
    ("(APIServer pid=1) DEBUG 08-09 20:56:40 [v1/engine/utils.py:1262] Waiting for 1 local, "
     "0 remote core engine proc(s) to start."),
)
# the same paste's first line, interleaved with a worker's NCCL output
HAMI_FIRST = ("test-7b94f88dfd-dxs9c:958:958 [1] NCCL INFO Channel 01/0 : (APIServer pid=1) DEBUG "
              "08-09 20:55:10 [v1/engine/utils.py:1262] Waiting for 1 local, 0 remote core engine "
              "proc(s) to start.")
# vllm-project/vllm#24133 (GLM-4.5, 8xH100) and vllm-project/vllm-omni#5122
GLM = ("(APIServer pid=300606) DEBUG 09-02 17:29:06 [utils.py:777] Waiting for 1 local, 0 remote "
       "core engine proc(s) to start.",
       "(APIServer pid=300606) DEBUG 09-02 17:29:16 [utils.py:777] Waiting for 1 local, 0 remote "
       "core engine proc(s) to start.")
OMNI = ("(APIServer pid=24482) DEBUG 07-15 07:11:34 [v1/engine/utils.py:1239] Waiting for 1 local, "
        "0 remote core engine proc(s) to start.")
# look-alikes: vllm-project/vllm-omni#5122's loading lines, allenai/olmocr#129's own wait for
# an SGLang server (olmocr's message, not the engine's)
LOADING = "DEBUG 07-15 07:11:31 [diffusers_loader.py:346] Loading weights on npu:1 ..."
OLMOCR = ("2025-03-18 10:24:40,134 - __main__ - WARNING - Attempt 56: Please wait for sglang "
          "server to become ready...")


def window(*texts: str, tail: tuple[str, ...] = ()) -> Window:
    return Window(100.0, (), log=tuple(LogLine(99.0, "stderr", t) for t in texts),
                  log_tail=tail)


def found(w: Window) -> list[Finding]:
    return list(by_code("SD536")().check(w))


def test_one_wait_line_or_a_few_is_a_normal_start():
    for lines in ((GLM[0],), GLM, (OMNI,), (HAMI_FIRST,), HAMI[:8], (HAMI_FIRST, *HAMI[:8])):
        assert found(window(*lines)) == [], lines


def test_a_run_of_waits_is_a_warning_with_how_long_and_which_cores():
    [finding] = found(window(HAMI_FIRST, *HAMI))
    assert finding.severity is Severity.WARNING and finding.ranks == ()
    evidence = finding.evidence
    assert (evidence["count"], evidence["local"], evidence["remote"], evidence["stage"]) == (
        10, "1", "0", "start")
    assert evidence["waited_seconds"] == 90                        # 20:55:10 to 20:56:40
    assert evidence["lines"][0] == HAMI_FIRST and evidence["last_line"] == HAMI[-1]
    assert finding.summary == (
        "vLLM's front end has waited 90 s for its engine core (1 local, 0 remote) to start "
        "(10 lines): whatever waits on this engine (a trainer's rollouts) waits with it; the "
        "engine core's own log says whether it died or is still loading")
    assert "VLLM_ENGINE_READY_TIMEOUT_S" in finding.fix


def test_a_tick_counts_the_new_line_with_the_recent_ones_in_the_tail():
    tail = (HAMI_FIRST, LOADING, *HAMI)
    [finding] = found(window(HAMI[-1], tail=tail))
    assert finding.evidence["count"] == 10 and finding.evidence["waited_seconds"] == 90
    # the tail alone is what was already seen: no new wait line, no finding this tick
    assert found(window(LOADING, tail=tail)) == []
    assert found(window(HAMI[-1], tail=(LOADING, *HAMI[-5:]))) == []


def test_launcher_prefixes_are_read_through():
    prefixed = [f"[default0]:{line}" for line in (HAMI_FIRST, *HAMI)]
    assert len(found(window(*prefixed))) == 1


def test_look_alikes_repeated_are_no_finding():
    assert found(window(*(LOADING,) * 12)) == []
    assert found(window(*(OLMOCR,) * 12)) == []


def test_no_log_signature_reads_the_wait_line_and_sd536_runs_every_tick():
    assert [r.code for r in RULES if issubclass(r, LogSignature)
            for _ in r().check(window(HAMI_FIRST, *HAMI))] == []
    assert by_code("SD536").trigger == "tick" and "SD536" in STICKY
    assert [f.code for f in run_rules(window(HAMI_FIRST, *HAMI), "tick")
            if f.code == "SD536"] == ["SD536"]

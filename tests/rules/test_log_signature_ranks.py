"""LogSignature's reading of a line: the global rank only where the line says it, the process
group, and figures completed across the lines of one event (lines from the fixtures' threads)."""
from __future__ import annotations

import pytest

from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import by_code
from stalldoc.rules.log_signature import line_group, line_rank, required_literal

WATCHDOG = ("[rank4]:[E318 07:39:53.792630246 ProcessGroupNCCL.cpp:616] [Rank 4] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=610, OpType=COALESCED, NumelIn=56320, "
            "NumelOut=450560, Timeout(ms)=600000) ran for 600086 milliseconds before timing out.")
STATUS = ("[rank4]:[E318 07:39:53.792780659 ProcessGroupNCCL.cpp:1834] [PG ID 2 PG GUID 9 Rank 4] "
          "Timeout at NCCL work: 610, last enqueued NCCL work: 616, last completed NCCL work: 609.")


@pytest.mark.parametrize("text,rank", [
    # torch's own prefix is the global rank, whatever the group's rank after it says
    ("[rank13]:[E218 04:54:22.864467604 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught", 13),
    ("[rank4]:[E ProcessGroupNCCL.cpp:1316] [PG 5 Rank 0] Heartbeat monitor timed out!", 4),
    ("[rank0]: torch.distributed.DistStoreError: wait timeout after 300000ms", 0),
    # the default group's tag is the global rank
    ("  what():  [PG ID 0 PG GUID 0(default_pg) Rank 2] Process group watchdog thread", 2),
    ("[PG 0 Rank 3] Timeout at NCCL work: 2", 3),
    ("[PG 0 (default_pg) Rank 3] Timeout at NCCL work: 2", 3),
    ("[PG ID 0 PG GUID 0 Rank 6] Received a dump signal", 6),
    # another group's tag names a rank in that group: nobody is blamed
    ("[PG ID 12 PG GUID 99(EXPERT_MODEL_PARALLEL_GROUP) Rank 4] ProcessGroupNCCL's watchdog", None),
    ("[PG 1 Rank 0] Exception (either an error or timeout) detected by watchdog", None),
    # torch <= 2.1 and DeepSpeed's log_dist: the bare [Rank N] is all there is
    ("[E ProcessGroupNCCL.cpp:458] [Rank 7] Watchdog caught collective operation timeout", 7),
    # launchers' local ranks and task ids, NCCL's GPU index, a group rank in a message
    ("[default3]:step 3 loss 1.2", None),
    ("[1,3]<stderr>:step 3", None),
    ("trainer/0 [1]:[W socket.cpp:558] [c10d] The client socket has failed to connect", None),
    ("kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion", None),
    ("[4] is setting up NCCL communicator and retrieving ncclUniqueId from [0]", None),
])
def test_rank_is_read_only_where_the_line_says_it(text, rank):
    assert line_rank(text) == rank


@pytest.mark.parametrize("text,group", [
    ("[PG ID 0 PG GUID 0(default_pg) Rank 2] x", "default_pg"),
    ("[PG ID 12 PG GUID 99(EXPERT_MODEL_PARALLEL_GROUP) Rank 4] x", "EXPERT_MODEL_PARALLEL_GROUP"),
    ("[PG ID 2 PG GUID 9 Rank 4] x", "2"),
    ("[PG 3 Rank 4] x", "3"),
    ("[Rank 4] x", None),
])
def test_process_group_is_its_description_else_its_id(text, group):
    assert line_group(text) == group


def window(*texts: str) -> Window:
    return Window(100.0, (), log=tuple(LogLine(99.0, "stderr", t) for t in texts))


def test_figures_of_one_timeout_are_gathered_from_its_lines():
    # GIVEN the watchdog's timeout line and its status line of the same collective
    [finding] = by_code("SD501")().check(window(WATCHDOG, STATUS))
    # THEN one finding carries the op of the first and the progress of the second
    ev = finding.evidence
    assert (ev["seq"], ev["op"], ev["timeout_ms"]) == ("610", "COALESCED", "600000")
    assert (ev["last_enqueued"], ev["last_completed"], ev["pg"]) == ("616", "609", "2")
    assert ev["count"] == 2 and finding.ranks == (4,)


def test_first_line_wins_a_figure_both_lines_carry():
    later = STATUS.replace("work: 610,", "work: 611,")
    [finding] = by_code("SD501")().check(window(STATUS, later))
    assert finding.evidence["seq"] == "610"


@pytest.mark.parametrize("line,waiting_for", [
    ("[rank0]: torch.distributed.DistStoreError: wait timeout after 300000ms, keys: "
     "/broadcast_from/0/75465", "weight-sync communicator"),
    ("torch.distributed.DistBackendError: [4] is setting up NCCL communicator and retrieving "
     "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: "
     "Socket Timeout", "NCCL communicator setup"),
    ("torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 1/3 "
     "clients joined.", "the TCPStore server waits for ranks"),
])
def test_store_timeout_says_who_waits_on_the_store(line, waiting_for):
    [finding] = by_code("SD514")().check(window(line))
    assert waiting_for in finding.evidence["waiting_for"]


def test_store_timeout_of_an_unknown_key_claims_no_waiter():
    [finding] = by_code("SD514")().check(window("RuntimeError: Socket Timeout"))
    assert "waiting_for" not in finding.evidence


@pytest.mark.parametrize("pattern,literal", [
    (r"NET/IB ?: Got completion from peer (?P<peer>\S+)", ": Got completion from peer "),
    (r"Timeout\(ms\)=(?P<timeout_ms>\d+)", "Timeout(ms)="),
    (r"\[c10d\] waitForInput: socket .*timed out", "[c10d] waitForInput: socket "),
    (r"ab{2}cdef", "cdef"),
    (r"\d+ items in a row", " items in a row"),
    (r"x[^)\]]yz and more", "yz and more"),
    (r"(?:Process group|NCCL) watchdog thread", " watchdog thread"),
    (r"torch\.(cuda\.)?OutOfMemoryError", "OutOfMemoryError"),
    (r"this|that", ""),                 # an alternation at the top: nothing is certain
    (r"(?i)watchdog", ""),              # case-insensitive: 'in' would miss WATCHDOG
])
def test_required_literal_is_text_every_match_contains(pattern, literal):
    assert required_literal(pattern) == literal


def test_every_log_rule_pattern_has_a_literal_its_matches_contain():
    from stalldoc.rules import RULES
    from stalldoc.rules.log_signature import LogSignature
    for rule in (r for r in RULES if issubclass(r, LogSignature)):
        for pattern in rule.patterns:
            assert required_literal(pattern) in pattern.replace("\\", ""), (rule.code, pattern)


def test_every_string_a_pattern_matches_contains_its_literal():
    """Property: hypothesis writes strings each rule pattern matches; the literal the rules look
    for first is in every one of them (else a real line would be skipped unread)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from stalldoc.rules import RULES
    from stalldoc.rules.log_signature import LogSignature
    patterns = [p for r in RULES if issubclass(r, LogSignature) for p in r.patterns]

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(patterns).flatmap(lambda p: st.tuples(st.just(p), st.from_regex(p))))
    def check(case: tuple[str, str]) -> None:
        pattern, text = case
        assert required_literal(pattern) in text, (pattern, text)

    check()

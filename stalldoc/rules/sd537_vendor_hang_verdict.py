"""SD537 vendor-hang-verdict."""
from __future__ import annotations

import re
from typing import Any, Iterator, Mapping

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import join_ranks
from stalldoc.rules.log_signature import LogSignature

_NVRX = "NVIDIA Resiliency Extension's rank monitor"
_HCCL = "Huawei HCCL's cluster heartbeat"
_ROCM = "ROCm's runtime"
_HEARTBEAT = (r"Did not get (?P<heartbeat>initial|subsequent) heartbeat\. Waited "
              r"(?P<waited_seconds>\d+(?:\.\d+)?) seconds")
_SECTION = (r"Section '(?P<section>[^']*)' has been open for (?P<elapsed_seconds>\d+(?:\.\d+)?) "
            r"seconds\. Timeout is (?P<timeout_seconds>\d+(?:\.\d+)?) seconds")
_OUT_OF_SECTION = (r"Was out of section for (?P<elapsed_seconds>\d+(?:\.\d+)?) seconds\. "
                   r"Timeout is (?P<timeout_seconds>\d+(?:\.\d+)?) seconds")
_HCCL_EXCEPTION = (r"Cluster Exception Location\[IP/ID\]:\[(?P<location>[^\]]+)\], Arrival "
                   r"Time:\[[^\]]*\],(?: Discoverer:\[(?P<discoverer>[^\]]+)\],)? ExceptionType:"
                   r"\[(?P<exception>Stuck|Heartbeat Lost|Op Inconsistent|Error cqe) Occurred\]")
_GPU_HANG = (r"HW Exception by GPU node-(?P<gpu_node>\d+) \(Agent handle: [^)]*\) reason ?: ?GPU "
             r"Hang")
_TOOL = {_HEARTBEAT: _NVRX, _SECTION: _NVRX, _OUT_OF_SECTION: _NVRX, _HCCL_EXCEPTION: _HCCL,
         _GPU_HANG: _ROCM}
_KIND = {_HEARTBEAT: "heartbeat", _SECTION: "section", _OUT_OF_SECTION: "out_of_section",
         _HCCL_EXCEPTION: "cluster_exception", _GPU_HANG: "gpu_hang"}
# the rank an NVRx rank monitor serves, in its logger's prefix: v0.2 ``[RankMonitorServer:34]``,
# v0.3-0.4 ``[RankMonServer15462@host:0]``, v0.5+ ``[workload:3(3) infra:3(3)]``
_MONITORED = re.compile(r"\[RankMonitorServer:(\d+)\]|\[RankMonServer\d*@[^\]:]*:(\d+)\]"
                        r"|\[workload:(\d+)\(")
_HCCL_SAYS = {
    "Stuck": "the rank at {location} (host / rank in its communicator) is stuck: its host "
             "process or its device task",
    "Heartbeat Lost": "the heartbeat of the rank at {location} is lost{discovered}: its process "
                      "exited or its network is down",
    "Op Inconsistent": "the rank at {location} issued a different collective than its peers",
    "Error cqe": "a network completion error at {location}: a link down, or the remote rank died",
}


class VendorHangVerdict(LogSignature):
    """A hang monitor of the job's own stack declared a rank or a device hung, in its own words.

    What it does
        Matches the verdicts such monitors print, behind any prefix, and says which tool spoke:
        NVIDIA Resiliency Extension's rank monitor (NVRx, ``ft_launcher``; NeMo and Megatron use
        it) ``Did not get initial heartbeat. Waited 30.00 seconds.`` / ``Did not get subsequent
        heartbeat. Waited 6.00 seconds.`` (``[Cycle N]`` in front since v0.6), ``Section 'step'
        has been open for 312.40 seconds. Timeout is 300.00 seconds.`` and ``Was out of section
        for ...``, with the rank its logger's prefix names (``[RankMonServer15462@host:0]``,
        ``[RankMonitorServer:34]``, ``[workload:3(3) ...]``); Huawei HCCL's cluster heartbeat
        (Ascend NPUs; inside the ``EI0002`` notify-wait timeout torch_npu prints)
        ``Cluster Exception Location[IP/ID]:[172.16.38.219/6], Arrival Time:[...],
        ExceptionType:[Stuck Occurred]`` (also ``Heartbeat Lost``, ``Op Inconsistent``, ``Error
        cqe``); ROCm's ``HW Exception by GPU node-9 (Agent handle: 0x...) reason :GPU Hang``.
        Their context lines (NVRx's ``FT timeout elapsed.``, its start-up and straggler lines;
        HCCL's INFO ``status[LOST]`` events; ROCm's memory access faults, a crash) are no
        finding.

    Why is this bad?
        The monitor acts on its verdict: NVRx kills the rank (SIGKILL by default) and
        ft_launcher restarts the group or gives up; HCCL's verdict comes with the collective that
        timed out; a ROCm GPU hang aborts the process. A monitor that watches each rank alone
        (NVRx's heartbeats) names every rank that stopped, the ones waiting for a peer as well as
        the peer: its verdict says the job hung, not which rank began it. NVRx's timeouts are
        often minutes, so stalldoc's stall finding usually comes first.

    Evidence
        the lines; ``tool`` (which monitor spoke), ``kind`` (heartbeat, section, out_of_section,
        cluster_exception, gpu_hang), ``monitor_ranks`` (the ranks NVRx's lines name),
        ``heartbeat`` (initial or subsequent), ``waited_seconds``, ``section``,
        ``elapsed_seconds``, ``timeout_seconds``, ``location`` and ``discoverer`` (HCCL's host /
        rank), ``exception``, ``gpu_node`` (ROCm's node id).

    Fix
        Find the rank that stopped first, not every rank the monitor saw stop: stalldoc's stall
        finding of this run (SD101, SD103, SD105) names it with its frame. Raise a monitor's
        timeout only for a phase that is legitimately longer (NVRx:
        ``--ft-rank-heartbeat-timeout``, ``--ft-rank-section-timeouts`` for checkpointing).

        HCCL: a Stuck rank's host stack (``py-spy dump``) and its device log (plog) say which;
        ``HCCL_EXEC_TIMEOUT`` bounds the wait. A lost HCCL heartbeat: that process's exit
        (``dmesg``, the OOM killer, its node). A ROCm GPU hang is the device's:
        ``dmesg`` for amdgpu resets, the kernel that ran, the driver and firmware versions.

    References
        InternLM/lmdeploy#3354 (HCCL's Stuck Occurred inside EI0002, rank 6 of 8),
        ROCm/legacy-rocm-build#4021 (GPU Hang on MI300X, training with axolotl); NVRx's rank monitor as nvidia-resiliency-ext 0.4.1's ``ft_launcher``
        printed it for both ranks of a gloo job whose rank 1 stopped in its data loading (rank
        0 waited in all_reduce, and sent no heartbeat either).
    """

    code = "SD537"
    name = "vendor-hang-verdict"
    severity = Severity.ERROR
    headline = "a hang monitor declared a hang"
    patterns = (_HEARTBEAT, _SECTION, _OUT_OF_SECTION, _HCCL_EXCEPTION, _GPU_HANG)

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        pattern = match.re.pattern
        return {**super().details(match), "tool": _TOOL[pattern], "kind": _KIND[pattern]}

    def check(self, window: Window) -> Iterator[Finding]:
        for found in super().check(window):
            evidence = dict(found.evidence)
            monitored = sorted({int(n) for line in evidence["lines"]
                                for m in _MONITORED.finditer(line) for n in m.groups() if n})
            if monitored:
                evidence["monitor_ranks"] = monitored
            yield self.finding(found.ranks, _summary(evidence), evidence)


def _summary(evidence: Mapping[str, Any]) -> str:
    """Which tool said what, in its words made plain."""
    tool, kind = evidence["tool"], evidence["kind"]
    if tool == _NVRX:
        return f"{tool} declared {_ranks(evidence)} hung: {_nvrx(evidence)}; it ends the rank"
    if kind == "cluster_exception":
        said = _HCCL_SAYS[evidence["exception"]]
        discovered = f" (found by {evidence['discoverer']})" if "discoverer" in evidence else ""
        return f"{tool} says " + said.format(location=evidence["location"],
                                             discovered=discovered)
    return f"{tool} reports GPU node-{evidence['gpu_node']} hung (GPU Hang); the process aborts"


def _ranks(evidence: Mapping[str, Any]) -> str:
    ranks = evidence.get("monitor_ranks")
    return join_ranks(ranks) if ranks else "a rank"


def _nvrx(evidence: Mapping[str, Any]) -> str:
    kind = evidence["kind"]
    if kind == "heartbeat":
        return f"no {evidence['heartbeat']} heartbeat in {evidence['waited_seconds']} s"
    where = (f"section '{evidence['section']}' open" if kind == "section"
             else "out of every section")
    return f"{where} for {evidence['elapsed_seconds']} s (timeout {evidence['timeout_seconds']} s)"

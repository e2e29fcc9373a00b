"""The report document: the JSON contract of ``stalldoc report --format json``, written field by
field from the typed records (docs/reports.md lists the fields; they are extended, never renamed).

One run gives the document it always gave. Several (the nodes of one job) give ``nodes`` and each
node's document under ``runs``, with ``ranks``, ``stalls``, ``findings`` and ``stacks`` merged at
the top, each row naming its ``node``.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping

from stalldoc.report.records import Report, RunRecord

ROW_TABLES = ("ranks", "stalls", "findings", "stacks")


def plain(value: Any) -> Any:
    """JSON values: tuples as lists, mappings as dicts."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _rows(rows: tuple[Any, ...], node: bool) -> list[dict[str, Any]]:
    out = [plain(asdict(row)) for row in rows]
    if not node:
        for row in out:
            row.pop("node", None)
    return out


def _watermarks(run: RunRecord) -> dict[str, list[dict[str, Any]]]:
    rows = [plain(asdict(w)) for w in run.watermarks]
    for row in rows:
        if row["phase"] is None:
            del row["phase"]
    return {"run": [r for r in rows if "phase" not in r],
            "phases": [{"phase": r["phase"], **r} for r in rows if "phase" in r]}


def run_document(run: RunRecord, node: bool = False) -> dict[str, Any]:
    """One run's document (``node``: its rows name their node, for a merged report)."""
    doc = {"run": plain(asdict(run.info)),
           **{name: _rows(getattr(run, name), node) for name in ROW_TABLES},
           "phases": plain({name: asdict(p) for name, p in run.phases.items()}),
           "host": plain(asdict(run.host)),
           "gpus": _rows(run.gpus, False),
           "gpu_phases": _rows(run.gpu_phases, False),
           "watermarks": _watermarks(run),
           "probes": _rows(run.probes, False),
           "timeseries": {"ranks": _rows(run.timeseries.ranks, False),
                          "gpus": _rows(run.timeseries.gpus, False),
                          "node": _rows(run.timeseries.node, False)},
           "flight_dumps": list(run.flight_dumps),
           "step_shares": _rows(run.step_shares, False)}
    if node:
        doc["node"] = run.node
    return doc


def document(report: Report) -> dict[str, Any]:
    """The whole report as JSON values."""
    if not report.merged:
        return run_document(report.runs[0])
    return {"nodes": [r.node for r in report.runs],
            "runs": [run_document(r, node=True) for r in report.runs],
            **{name: _rows(getattr(report, name), True) for name in ROW_TABLES}}

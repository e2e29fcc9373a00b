"""Generate the Grafana dashboards from code (grafana-foundation-sdk).

    python grafana/generate.py          # rewrites grafana/dashboards/*.json

The JSON is committed; a test regenerates it and expects no change. PANELS lists every panel's
query, so the Prometheus test can ask a live Prometheus each one.
"""
from __future__ import annotations

import json
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

OUT = Path(__file__).resolve().parent / "dashboards"
SOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
NODE = '{instance=~"$instance"}'

# (dashboard uid, panel kind, title, unit, query, legend)
PANELS: tuple[tuple[str, str, str, str, str, str], ...] = (
    ("stalldoc-fleet", "stat", "Stalls now", "none",
     "sum(stalldoc_stall_active)", "stalls"),
    ("stalldoc-fleet", "timeseries", "Stall active per node", "none",
     "max by (instance) (stalldoc_stall_active)", "{{instance}}"),
    ("stalldoc-fleet", "timeseries", "Seconds since progress per rank", "s",
     "stalldoc_rank_seconds_since_progress", "{{instance}} rank {{rank}}"),
    ("stalldoc-fleet", "timeseries", "Phase per rank", "none",
     "stalldoc_rank_phase == 1", "{{instance}} rank {{rank}}: {{phase}}"),
    ("stalldoc-fleet", "table", "Open findings", "none",
     "sum by (instance, code, severity) (stalldoc_findings_open) > 0", ""),
    ("stalldoc-fleet", "table", "Findings opened in the run", "none",
     "sum by (instance, code, severity) (stalldoc_findings_total)", ""),
    ("stalldoc-fleet", "table", "Runs", "none",
     "stalldoc_run_info", ""),
    # recorded by grafana/alerts/stalldoc.rules.yml: max minus min over all nodes' ranks of a run
    ("stalldoc-fleet", "timeseries", "Collective lag per run and group (all nodes)", "none",
     "run_id_group:stalldoc_rank_collective_seq:max_minus_min", "{{run_id}} {{group}}"),
    ("stalldoc-fleet", "table", "Ranks furthest behind (collectives behind the furthest rank)",
     "none", "run_id_group_rank:stalldoc_rank_collective_seq:lowest", ""),
    ("stalldoc-node", "timeseries", "GPU memory used", "bytes",
     f"stalldoc_gpu_memory_used_bytes{NODE}", "GPU {{gpu}}"),
    ("stalldoc-node", "timeseries", "GPU memory peak", "bytes",
     f"stalldoc_gpu_memory_peak_bytes{NODE}", "GPU {{gpu}}"),
    ("stalldoc-node", "timeseries", "GPU utilisation", "percentunit",
     f"stalldoc_gpu_utilization_ratio{NODE}", "GPU {{gpu}}"),
    ("stalldoc-node", "timeseries", "PCIe traffic", "Bps",
     f"stalldoc_gpu_pcie_bytes_per_second{NODE}", "GPU {{gpu}} {{direction}}"),
    ("stalldoc-node", "timeseries", "Host memory per rank", "bytes",
     f"stalldoc_rank_host_rss_bytes{NODE}", "rank {{rank}}"),
    ("stalldoc-node", "timeseries", "Collectives started per second", "ops",
     f"rate(stalldoc_rank_collective_seq{NODE}[1m])", "rank {{rank}} {{group}}"),
    # by the process groups' own numbers: DDP's reducer and other C++ collectives included
    ("stalldoc-node", "timeseries", "Collectives issued per second (all groups, DDP included)",
     "ops", f"rate(stalldoc_rank_c10d_collectives_issued{NODE}[1m])", "rank {{rank}}"),
    # where each rank's steps go: its last cycles' shares by kind of phase (SD207's figure)
    ("stalldoc-node", "timeseries", "Step time by phase per rank (last 3 cycles)", "percentunit",
     f"stalldoc_rank_phase_share{NODE}", "rank {{rank}} {{phase}}"),
    ("stalldoc-node", "timeseries", "Cycle length per rank (rollout to rollout)", "s",
     f"stalldoc_rank_cycle_seconds{NODE}", "rank {{rank}}"),
    ("stalldoc-node", "timeseries", "Probe success", "none",
     f"stalldoc_probe_success{NODE}", "{{probe}}"),
    ("stalldoc-node", "timeseries", "Probe duration", "s",
     f"stalldoc_probe_duration_seconds{NODE}", "{{probe}}"),
)
TITLES = {"stalldoc-fleet": "stalldoc: fleet overview", "stalldoc-node": "stalldoc: node detail"}
_KINDS = {"stat": stat.Panel, "timeseries": timeseries.Panel, "table": table.Panel}


def _panel(kind: str, title: str, unit: str, query: str, legend: str) -> object:
    target = prometheus.Dataquery().expr(query).ref_id("A")
    if legend:
        target = target.legend_format(legend)
    if kind == "table":
        target = target.instant().format("table") if hasattr(target, "format") else target
    return (_KINDS[kind]().title(title).unit(unit).datasource(SOURCE).with_target(target)
            .span(24 if kind == "table" else 12).height(8))


def build(uid: str) -> dict:
    board = (dashboard.Dashboard(TITLES[uid]).uid(uid).tags(["stalldoc"]).refresh("10s")
             .time("now-1h", "now").timezone("browser")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus")
                            .type("prometheus"))
             .with_variable(dashboard.QueryVariable("instance").label("Node")
                            .datasource(SOURCE).query("label_values(stalldoc_run_info, instance)")
                            .multi(True).include_all(True)))
    for panel_uid, kind, title, unit, query, legend in PANELS:
        if panel_uid == uid:
            board = board.with_panel(_panel(kind, title, unit, query, legend))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder, sort_keys=True))


def render(uid: str) -> str:
    return json.dumps(build(uid), indent=2, sort_keys=True) + "\n"


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for uid in TITLES:
        (OUT / f"{uid}.json").write_text(render(uid))


if __name__ == "__main__":
    main()

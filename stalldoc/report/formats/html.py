"""``--format html``: one self-contained page that opens offline: the verdict first, a
timeline per rank, memory / PCIe curves, findings with evidence and fix, every rank's stack
grouped, the launch checks and GRPO plan. Jinja2 writes the page (autoescaped: the job's
strings are untrusted), Plotly draws the charts (plotly.js inlined once). Both are imported
only here, when this format is asked for; the watcher never loads them."""
from __future__ import annotations

import time
from typing import Any, ClassVar

import jinja2

from stalldoc import __version__
from stalldoc.report.formats import html_charts, html_view
from stalldoc.report.formats.html_timeline import build_timeline
from stalldoc.report.formats.text import SHARE_COLUMNS, gib
from stalldoc.report.records import Report


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("stalldoc.report.formats", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["gib"] = gib
    return env


def context(report: Report) -> dict[str, Any]:
    """Everything the template shows, as records (``html_view``) and drawn charts."""
    timeline = build_timeline(report)
    runs = report.runs
    return {
        "verdict": html_view.verdict(report), "merged": report.merged,
        "runs": [html_view.run_facts(r) for r in runs], "rank_rows": html_view.rank_rows(report),
        "stalls": [(s, html_view.when(s.started_at), html_view.when(s.detected_at),
                    html_view.when(s.ended_at) if s.ended_at else "never (it held to the end)")
                   for s in report.stalls],
        "timeline": html_charts.timeline_chart(timeline) if timeline.rows else None,
        "thinned": timeline.thinned,
        "curves": html_charts.curve_charts(report, timeline.origin, timeline.end),
        "findings": html_view.findings(report, launch=False),
        "launch_findings": html_view.findings(report, launch=True),
        "groups": html_view.stack_views(report), "fallbacks": [s for s in report.stacks if s.error],
        "plans": [(r.node, p) for r in runs if (p := html_view.launch_plan(r))],
        "run_records": runs, "share_columns": SHARE_COLUMNS, "plotly_js": html_charts.plotly_js(),
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"), "version": __version__,
    }


class HtmlReporter:
    name: ClassVar[str] = "html"
    suffix: ClassVar[str] = ".html"

    def render(self, report: Report) -> str:
        return environment().get_template("report.html.j2").render(context(report))


REPORTER = HtmlReporter()

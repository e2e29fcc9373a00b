"""The HTML report's charts, drawn with Plotly: the timeline per rank and the memory / PCIe
curves. Each chart is a ``<div>`` plus the call that draws it; plotly.js itself is put in the
page once (``plotly_js``). Text that reaches a chart is escaped (Plotly reads tags in labels)."""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.offline import get_plotlyjs

from stalldoc.report.formats.html_timeline import Bar, Mark, Timeline
from stalldoc.report.records import Report

CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False,
          "modeBarButtonsToRemove": ["select2d", "lasso2d"]}
PALETTE = qualitative.Set2 + qualitative.Pastel1
GIB = 2 ** 30
MB = 1e6
MARKS = {"exit": ("x-thin-open", "#444", "rank exit"),
         "killed": ("x", "#c62828", "killed by stalldoc"),
         "finding": ("diamond", "#ad1457", "finding")}


@dataclass(frozen=True)
class Chart:
    title: str
    div: str          # Plotly's <div> and <script>; safe to put in the page as is


def plotly_js() -> str:
    """plotly.js, to inline once per page."""
    return get_plotlyjs()


def _div(fig: go.Figure) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, config=CONFIG)


def _layout(fig: go.Figure, height: int, x_end: float, y_title: str = "") -> None:
    fig.update_layout(template="plotly_white", height=height, barmode="overlay",
                      margin={"l": 10, "r": 10, "t": 30, "b": 40}, hovermode="closest",
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
                      font={"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif",
                            "size": 12})
    fig.update_xaxes(title_text="seconds since start", range=[0, max(x_end, 1.0) * 1.02],
                     zeroline=False)
    fig.update_yaxes(title_text=y_title, automargin=True)


def _r(value: float) -> float:
    return round(value, 3)


def timeline_chart(tl: Timeline) -> Chart:
    fig = go.Figure()
    names = sorted({b.name for b in tl.phases})
    for i, name in enumerate(names):
        _bars(fig, [b for b in tl.phases if b.name == name], name, PALETTE[i % len(PALETTE)],
              width=0.5, offset=-0.35)
    done = [b for b in tl.collectives if not b.open]
    waiting = [b for b in tl.collectives if b.open]
    _bars(fig, done, "collective", "#5c6bc0", width=0.18, offset=0.18)
    _bars(fig, waiting, "collective not completed", "#ef6c00", width=0.18, offset=0.18)
    for kind, (symbol, colour, label) in MARKS.items():
        _marks(fig, [m for m in tl.marks if m.kind == kind], label, symbol, colour)
    for stall in tl.stalls:
        _shade(fig, stall.start, stall.detected, stall.end, stall.label, stall.ended)
    _layout(fig, 140 + 46 * len(tl.rows), tl.end)
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=list(tl.rows),
                     autorange="reversed", range=None)
    return Chart("Timeline per rank", _div(fig))


def _bars(fig: go.Figure, bars: Sequence[Bar], name: str, colour: str, width: float,
          offset: float) -> None:
    if not bars:
        return
    fig.add_trace(go.Bar(
        orientation="h", name=name, y=[b.row for b in bars],
        x=[_r(max(b.end - b.start, 0.0)) for b in bars], base=[_r(b.start) for b in bars],
        width=width, offset=offset, marker={"color": colour, "line": {"width": 0}},
        hovertext=[html.escape(b.hover) for b in bars], hoverinfo="text+y"))


def _marks(fig: go.Figure, marks: Sequence[Mark], name: str, symbol: str, colour: str) -> None:
    if not marks:
        return
    fig.add_trace(go.Scatter(
        mode="markers", name=name, y=[m.row for m in marks], x=[_r(m.t) for m in marks],
        marker={"symbol": symbol, "size": 13, "color": colour, "line": {"width": 2,
                                                                          "color": colour}},
        hovertext=[html.escape(m.hover) for m in marks], hoverinfo="text"))


def _shade(fig: go.Figure, start: float, detected: float, end: float, label: str,
           ended: bool) -> None:
    fig.add_vrect(x0=start, x1=detected, fillcolor="#e53935", opacity=0.16, line_width=0,
                  layer="below")
    fig.add_vrect(x0=detected, x1=max(end, detected), fillcolor="#e53935", opacity=0.07,
                  line_width=0, layer="below")
    fig.add_vline(x=detected, line={"color": "#c62828", "width": 1.5, "dash": "dot"})
    fig.add_annotation(x=detected, y=1, yref="paper", yanchor="bottom", showarrow=False,
                       text=html.escape(f"{label} detected" + ("" if ended else ", never ended")),
                       font={"color": "#c62828"})


Series = tuple[str, list[float], list[float]]


def curve_charts(report: Report, origin: float, x_end: float) -> list[Chart]:
    """The curves that have data: GPU memory, PCIe, host memory, node memory, CUDA allocator."""
    specs: list[tuple[str, str, Callable[[Report, float], list[Series]]]] = [
        ("GPU memory used", "GiB", gpu_memory), ("PCIe throughput per GPU", "MB/s", pcie),
        ("Host memory: resident set per rank", "GiB", rank_rss),
        ("Node memory available", "GiB", node_available),
        ("CUDA allocator per rank", "GiB", cuda_memory)]
    charts = []
    for title, unit, series_of in specs:
        series = [s for s in series_of(report, origin) if s[1]]
        if series:
            charts.append(Chart(title, _div(_lines(series, unit, x_end))))
    return charts


def _lines(series: Iterable[Series], unit: str, x_end: float) -> go.Figure:
    fig = go.Figure()
    for i, (name, xs, ys) in enumerate(series):
        dash = "dash" if name.endswith(("reserved", "to host")) else "solid"
        fig.add_trace(go.Scatter(mode="lines", name=html.escape(name), x=xs, y=ys,
                                 line={"width": 1.8, "dash": dash,
                                       "color": qualitative.D3[i % len(qualitative.D3)]}))
    _layout(fig, 280, x_end, unit)
    return fig


def _series(name: str, points: Iterable[Any], origin: float, value: Callable[[Any], Any],
            scale: float) -> Series:
    pairs = [(p.t, value(p)) for p in points]
    pairs = [(t, v) for t, v in pairs if v is not None]
    return name, [_r(t - origin) for t, _ in pairs], [round(v / scale, 4) for _, v in pairs]


def _prefix(report: Report, node: str) -> str:
    return f"{node} " if report.merged else ""


def _each(report: Report, table: str, key: str, label: str) -> Iterator[tuple[str, list[Any]]]:
    """Each GPU's ("gpus", "gpu") or rank's ("ranks", "rank") points of every run, named."""
    for run in report.runs:
        rows = getattr(run.timeseries, table)
        for value in sorted({getattr(p, key) for p in rows}):
            yield (f"{_prefix(report, run.node)}{label} {value}",
                   [p for p in rows if getattr(p, key) == value])


def gpu_memory(report: Report, origin: float) -> list[Series]:
    return [_series(name, points, origin, lambda p: p.memory_used, GIB)
            for name, points in _each(report, "gpus", "gpu", "GPU")]


def pcie(report: Report, origin: float) -> list[Series]:
    return [series for name, points in _each(report, "gpus", "gpu", "GPU") for series in (
        _series(f"{name} host to GPU", points, origin, lambda p: p.pcie_rx_bps, MB),
        _series(f"{name} GPU to host", points, origin, lambda p: p.pcie_tx_bps, MB))]


def rank_rss(report: Report, origin: float) -> list[Series]:
    return [_series(name, points, origin, lambda p: p.rss_bytes, GIB)
            for name, points in _each(report, "ranks", "rank", "rank")]


def node_available(report: Report, origin: float) -> list[Series]:
    return [_series(f"{run.node} available", run.timeseries.node, origin,
                    lambda p: p.available_bytes, GIB) for run in report.runs]


def cuda_memory(report: Report, origin: float) -> list[Series]:
    return [series for name, points in _each(report, "ranks", "rank", "rank") for series in (
        _series(f"{name} allocated", points, origin, lambda p: p.cuda_allocated, GIB),
        _series(f"{name} reserved", points, origin, lambda p: p.cuda_reserved, GIB))]
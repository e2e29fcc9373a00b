"""The scores of one stallbench run as one Markdown table page and one SVG plot."""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from pathlib import Path

from score import Score

COLOURS = ("#1f77b4", "#2ca02c", "#ff7f0e", "#d62728")


def arm_summary(scores: list[Score]) -> dict[str, dict[str, float | int | None]]:
    """Per arm: hangs run, culprit / frame / cause right, median seconds to the culprit, healthy
    runs, false stalls, kills."""
    rows: dict[str, dict[str, float | int | None]] = {}
    by_arm: dict[str, list[Score]] = defaultdict(list)
    for s in scores:
        by_arm[s.arm].append(s)
    for arm, own in by_arm.items():
        hangs = [s for s in own if s.truth == "hang" and not s.skipped and s.reached]
        healthy = [s for s in own if s.truth == "healthy" and not s.skipped]
        times = [s.seconds for s in hangs if s.seconds is not None]
        rows[arm] = {"hangs": len(hangs), "culprit": sum(s.culprit for s in hangs),
                     "frame": sum(s.frame for s in hangs), "cause": sum(s.cause for s in hangs),
                     "said": sum(bool(s.said) for s in hangs),
                     "median_s": statistics.median(times) if times else None,
                     "healthy": len(healthy), "false_stalls": sum(s.false_stall for s in healthy),
                     "kills": sum(s.killed for s in healthy)}
    return rows


def markdown(scores: list[Score], began: float, ended: float, command: str, where: str,
             hours: float) -> str:
    summary = arm_summary(scores)
    lines = [f"# stallbench: {time.strftime('%Y-%m-%d', time.gmtime(began))}", "",
             f"One run of `{command}` on {where}, from {_day(began)} to {_day(ended)}, "
             f"{hours:.1f} h of runs; every figure below comes from it. How each arm is set up "
             "and read, and how to add one: `benchmarks/stallbench/README.md` in the "
             "repository.", "",
             "![stallbench](stallbench.svg)", "",
             "| arm | hangs | culprit right | frame right | cause right | said anything | "
             "median s to culprit | healthy twins | false stalls | kills |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm, row in summary.items():
        median = "–" if row["median_s"] is None else f"{row['median_s']:.0f}"
        lines.append(f"| {arm} | {row['hangs']} | {row['culprit']} | {row['frame']} | "
                     f"{row['cause']} | {row['said']} | {median} | {row['healthy']} | "
                     f"{row['false_stalls']} | {row['kills']} |")
    lines += ["", "pyspy's seconds are the harness's choice (its dumps are taken 5 s after the "
              "hang, as by a person who already knows the job hangs and when): they time nothing "
              "the tool does. The arms' set-ups, and how each is read, are in the README.",
              "", "## Every run", "",
              "C culprit right, F frame right, K cause kind right, then the seconds from the hang "
              "to the first diagnosis naming the culprit; for healthy twins, *quiet* or what the "
              "arm declared. `–`: the arm said nothing about the culprit.", ""]
    lines += per_scenario(scores)
    lost = losses(scores)
    if lost:
        lines += ["", "## Where stalldoc loses", "",
                  "Each scenario where another arm said more than a stalldoc arm, or said it "
                  "sooner (pyspy's seconds excepted: they are the harness's), and each healthy twin "
                  "where a stalldoc arm declared a stall.", ""] + lost
    skipped = sorted({(s.arm, s.skipped) for s in scores if s.skipped})
    if skipped:
        lines += ["", "## Not run", ""] + [f"- {arm}: {why}" for arm, why in skipped]
    return "\n".join(lines) + "\n"


def _day(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def per_scenario(scores: list[Score]) -> list[str]:
    arms = list(dict.fromkeys(s.arm for s in scores))
    rows: dict[str, dict[str, Score]] = defaultdict(dict)
    for s in scores:
        rows[s.scenario][s.arm] = s
    lines = ["| scenario | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for name, cells in rows.items():
        lines.append(f"| {name} | " + " | ".join(cell(cells.get(a)) for a in arms) + " |")
    return lines


def cell(s: Score | None) -> str:
    if s is None or s.skipped:
        return "n/a"
    if not s.reached:
        return "did not reach its hang"
    if s.truth == "healthy":
        return ("**killed**" if s.killed else "**false stall**") if s.false_stall or s.killed \
            else "quiet"
    marks = "".join(m if ok else "·" for m, ok in (("C", s.culprit), ("F", s.frame),
                                                   ("K", s.cause)))
    took = "–" if s.seconds is None else f"{s.seconds:.0f} s"
    return f"{marks} {took}"


def losses(scores: list[Score]) -> list[str]:
    """One line per scenario and stalldoc arm that another arm beat: the culprit, then the frame
    or the cause where both named the culprit, then the time; and the twins it stalled."""
    rows: dict[str, dict[str, Score]] = defaultdict(dict)
    for s in scores:
        rows[s.scenario][s.arm] = s
    lines = []
    for name, cells in rows.items():
        for ours in (a for a in cells if a.startswith("stalldoc")):
            beaten = _beaten_by(cells[ours], [s for a, s in cells.items()
                                              if not a.startswith("stalldoc")])
            if beaten:
                lines.append(f"- {name}: {ours} ({cell(cells[ours])}) " + "; ".join(beaten))
    return lines


def _beaten_by(ours: Score, others: list[Score]) -> list[str]:
    if ours.skipped:
        return []
    if ours.truth == "healthy":
        return ["declared a stall on a healthy twin"] if ours.false_stall or ours.killed else []
    said = []
    for other in (o for o in others if not o.skipped and o.reached):
        what = _what_more(ours, other)
        if what:
            said.append(f"{other.arm} ({cell(other)}) {what}")
    return said


def _what_more(ours: Score, other: Score) -> str:
    if not other.culprit:
        return ""
    if not ours.culprit:
        return "named the culprit"
    more = [k for k in ("frame", "cause") if getattr(other, k) and not getattr(ours, k)]
    if more:
        return "named the " + " and the ".join(more)
    sooner = other.arm != "pyspy" and other.seconds is not None and ours.seconds is not None \
        and other.seconds < ours.seconds - 1
    return f"named the culprit {ours.seconds - other.seconds:.0f} s sooner" if sooner else ""


def svg(scores: list[Score]) -> str:
    """Above, per arm, four bars: culprit, frame and cause right (share of the hangs it ran) and
    false stalls (share of the healthy twins it ran); below, the median seconds from the hang to
    the culprit named."""
    summary = arm_summary(scores)
    width, height, left = 760, 500, 50
    group = (width - left - 20) / max(1, len(summary))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">']
    parts += _shares_panel(summary, left, group, width)
    parts += _seconds_panel(summary, left, group, width)
    return "\n".join(parts + ["</svg>"]) + "\n"


def _shares_panel(summary: dict, left: float, group: float, width: float) -> list[str]:
    bottom, parts = 240, []
    for tick in (0, 25, 50, 75, 100):
        y = bottom - tick * 2
        parts.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{tick}%</text>'
                     f'<line x1="{left}" y1="{y}" x2="{width - 10}" y2="{y}" stroke="#ddd"/>')
    for index, (arm, row) in enumerate(summary.items()):
        x0 = left + index * group + group * 0.1
        shares = [_share(row["culprit"], row["hangs"]), _share(row["frame"], row["hangs"]),
                  _share(row["cause"], row["hangs"]),
                  _share(row["false_stalls"], row["healthy"])]
        bar = group * 0.8 / 4
        parts.append(f'<text x="{x0 + group * 0.4:.1f}" y="{bottom + 15}" '
                     f'text-anchor="middle">{arm}</text>')
        for k, share in enumerate(shares):
            if share is not None:
                h = share * 200
                parts.append(f'<rect x="{x0 + k * bar:.1f}" y="{bottom - h:.1f}" '
                             f'width="{bar - 2:.1f}" height="{h:.1f}" fill="{COLOURS[k]}"/>')
    labels = ("culprit right", "frame right", "cause right", "false stalls (healthy twins)")
    for k, label in enumerate(labels):
        parts.append(f'<rect x="{left + k * 150}" y="8" width="12" height="12" '
                     f'fill="{COLOURS[k]}"/><text x="{left + k * 150 + 16}" y="18">'
                     f'{label}</text>')
    return parts


def _seconds_panel(summary: dict, left: float, group: float, width: float) -> list[str]:
    top, bottom = 300, 470
    longest = max([row["median_s"] or 0 for row in summary.values()] + [1.0])
    parts = [f'<text x="{left}" y="{top - 8}">median seconds from the hang to the culprit '
             f'named (none: never named)</text>',
             f'<line x1="{left}" y1="{bottom}" x2="{width - 10}" y2="{bottom}" stroke="#333"/>']
    for index, (arm, row) in enumerate(summary.items()):
        x0 = left + index * group + group * 0.3
        seconds = row["median_s"]
        label = "none" if seconds is None else f"{seconds:.0f} s"
        h = 0.0 if seconds is None else (bottom - top - 20) * seconds / longest
        parts.append(f'<rect x="{x0:.1f}" y="{bottom - h:.1f}" width="{group * 0.4:.1f}" '
                     f'height="{h:.1f}" fill="#7f7f7f"/><text x="{x0 + group * 0.2:.1f}" '
                     f'y="{bottom - h - 4:.1f}" text-anchor="middle">{label}</text>'
                     f'<text x="{x0 + group * 0.2:.1f}" y="{bottom + 16}" '
                     f'text-anchor="middle">{arm}</text>')
    return parts


def _share(count: float | int | None, total: float | int | None) -> float | None:
    return None if not total else float(count or 0) / float(total)


def write(scores: list[Score], out: Path, began: float, ended: float, command: str,
          where: str, hours: float) -> None:
    (out / "stallbench.md").write_text(markdown(scores, began, ended, command, where, hours))
    (out / "stallbench.svg").write_text(svg(scores))

"""Readers of Chrome Trace Event JSON for the tests: Chrome DevTools' trace engine (the one
behind its Performance panel, bundled in Chromium and run here in headless Chromium, driven
over ``--remote-debugging-pipe`` with the standard library only), and a check of the format's
documented rules ("Trace Event Format", Google; Perfetto's notes on JSON traces)."""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections import defaultdict
from typing import Any

TRACE_APP = "devtools://devtools/bundled/trace_app.html"
PARSE = """(async () => {
  const T = await import('./models/trace/trace.js');
  const model = T.TraceModel.Model.createWithAllHandlers();
  await model.parse(%s, {isFreshRecording: false});
  const d = model.parsedTrace(0).data;
  const processes = {};
  for (const [pid, p] of d.Renderer.processes) {
    processes[pid] = {};
    for (const [tid, t] of p.threads) processes[pid][tid] = t.entries.map(e => e.name);
  }
  return {
    names: Object.fromEntries([...d.Meta.processNames].map(([pid, e]) => [pid, e.args.name])),
    threads: Object.fromEntries([...d.Meta.threadsInProcess].map(([pid, m]) =>
      [pid, Object.fromEntries([...m].map(([tid, e]) => [tid, e.args.name]))])),
    processes,
    flows: d.Flows.flows.map(f => f.map(e => [e.pid, e.tid, e.ts, e.name])),
    generic: d.Meta.traceIsGeneric,
  };
})()"""


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))
                 if p), None)


class Chromium:
    """Headless Chromium spoken to over the DevTools protocol on a pipe (fds 3 and 4)."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.deadline = time.monotonic() + timeout
        self.profile = tempfile.mkdtemp(prefix="stalldoc-chromium-")
        to_chrome, self.writer = os.pipe()
        self.reader, from_chrome = os.pipe()

        def fds() -> None:
            os.dup2(to_chrome, 3)
            os.dup2(from_chrome, 4)
        self.proc = subprocess.Popen(
            [chromium() or "chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-pipe", "--no-first-run", f"--user-data-dir={self.profile}",
             "about:blank"], pass_fds=(3, 4), preexec_fn=fds, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self.buffer, self.last_id = b"", 0

    def call(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:
        self.last_id += 1
        message = {"id": self.last_id, "method": method, "params": params or {},
                   **({"sessionId": session} if session else {})}
        os.write(self.writer, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.last_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]  # type: ignore[no-any-return]
            self.buffer += self._read()

    def _read(self) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0 or not select.select([self.reader], [], [], left)[0]:
            raise TimeoutError("Chromium did not answer in time")
        chunk = os.read(self.reader, 1 << 20)
        if not chunk:
            raise RuntimeError("Chromium closed the pipe")
        return chunk

    def page(self, url: str) -> str:
        """A session on a new tab at ``url``, once loaded."""
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        while self.evaluate(session["sessionId"], "document.readyState") != "complete":
            time.sleep(0.1)
        return session["sessionId"]  # type: ignore[no-any-return]

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True}, session)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("exception", {})
                               .get("description", result["exceptionDetails"]))
        return result["result"].get("value")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.writer)
        os.close(self.reader)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def devtools_parse(trace: dict[str, Any]) -> dict[str, Any]:
    """What Chrome DevTools' trace engine makes of ``trace``: process and thread names, the
    slices it placed on each thread, the flows it linked."""
    with Chromium() as browser:
        session = browser.page(TRACE_APP)
        parsed: dict[str, Any] = browser.evaluate(session, PARSE % json.dumps(trace["traceEvents"]))
        return parsed


# ----- the format's documented rules -----------------------------------------------------------
REQUIRED = {"X": ("name", "ts", "dur", "pid", "tid"), "B": ("name", "ts", "pid", "tid"),
            "E": ("ts", "pid", "tid"), "i": ("name", "ts", "pid", "s"),
            "I": ("name", "ts", "pid", "s"), "C": ("name", "ts", "pid", "args"),
            "M": ("name", "pid", "args"), "s": ("name", "ts", "pid", "tid", "id", "cat"),
            "t": ("name", "ts", "pid", "tid", "id", "cat"),
            "f": ("name", "ts", "pid", "tid", "id", "cat")}
METADATA = {"process_name": "name", "process_sort_index": "sort_index",
            "thread_name": "name", "thread_sort_index": "sort_index", "process_labels": "labels"}


def trace_errors(trace: dict[str, Any]) -> list[str]:
    """Every way ``trace`` breaks the Trace Event Format's rules (empty: none)."""
    errors = [] if isinstance(trace.get("traceEvents"), list) else ["no traceEvents list"]
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        errors.append(f"displayTimeUnit {trace['displayTimeUnit']!r}")
    events = trace.get("traceEvents") or []
    for i, e in enumerate(events):
        errors += [f"event {i} ({e.get('ph')}): {m}" for m in _event_errors(e)]
    return errors + _nesting_errors(events) + _flow_errors(events)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _event_errors(e: dict[str, Any]) -> list[str]:
    ph = e.get("ph")
    if ph not in REQUIRED:
        return [f"phase {ph!r} not used here"]
    errors = [f"no {k}" for k in REQUIRED[ph] if k not in e]
    errors += [f"{k} not a number" for k in ("ts", "dur", "pid", "tid") if k in e
               and not _number(e[k])]
    if ph == "X" and _number(e.get("dur")) and e["dur"] < 0:
        errors.append("negative dur")
    if ph in "iI" and e.get("s") not in ("g", "p", "t"):
        errors.append(f"instant scope {e.get('s')!r}")
    if ph == "C" and not all(_number(v) for v in (e.get("args") or {}).values()):
        errors.append("counter with a value that is not a number")
    if ph == "M" and METADATA.get(e.get("name", "")) not in (e.get("args") or {}):
        errors.append(f"metadata {e.get('name')!r} without its argument")
    if ph == "f" and e.get("bp", "e") != "e":
        errors.append(f"flow end binding point {e.get('bp')!r}")
    if "args" in e and not isinstance(e["args"], dict):
        errors.append("args not an object")
    return errors


def _nesting_errors(events: list[dict[str, Any]]) -> list[str]:
    """Slices on one thread nest: none ends inside another it started in (B/E pair too)."""
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    open_b: dict[tuple[Any, Any], list[float]] = defaultdict(list)
    errors = []
    for e in sorted((e for e in events if e.get("ph") in ("X", "B", "E")), key=lambda e: e["ts"]):
        key = (e["pid"], e["tid"])
        if e["ph"] == "X":
            by_thread[key].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif e["ph"] == "B":
            open_b[key].append(e["ts"])
        elif not open_b[key]:
            errors.append(f"E without B on {key}")
        else:
            by_thread[key].append((open_b[key].pop(), e["ts"], e.get("name", "")))
    for key, slices in by_thread.items():
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                errors.append(f"{name!r} on {key} overlaps {stack[-1][2]!r} without nesting")
            stack.append((start, end, name))
    return errors + [f"B without E on {k}" for k, v in open_b.items() if v]


def _flow_errors(events: list[dict[str, Any]]) -> list[str]:
    """Each flow id: one "s" first, one "f" last, "t" between; each bound to a slice of its
    thread with the same ts and cat (as DevTools binds them)."""
    slices = {(e["pid"], e["tid"], e["ts"], e.get("cat")) for e in events if e.get("ph") == "X"}
    chains: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") in ("s", "t", "f"):
            chains[e["id"]].append(e)
    errors = []
    for flow_id, chain in chains.items():
        phases = "".join(e["ph"] for e in sorted(chain, key=lambda e: e["ts"]))
        if not (phases.startswith("s") and phases.endswith("f") and len(phases) >= 2
                and set(phases[1:-1]) <= {"t"}):
            errors.append(f"flow {flow_id}: phases {phases!r}")
        errors += [f"flow {flow_id}: {e['ph']} bound to no slice" for e in chain
                   if (e["pid"], e["tid"], e["ts"], e.get("cat")) not in slices]
    return errors

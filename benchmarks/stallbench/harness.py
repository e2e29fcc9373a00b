"""Run one scenario under one arm, and score what the arm said against the scenario's truth.

An arm is a module in ``arms/`` with an ``ARM`` object of this shape (``Arm``): it says whether
it can run here, turns the scenario's launch command into its own, and afterwards reads what it
printed or wrote into ``Diagnosis`` records, the way a user reads them. The harness owns
everything else: a scratch folder, the truth file, the clock, and ending every process.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

import psutil

from scenario import HERE, Scenario

START_LIMIT = 180.0   # seconds a scenario may take to reach its hang (imports, engines)


@dataclass(frozen=True)
class Diagnosis:
    """One thing an arm said: when, which culprits (ranks as '0', '1', or a part's name), which
    frame (a function name, '' when none), which kind of cause ('' when none)."""
    t: float
    culprits: frozenset[str]
    frame: str = ""
    cause: str = ""
    text: str = ""


@dataclass(frozen=True)
class Run:
    """What the harness saw of one run."""
    folder: Path
    started: float
    hang_at: float | None            # the first truth mark (None: the scenario never got there)
    ended: float
    exit_code: int | None            # None: the harness ended it at the budget
    parts: dict[int, str] = field(default_factory=dict)   # pid -> rank or part, as announced
    ports: dict[int, str] = field(default_factory=dict)   # TCP port listened on -> part


class Arm(Protocol):
    name: str

    def unavailable(self, scenario: Scenario) -> str:
        """Why this arm cannot run ``scenario`` here ('' when it can)."""

    def command(self, scenario: Scenario, folder: Path) -> tuple[list[str], dict[str, str]]:
        """The command and the extra environment for ``scenario``."""

    def during(self, run: Run) -> None:
        """Called once the hang has begun and the arm's own moment has come (py-spy by hand)."""

    def read(self, run: Run) -> list[Diagnosis]:
        """What the arm said, read from its output in ``run.folder``."""

    # optional: ``settled(run) -> bool``, the arm has said what it will say about a hang (the
    # harness then ends the run before the budget; healthy twins always run their course)


def execute(scenario: Scenario, arm: Arm, folder: Path, grace: float = 10.0) -> Run:
    """Run ``scenario`` under ``arm`` in ``folder`` until the arm's command ends or the budget
    after the hang runs out; every process it started is ended."""
    if folder.exists():   # a run before into the same folder: its marks are not this run's
        shutil.rmtree(folder)
    (folder / "pids").mkdir(parents=True)
    argv, extra = arm.command(scenario, folder)
    # jobkit stands where a job's libraries stand (a site-packages folder): every tool reads its
    # frames as library frames, as it reads torch.distributed's that a real job calls instead
    library = folder / "lib" / "site-packages"
    library.mkdir(parents=True)
    shutil.copy(HERE / "jobkit.py", library / "jobkit.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(library),
                                                       os.environ.get("PYTHONPATH")])),
           "STALLBENCH_TRUTH": str(folder / "truth.jsonl"),
           "STALLBENCH_PIDS": str(folder / "pids"), **extra}
    started = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=folder, start_new_session=True)
    readers = [_Lines(stream, name, folder) for stream, name in
               ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    hang_at = _wait_for_hang(proc, folder, started)
    deadline = (hang_at or started) + scenario.budget
    if hang_at is not None and proc.poll() is None:
        _note_ports(folder)
        arm.during(_run(folder, started, hang_at, proc))
    settled = getattr(arm, "settled", None)
    while proc.poll() is None and time.time() < deadline:
        if scenario.hang and hang_at is not None and settled is not None \
                and settled(_run(folder, started, hang_at, proc)):
            break
        time.sleep(0.5)
    exit_code = proc.poll()
    _end(proc, grace, folder)
    for reader in readers:
        reader.join(10)
    run = _run(folder, started, hang_at, proc, exit_code)
    (folder / "run.json").write_text(json.dumps({"started": run.started, "hang_at": run.hang_at,
                                                 "ended": run.ended,
                                                 "exit_code": run.exit_code}))
    return run


def kept(folder: Path) -> Run | None:
    """A run as ``execute`` left it in ``folder`` (None: no finished run there), to be read and
    scored again."""
    path = folder / "run.json"
    if not path.exists():
        return None
    meta = json.loads(path.read_text())
    parts, known = _parts(folder)
    return Run(folder, meta["started"], meta["hang_at"], meta["ended"], meta["exit_code"], parts,
               known)


class _Lines(threading.Thread):
    """One output stream, kept raw (NAME.txt) and line by line with each line's arrival time
    (lines.jsonl): what a user sees on the terminal, and when."""

    def __init__(self, stream: IO[bytes] | None, name: str, folder: Path) -> None:
        super().__init__(daemon=True)
        self.stream, self.name, self.folder = stream, name, folder
        self.start()

    def run(self) -> None:
        assert self.stream is not None
        with open(self.folder / f"{self.name}.txt", "wb") as raw, \
                open(self.folder / f"{self.name}.jsonl", "w") as timed:
            for line in iter(self.stream.readline, b""):
                raw.write(line)
                raw.flush()
                timed.write(json.dumps({"t": time.time(), "line": line.decode(
                    errors="replace").rstrip("\n")}) + "\n")
                timed.flush()


def output(run: Run, stream: str = "stderr") -> list[tuple[float, str]]:
    """The lines the command printed on ``stream``, with their arrival times."""
    path = run.folder / f"{stream}.jsonl"
    if not path.exists():
        return []
    return [(row["t"], row["line"]) for row in map(json.loads, path.read_text().splitlines())]


def _wait_for_hang(proc: subprocess.Popen[bytes], folder: Path, started: float) -> float | None:
    while proc.poll() is None and time.time() < started + START_LIMIT:
        mark = truth_marks(folder)
        if mark:
            return mark[0]["t"]
        time.sleep(0.2)
    mark = truth_marks(folder)
    return mark[0]["t"] if mark else None


def truth_marks(folder: Path) -> list[dict]:
    path = folder / "truth.jsonl"
    if not path.exists():
        return []
    return sorted((json.loads(line) for line in path.read_text().splitlines() if line.strip()),
                  key=lambda mark: mark["t"])


def _run(folder: Path, started: float, hang_at: float | None, proc: subprocess.Popen[bytes],
         exit_code: int | None = None) -> Run:
    parts, known = _parts(folder)
    return Run(folder, started, hang_at, time.time(), exit_code, parts, known)


def _parts(folder: Path) -> tuple[dict[int, str], dict[int, str]]:
    """pid -> part as announced, and listening port -> part, from a run's folder."""
    parts = {int(p.name): p.read_text() for p in (folder / "pids").iterdir()}
    ports = folder / "ports.json"
    known = {int(k): v for k, v in json.loads(ports.read_text()).items()} if ports.exists() else {}
    return parts, known


def _note_ports(folder: Path) -> None:
    """The TCP ports each announced part listens on at the hang (a server's address, as its
    user knows it), for arms that name a server by its address."""
    ports: dict[int, str] = {}
    for path in (folder / "pids").iterdir():
        try:
            listening = psutil.Process(int(path.name)).net_connections(kind="tcp")
        except (psutil.Error, ValueError):
            continue
        ports.update({c.laddr.port: path.read_text() for c in listening
                      if c.status == psutil.CONN_LISTEN})
    (folder / "ports.json").write_text(json.dumps(ports))


def _end(proc: subprocess.Popen[bytes], grace: float, folder: Path) -> None:
    """End the session the command started, and whatever of it left the session (Ray's raylet,
    a detached server, a server whose trainer died first): every process whose environment
    carries this run's truth path."""
    stray = _strays(proc, str(folder / "truth.jsonl"))
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for p in stray:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        psutil.wait_procs(stray, timeout=wait)
        try:
            proc.wait(timeout=wait)
            if not [p for p in stray if p.is_running()]:
                break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def _strays(proc: subprocess.Popen[bytes], truth: str) -> list[psutil.Process]:
    """The command's processes, and every other that carries ``truth`` in its environment."""
    try:
        found = {p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)}
    except psutil.Error:
        found = {}
    for p in psutil.process_iter():
        try:
            if p.pid not in found and p.environ().get("STALLBENCH_TRUTH") == truth:
                found[p.pid] = p
        except psutil.Error:
            continue
    return list(found.values())

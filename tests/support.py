"""Test support: helpers that run the real CLI against real torchrun jobs and read back their
reports. Imported by the tests as ``support``; conftest.py only holds fixtures."""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
STALL_TIMEOUT = "3"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now and below the kernel's ephemeral range, so that no process binding port 0
    (Ray's servers, gRPC, another job's store) takes it between this check and the job's own bind.
    CI saw that race once: Ray's cluster took a gloo world's port while it started."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, max(_ephemeral_low(), 20001))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def torchrun(nproc: int, scenario: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            str(SCENARIOS / scenario)]


def launcher(name: str, nproc: int, scenario: str) -> list[str]:
    """The command line that runs a scenario with ``nproc`` ranks under a real launcher."""
    script, port = str(SCENARIOS / scenario), str(free_port())
    bindir = Path(sys.executable).parent
    if name == "torchrun":
        return torchrun(nproc, scenario)
    if name == "accelerate":
        return [str(bindir / "accelerate"), "launch", "--multi_gpu", "--num_processes", str(nproc),
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", port, script]
    if name == "deepspeed":
        return [str(bindir / "deepspeed"), "--num_nodes", "1", "--num_gpus", str(nproc),
                "--master_port", port, script]
    raise ValueError(name)


STAND_INS = Path(__file__).resolve().parent / "stand_ins" / "site-packages"   # vLLM's


class QuietHandler(BaseHTTPRequestHandler):
    """A test server's handler that logs nothing."""

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serving(handler: type[BaseHTTPRequestHandler], release: threading.Event) -> Iterator[int]:
    """A threaded HTTP server on 127.0.0.1 (its port yielded) until the block ends; then
    ``release`` is set first, so that the requests its handlers hold let go."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        release.set()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent_rollout_server() -> Iterator[int]:
    """A local HTTP server on a free port (yielded) that answers a vLLM rollout server's health
    and world-size checks (and init_communicator), and takes every other request without ever
    answering it, until the block ends."""
    release = threading.Event()

    class Handler(QuietHandler):
        def do_GET(self) -> None:   # noqa: N802 - http.server's name
            self._answer({"world_size": 1} if "get_world_size" in self.path else {})

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if "init_communicator" in self.path:
                self._answer({})
            else:
                release.wait()      # holds the request: the client waits on its socket

        def _answer(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    with _serving(Handler, release) as port:
        yield port


@dataclass
class Storage:
    """A remote store outside the job (``trickle_storage``): its base URL, and when each held
    download stopped sending (name -> time.time())."""

    url: str
    held_at: dict[str, float]


@contextlib.contextmanager
def trickle_storage(size: int, rate: int, hold_after: dict[str, int] | None = None
                    ) -> Iterator[Storage]:
    """A local HTTP server standing in for remote storage (a hub, an object store): ``GET
    /NAME`` answers ``size`` bytes at ``rate`` bytes a second; a name in ``hold_after`` stops
    sending after that many bytes and keeps its connection open (a download that stalls), until
    the block ends."""
    release, held = threading.Event(), {}
    chunk = max(1, rate // 20)

    class Handler(QuietHandler):
        def do_GET(self) -> None:   # noqa: N802 - http.server's name
            limit = (hold_after or {}).get(self.path.strip("/"), size)
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            sent = 0
            while sent < min(size, limit) and not release.is_set():
                part = min(chunk, size - sent, limit - sent)
                self.wfile.write(b"\0" * part)
                sent += part
                time.sleep(part / rate)
            if sent < size:
                self.wfile.flush()
                held[self.path.strip("/")] = time.time()
                release.wait()

    with _serving(Handler, release) as port:
        yield Storage(f"http://127.0.0.1:{port}", held)


def run_with_agent(run_dir: Path, code: str) -> Any:
    """Run ``code`` (which prints its pid last) in a process with the agent; its final state."""
    from stalldoc.agent.state_reader import read_state
    from stalldoc.run.inject import agent_environment
    env = agent_environment(run_dir, dict(os.environ), os.getpid())
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    return read_state(str(run_dir / "agents" / f"agent-{out.stdout.split()[-1]}.state"))


@dataclass
class Result:
    code: int
    stderr: str
    run_dir: Path
    stdout: str = ""

    def report(self) -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(self.run_dir),
                              "--format", "json"], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    def rendered(self, fmt: str = "text") -> str:
        """``stalldoc report RUN_DIR --format FMT``, as a person reads it."""
        return subprocess.run([sys.executable, "-m", "stalldoc", "report", str(self.run_dir),
                               "--format", fmt], capture_output=True, text=True,
                              check=True).stdout

    def findings(self, code: str) -> list[dict[str, Any]]:
        return [f for f in self.report()["findings"] if f["code"] == code]

    def meta(self) -> dict[str, str]:
        return run_meta(self.run_dir)

    def read_back(self, tmp: Path) -> list[dict[str, Any]]:
        """The job's output saved as a user's log file (the lines the watch stored), read by
        ``stalldoc logs``: its findings, which must be those the watch's log rules made live."""
        log = save_job_log(self.run_dir, tmp / "job.log")
        out = subprocess.run([sys.executable, "-m", "stalldoc", "logs", str(log), "--format",
                              "json"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        read = json.loads(out.stdout)["findings"]
        live = {f["code"] for f in self.report()["findings"] if f["code"] in log_rule_codes()}
        assert {f["code"] for f in read} == live, (read, live)
        return read


def log_rule_codes() -> frozenset[str]:
    """The codes of the rules that read the job's output."""
    from stalldoc.rules import RULES
    from stalldoc.rules.log_signature import LogSignature
    return frozenset(rule.code for rule in RULES if issubclass(rule, LogSignature))


def save_job_log(run_dir: Path, path: Path) -> Path:
    """The job's output as the watch stored it, written to ``path`` as a log file."""
    import sqlite3
    with contextlib.closing(sqlite3.connect(run_dir / "run.db")) as conn:
        lines = [row[0] for row in conn.execute("SELECT line FROM logs ORDER BY rowid")]
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def is_alarm(finding: dict[str, Any]) -> bool:
    """Whether a healthy run's finding would be a false alarm: every finding but a slow rank
    (SD108) that was resolved. On a loaded machine, a rank that takes longer than the stall
    timeout to import and load while the others already wait in their rendezvous is what SD108
    says, a warning that ends with the phase; it is never a stall."""
    return not (finding["code"] == "SD108" and finding["state"] == "resolved")


def alarms(report: dict[str, Any]) -> list[str]:
    """The summaries of a healthy run's findings that would be false alarms (``is_alarm``)."""
    return [f["summary"] for f in report["findings"] if is_alarm(f)]


def run_meta(run_dir: Path) -> dict[str, str]:
    """The run's meta table (watch_exit_code, ended_by, on_stall, ...), read as the report reads
    the store."""
    from stalldoc.store.reader import open_reader
    with open_reader(run_dir) as conn:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def watch(tmp_path: Path, command: list[str], *options: str, env: dict[str, str] | None = None,
          timeout: float = 120, prefix: list[str] | None = None) -> Result:
    run_dir = tmp_path / "run"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    with subprocess.Popen([*(prefix or []), sys.executable, "-m", "stalldoc", "watch",
                           "--run-dir", str(run_dir), "--stall-timeout", STALL_TIMEOUT,
                           "--interval", "0.5", "--kill-grace", "3", *options, "--", *command],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=full_env, stdin=subprocess.DEVNULL) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stdout, stderr = end_watched(proc)
            raise AssertionError(f"the watch ran past {timeout} s; the end of its stderr "
                                 f"(CI shows only a part of long output):\n{stderr[-4000:]}"
                                 ) from None
    return Result(proc.returncode, stderr, run_dir, stdout)


def end_watched(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """A watch that outlived its test: SIGTERM to the relay, which ends the job with it (a Ray
    cluster left running would load every later test), then SIGKILL if it is still there.
    Returns what it wrote (stdout, stderr) when its pipes were read; else empty strings."""
    proc.terminate()
    try:
        stdout, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    return stdout or "", stderr or ""


def wait_in_file(path: Path, pattern: str, watcher: subprocess.Popen, timeout: float = 300
                 ) -> re.Match:
    """The first match of ``pattern`` in the file a watch writes its stderr to (a server's
    watch: a pipe nobody reads would fill and block it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text())
        if found:
            return found
        assert watcher.poll() is None, path.read_text()[-4000:]
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} never came: {path.read_text()[-4000:]}")


def start_watch(run_dir: Path, command: list[str], *options: str,
                env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen[str]:
    """``stalldoc watch`` started in the background, its output piped."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen([sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(run_dir),
                             "--stall-timeout", STALL_TIMEOUT, "--interval", "0.5",
                             "--kill-grace", "3", *options, "--", *command],
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                            **popen)


def sidecar_pid(relay_pid: int, timeout: float = 30) -> int:
    """The pid of the sidecar a relay started."""
    import time
    import psutil
    deadline = time.time() + timeout
    while time.time() < deadline:
        for child in psutil.Process(relay_pid).children():
            try:
                if "stalldoc.sidecar" in " ".join(child.cmdline()):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.05)
    raise AssertionError("no sidecar")


def wait_for_line(stream: Any, text: str, seen: list[str]) -> None:
    """Read ``stream`` line by line into ``seen`` until a line contains ``text``."""
    for line in stream:
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"{text!r} never came: {''.join(seen)[-2000:]}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def why_no_tmpfs() -> str:
    """Why a test cannot mount a small tmpfs in a private mount namespace ('' when it can)."""
    import shutil
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"cannot mount a tmpfs here: {probe.stderr.strip()}"


def watch_on_tmpfs(tmp_path: Path, size: str, job: str, *options: str,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``stalldoc watch OPTIONS -- sh -c JOB`` with its run directory on a tmpfs of ``size``
    (a private mount namespace); the job finds the mount in $RUN_FS and Python in $PY."""
    mount = tmp_path / "fs"
    mount.mkdir()
    watch_cmd = (f'mount -t tmpfs -o size={size} tmpfs "{mount}" && '
                 f'exec "{sys.executable}" -m stalldoc watch --run-dir "{mount}/run" '
                 f'{" ".join(options)} -- sh -c "$JOB"')
    return subprocess.run(["unshare", "-rm", "sh", "-c", watch_cmd], capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL,
                          env={**os.environ, "JOB": job, "RUN_FS": str(mount),
                               "PY": sys.executable, **(env or {})})


def stand_in_swift(tmp_path: Path) -> Path:
    """An executable named ``swift`` that prints one line and exits 0: for tests of what
    stalldoc reads from a swift command line, not of swift itself."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    swift = bindir / "swift"
    swift.write_text(f"#!{sys.executable}\nprint('swift ran')\n")
    swift.chmod(0o755)
    return swift


_DEMO_RUNS: dict[int, Path] = {}


def demo_run(ranks: int = 3) -> Path:
    """The run directory of the demo's job watched with the kill action armed (rank 1 hangs in
    its data loader for good, the stall is diagnosed and the job killed: watch exits 124), made
    once per test session and shared: copy it before changing anything in it. (``stalldoc
    demo`` itself lets its job recover and end: tests/demo/test_demo_screen.py.)"""
    if ranks not in _DEMO_RUNS:
        import tempfile
        from stalldoc.demo.run import demo_command
        run_dir = Path(tempfile.mkdtemp(prefix="stalldoc-demo-")) / "run"
        env = {k: v for k, v in os.environ.items() if k != "DEMO_HANG_SECONDS"}
        done = subprocess.run([sys.executable, "-m", "stalldoc", "watch", "--on-stall", "kill",
                               "--stall-timeout", "5", "--interval", "0.5", "--run-dir",
                               str(run_dir), "--", *demo_command(ranks)], capture_output=True,
                              text=True, timeout=180, stdin=subprocess.DEVNULL,
                              env={**env, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 124, done.stderr[-3000:]
        _DEMO_RUNS[ranks] = run_dir
    return _DEMO_RUNS[ranks]


def synthetic_tick(t: float, ranks: int, gpus: int, phase: str, seed: int = 0,
                   phases: tuple[Any, ...] = ()) -> Any:
    """One tick of a GRPO-like job as the probes would give it: ranks in ``phase`` with memory
    and CPU that vary from tick to tick, GPUs used by them, the node, and the probes' runs.
    ``phases``: the completed phases every rank's agent reports (its ring)."""
    import random
    from stalldoc.model.agent import AgentSnapshot
    from stalldoc.model.samples import GpuProcess, GpuSample, HostMemory, HostSample, ProbeRun
    from stalldoc.model.samples import Tick
    rng = random.Random(hash((t, seed)))
    host = {r: HostSample(t, r, 1000 + r, t / 2, (8 << 30) + rng.randrange(1 << 30),
                          40 + rng.randrange(8), rng.choice(("running", "sleeping")),
                          (200 << 30) - rng.randrange(1 << 34), rng.uniform(0, 100),
                          rng.randrange(3), rng.uniform(0, 50), rng.uniform(0, 1e6))
            for r in range(ranks)}
    agents = {r: AgentSnapshot(1000 + r, r, r % 8, ranks, 0, 0.0, t, int(t), t, None,
                               ("step", phase), "", len(phases), phases, ())
              for r in range(ranks)}
    gpu = tuple(GpuSample(t, g, f"GPU-{g}", "H100", (40 << 30) + rng.randrange(1 << 33), 80 << 30,
                          rng.randrange(101), rng.randrange(101), rng.uniform(0, 1e9),
                          rng.uniform(0, 1e9), rng.uniform(100, 700),
                          (GpuProcess(1000 + g, 30 << 30, g if g < ranks else None),),
                          rng.uniform(0, 100))
                for g in range(gpus))
    node = HostMemory(t, (200 << 30) - rng.randrange(1 << 34), 256 << 30, 0.0,
                      rng.uniform(0, 1e6), rng.uniform(0, 30), 64)
    probes = (ProbeRun("host", t, True, rng.uniform(0.001, 0.01)),
              ProbeRun("nvml", t, rng.random() > 0.01, rng.uniform(0.001, 0.02),
                       "" if rng.random() > 0.5 else "NVMLError_Unknown"))
    return Tick(t, host, node, gpu, agents, probes)


__all__ = ["SCENARIOS", "torchrun", "launcher", "watch", "pid_alive", "signal"]


def run_record(**fields: Any) -> Any:
    """A report's ``RunRecord`` built directly: ranks 0 and 1 on "node" from T0 = 1.7e9, killed
    by stalldoc (exit 137) at T0 + 19, the run ended at T0 + 20; ``fields`` replace its own."""
    from dataclasses import replace
    from stalldoc.report.records import (HostSummary, RankRecord, RunInfo, RunRecord,
                                         TimeSeries)
    t0 = 1_700_000_000.0
    info = RunInfo("r", ("train.py",), "node", t0, t0 + 20, 124, 5.0, True, 4,
                   watch_exit_code=124, ended_by="stalldoc", on_stall="kill")
    ranks = tuple(RankRecord(r, 100 + r, r, ("python",), t0, t0 + 19, 137, 9, "proc", "node")
                  for r in (0, 1))
    run = RunRecord("/run", "node", info, ranks, (), (), (), {}, HostSummary(), (), (), (), (),
                    TimeSeries())
    return replace(run, **fields)


# ----- jobs started without stalldoc, and `stalldoc attach` -----------------------------------
ATTACH_WINDOW = "3"
JOB_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGQUIT")
# The start of every attach test job: each caught signal leaves a file (the job must never get
# one from stalldoc), a heartbeat thread counts in beat-<rank> (its output goes on), and
# pid-<rank> says the rank reached its interesting part (``ready``).
JOB_PRELUDE = f"""\
import os, pathlib, signal, sys, threading, time
OUT = pathlib.Path(sys.argv[1])


def _caught(signum, frame):
    (OUT / f"signal-{{os.getpid()}}-{{signum}}").write_text("")
    if signum in (signal.SIGTERM, signal.SIGINT):   # their default: end (a launcher's stop)
        os._exit(128 + signum)


for _name in {JOB_SIGNALS!r}:
    signal.signal(getattr(signal, _name), _caught)


def _beat(rank):
    beats = 0
    while True:
        beats += 1
        (OUT / f"beat-{{rank}}").write_text(str(beats))
        time.sleep(0.2)


def ready(rank):
    threading.Thread(target=_beat, args=(rank,), daemon=True).start()
    (OUT / f"pid-{{rank}}").write_text(str(os.getpid()))
"""


@dataclass
class RunningJob:
    """A torchrun job started without stalldoc (``running_job``)."""

    launcher: subprocess.Popen[bytes]
    out: Path                  # pid-<rank>, beat-<rank>, signal-* files
    log: Path                  # torchrun's and the ranks' stdout and stderr
    ranks: dict[int, int]      # rank -> pid

    def signals(self) -> list[str]:
        return sorted(p.name for p in self.out.glob("signal-*"))

    def beats(self) -> dict[int, int]:
        return {r: int((self.out / f"beat-{r}").read_text() or 0) for r in self.ranks}

    def states(self) -> dict[int, str]:
        """rank -> its /proc state letter ('' once gone)."""
        out = {}
        for rank, pid in self.ranks.items():
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    out[rank] = fh.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                out[rank] = ""
        return out


@contextlib.contextmanager
def running_job(tmp_path: Path, body: str, nproc: int, name: str = "train.py",
                timeout: float = 120) -> Iterator[RunningJob]:
    """``torchrun --nproc-per-node nproc`` (gloo) of JOB_PRELUDE + ``body``, started without
    stalldoc in a session of its own, once every rank called ``ready``; killed with its whole
    session (SIGKILL) when the block ends."""
    import time
    script, out, log = tmp_path / name, tmp_path / "job-out", tmp_path / "job.log"
    script.write_text(JOB_PRELUDE + body)
    out.mkdir()
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(nproc),
             "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script),
             str(out)], stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + timeout
        while len(list(out.glob("pid-*"))) < nproc:
            if proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"job never got ready: {log.read_text()[-3000:]}")
            time.sleep(0.1)
        time.sleep(0.3)   # every pid file written to its end
        ranks = {int(p.name[4:]): int(p.read_text()) for p in out.glob("pid-*")}
        yield RunningJob(proc, out, log, ranks)
    finally:
        _kill_tree(proc)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a launcher and every process below it: torchrun starts each rank in a session
    of its own, so the launcher's process group is not enough."""
    import psutil
    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        below = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in below:
        with contextlib.suppress(psutil.Error):
            child.kill()
    proc.wait()


def attach(run_dir: Path, *args: str, timeout: float = 120,
           python: list[str] | None = None) -> Result:
    """``stalldoc attach --run-dir RUN_DIR --window ATTACH_WINDOW ARGS`` (``python``: the
    interpreter and its arguments that run the CLI instead of ``python -m stalldoc``)."""
    proc = subprocess.run([*(python or [sys.executable, "-m", "stalldoc"]), "attach",
                           "--run-dir", str(run_dir), "--window", ATTACH_WINDOW, *args],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return Result(proc.returncode, proc.stderr, run_dir, proc.stdout)


def why_no_schedstat() -> str:
    """Why the kernel's run-queue delay cannot be read here ('' when it can): a kernel without
    CONFIG_SCHED_INFO has no /proc/PID/schedstat, and stalldoc then sees CPU only."""
    try:
        with open("/proc/self/schedstat", encoding="ascii") as fh:
            int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return "this kernel keeps no run-queue delay (/proc/PID/schedstat)"
    return ""


def gpu_present() -> bool:
    """An NVIDIA GPU and its driver here (NVML answers and counts one)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:  # noqa: BLE001 - any failure: no usable GPU here
        return False


class RecordingLink:
    """The relay's end of the sidecar's link (``sidecar/link.py``), for tests of the watcher's
    parts: it keeps every message sent, and holds the wait statuses the relay reaped."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.on_line: Any = None
        self.ending = False
        self.interrupted_at: float | None = None
        self.reaped: dict[int, int] = {}
        self.watch_code: int | None = None
        self.ended_by = "job"
        self.dropped = 0

    def send(self, **message: Any) -> None:
        self.sent.append(message)

    def said(self) -> list[str]:
        return [str(m["say"]) for m in self.sent if "say" in m]


@contextlib.contextmanager
def watcher_parts(run_dir: Path, **options: Any) -> Iterator[Any]:
    """A sidecar's watcher, built as ``stalldoc watch`` builds it but on a ``RecordingLink``,
    its run started in ``run_dir``: its parts (roster, exit judge, diagnosis, publisher) are
    driven by the test, not by a tick loop. Closed at the end."""
    from stalldoc.run.options import WatchOptions
    from stalldoc.sidecar.watcher import Watcher
    run_dir.mkdir(parents=True, exist_ok=True)
    link = RecordingLink()
    watcher = Watcher(WatchOptions(("train.py",), run_dir, **options),
                      link)  # type: ignore[arg-type]   (a RelayLink in all it is read for)
    watcher.store.start_run(run_dir.name, ["train.py"], socket.gethostname(), time.time(),
                            watcher.opts.stall_timeout, watcher.opts.agent)
    try:
        yield watcher
    finally:
        for part in (watcher.exits, watcher.sampler, watcher.background, watcher.ray_job,
                     watcher.publisher):
            part.close()
        watcher.store.close()


def idle_host(t: float, rank: int, pid: int, cpu: float = 0.5) -> Any:
    """A rank's host sample at ``t``, asleep as in a collective (``cpu`` percent, no I/O)."""
    from stalldoc.model.samples import HostSample
    return HostSample(t, rank, pid, t * cpu / 100, 1 << 20, 1, "sleeping", 1 << 30, cpu, 0, None,
                      0.0)


RANKS_LAUNCHER = """
import os, subprocess, sys, time
if os.fork():
    os._exit(0)
print(os.getpid(), flush=True)
ranks = {}
for line in sys.stdin:
    word, rank = line.split()
    if word == "start":
        env = dict(os.environ, RANK=rank, LOCAL_RANK=rank, WORLD_SIZE="2")
        ranks[rank] = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); "
                                        "sys.exit(3)"], env=env, stdin=subprocess.PIPE)
        # Popen returns once the exec closed its pipe, before the kernel set the new program's
        # environment up (a window of microseconds, longer under load): the rank is started
        # once its environment reads
        while b"RANK=" not in open(f"/proc/{ranks[rank].pid}/environ", "rb").read():
            time.sleep(0.001)
        print(ranks[rank].pid, flush=True)
    elif word == "fail":
        ranks[rank].stdin.close()
        _, status = os.waitpid(ranks[rank].pid, 0)
        ranks[rank].returncode = 3
        print(status, flush=True)
"""


class RankLauncher:
    """A launcher of rank processes (RANK in their environment), told by the test what to do:
    ``start(rank)`` starts one and returns its pid; ``fail(rank)`` has it exit 3 and returns the
    raw wait status the launcher reaped. It runs orphaned (``pid``): a job is never below the
    sidecar, whose own tree the watcher leaves out of the job."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", RANKS_LAUNCHER], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     process_group=0)
        assert self.proc.stdout is not None
        self.pid = int(self.proc.stdout.readline())

    def _ask(self, word: str, rank: int) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{word} {rank}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def start(self, rank: int) -> int:
        return self._ask("start", rank)

    def fail(self, rank: int) -> int:
        return self._ask("fail", rank)

    def close(self) -> None:
        _kill_tree(self.proc)   # type: ignore[arg-type]


# ----- stacks as users quote them in public threads -----------------------------------------
_PYSPY_THREAD = re.compile(r'^Thread (?:(\d+) )?\((active|idle)\)(?:: )?\s*"?([^"]*)"?')
_PYSPY_FRAME = re.compile(r"^\s+(\S.*?) \((\S+):(\d+)\)\s*$")
_PY_FRAME = re.compile(r'File "([^"]+)", line (\d+)(,?) in (\S+)')


def quoted_threads(text: str, site: str = "/usr/lib/python3.10/site-packages"
                   ) -> tuple[Any, ...]:
    """The threads of a stack dump as a user quoted it (a fixture's text): py-spy's text
    dump (innermost first), a faulthandler dump (``line N in f``, innermost first) or a Python
    traceback (``line N, in f``, outermost first; its first chained block: the innermost
    exception), whatever prefix a launcher put before each line (``[rank0]:``). py-spy's text
    shortens a package's path to ``pkg/mod.py`` and a standard module's to ``mod.py``; its
    JSON, which stalldoc reads, gives full paths: they are put under ``site`` (and
    ``site``'s parent for the standard library), as an installed package's are."""
    from stalldoc.model.stacks import Frame, ThreadStack

    def full(path: str) -> str:
        if path.startswith("/"):
            return path
        return f"{site}/{path}" if "/" in path else f"{site.rsplit('/', 1)[0]}/{path}"

    threads: list[ThreadStack] = []
    frames: list[Frame] = []
    head: tuple[int, bool, str] = (0, False, "MainThread")
    traceback = False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if "The above exception" in line or "During handling of the above" in line:
            break
        if found := _PYSPY_THREAD.match(line):
            if frames:
                threads.append(ThreadStack(head[0], head[2], head[1], False, tuple(frames)))
            head, frames = (int(found.group(1) or 0), found.group(2) == "active",
                            found.group(3) or None), []
        elif found := _PY_FRAME.search(line):
            traceback = traceback or found.group(3) == ","
            frames.append(Frame(found.group(4), full(found.group(1)), int(found.group(2))))
        elif found := _PYSPY_FRAME.match(line):
            frames.append(Frame(found.group(1), full(found.group(2)), int(found.group(3))))
    if frames:
        ordered = tuple(reversed(frames)) if traceback else tuple(frames)
        threads.append(ThreadStack(head[0], head[2], head[1], False, ordered))
    return tuple(threads)


def old_release(target: Path, *specs: str) -> dict[str, str]:
    """Real releases of pure-Python packages (``ms-swift==3.4.1``, ``trl==0.16.1``) installed
    from the package index, without their dependencies, into ``target`` (``pip --target``: their
    metadata and console scripts as pip writes them). Returns the environment that puts them
    first: their ``bin`` on PATH, ``target`` on PYTHONPATH."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--disable-pip-version-check", "--target", str(target), *specs],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"pip could not install {specs}: {done.stderr[-2000:]}"
    return {"PATH": f"{target / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(target)}


def kind_read(at: float, entries: dict[str, int], seconds: dict[str, float]) -> Any:
    """A read of a rank's counts by kind of phase (``model.agent.PhaseKinds``)."""
    from stalldoc.agent.statefile import PHASE_KINDS
    from stalldoc.model.agent import PhaseKinds
    return PhaseKinds(at, tuple((k, entries.get(k, 0)) for k in PHASE_KINDS),
                      tuple((k, seconds.get(k, 0.0)) for k in PHASE_KINDS))


def grpo_kind_reads(cycles: list[dict[str, float]], steps_per_cycle: int = 1) -> list[Any]:
    """Reads at each cycle's start of a TRL-like rank: each cycle a rollout (its own seconds
    in the dict, by kind; "idle": in no phase; "weight_sync_calls": how often the sync was
    entered, once by default) and ``steps_per_cycle`` steps (the rollout runs in the first)."""
    from stalldoc.agent.statefile import PHASE_KINDS
    at, out = 100.0, []
    entries, seconds = {k: 0 for k in PHASE_KINDS}, {k: 0.0 for k in PHASE_KINDS}
    for cycle in cycles:
        entries["rollout"] += 1
        entries["step"] += 1
        out.append(kind_read(at, entries, seconds))
        entries["step"] += steps_per_cycle - 1
        for kind, spent in cycle.items():
            if kind in seconds:
                seconds[kind] += spent
                entries[kind] += int(cycle.get(f"{kind}_calls", 1)) \
                    if kind not in ("step", "rollout") else 0
            at += spent if not kind.endswith("_calls") else 0
    out.append(kind_read(at, {**entries, "rollout": entries["rollout"] + 1,
                              "step": entries["step"] + 1}, seconds))
    return out


def assert_steps_measured(report: dict[str, Any], rank: int = 0) -> dict[str, float]:
    """A healthy GRPO run without vLLM: where its steps went was measured over its rollouts
    (the first left out), no weight sync among it, the kinds summing to 1; the shares."""
    [run] = [r for r in report["step_shares"] if r["rank"] == rank and r["over"] == "run"]
    shares = run["shares"]
    assert run["cycle"] == "rollout" and run["cycles"] >= 1, run
    assert shares["weight_sync"] == 0.0 and shares["train"] > 0, run
    assert abs(sum(shares.values()) - 1.0) < 0.01, run
    return shares

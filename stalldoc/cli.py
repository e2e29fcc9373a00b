"""The ``stalldoc`` command line."""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import click

from stalldoc import __version__
from stalldoc.errors import RunDirError, StalldocError

EXIT_CODES_HELP = """\b
Exit codes of watch:
  the job's own   the command's exit status (128+N: killed by signal N)
  124             --on-stall kill ended the job after storing the diagnosis
  125             stalldoc could not start watching (bad or unsafe run
                  directory, metrics port in use, or --strict and the
                  launch checks found a problem); job not launched
  126 / 127       the command is not executable / not found
  2               usage error
"""


def fail(error: StalldocError) -> None:
    click.echo(f"stalldoc: {error.message}", err=True)
    sys.exit(error.exit_code)


MAX_SECONDS = 30 * 86400.0   # timeouts: past this, a sleep or a deadline could overflow
MAX_INTERVAL = 3600.0
MAX_KILL_GRACE = 3600.0
MAX_GPUS = 1024               # per node
MAX_DATASET_ROWS = 10**15


def _finite(_ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Reject NaN and infinity: NaN passes every range check (each comparison is false)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", param=param)
    return value


def _run_dir(_ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """An empty --run-dir is a mistake (an unset variable), not the current directory."""
    if value is None:
        return None
    if not value:
        raise click.BadParameter("must not be empty", param=param)
    return Path(value)


class CommandGroup(click.Group):
    """A group whose command list shows each command's whole first sentence, wrapped to the
    terminal, instead of click's cut-off ``...``."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="stalldoc")
def main() -> None:
    """Why has my distributed training job stopped making progress?"""


@main.command(context_settings={"ignore_unknown_options": True}, epilog=EXIT_CODES_HELP)
@click.option("--run-dir", type=click.Path(), default=None, callback=_run_dir,
              help="Where to store the run (default ./stalldoc-runs/<UTC time>-<id>): a new or "
                   "empty directory, on a path no other user can change (see docs/your-job.md). A job "
                   "on several nodes: give every node's watcher the same path on a shared "
                   "filesystem; each writes RUN_DIR/node-<rank> and reads the others "
                   "(docs/multi-node.md).")
@click.option("--stall-timeout", type=click.FloatRange(0.5, MAX_SECONDS), default=45.0,
              show_default=True,
              callback=_finite,
              help="Seconds in which no rank shows any work before a stall (the floor: phases "
                   "seen to take long raise it).")
@click.option("--busy-timeout", type=click.FloatRange(1, MAX_SECONDS), default=None,
              callback=_finite,
              help="Seconds a rank may burn CPU in one unchanging stack with nothing else "
                   "moving before a possible-livelock warning (SD109) [default: 600, at least "
                   "2x --stall-timeout].")
@click.option("--interval", type=click.FloatRange(0.05, MAX_INTERVAL), default=1.0,
              show_default=True,
              callback=_finite,
              help="Seconds between two samples of every rank (CPU, memory, I/O, agent state, "
                   "GPU).")
@click.option("--on-stall", type=click.Choice(["observe", "kill"]), default="observe",
              show_default=True, help="kill: end the job once the diagnosis is stored (exit 124).")
@click.option("--kill-grace", type=click.FloatRange(0, MAX_KILL_GRACE), default=10.0,
              show_default=True, callback=_finite,
              help="Seconds between SIGTERM and SIGKILL when ending the job tree.")
@click.option("--no-agent", is_flag=True, help="Do not inject the in-process agent.")
@click.option("--no-gpu", is_flag=True, help="Do not read GPU telemetry through NVML.")
@click.option("--no-flight-recorder", is_flag=True,
              help="Do not turn on PyTorch's Flight Recorder in the ranks (TORCH_FR_BUFFER_SIZE) "
                   "nor dump it into the run directory on a stall.")
@click.option("--strict", is_flag=True,
              help="Do not launch when the launch checks find an error or a warning (exit 125).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port (0: any free port).")
@click.option("--metrics-addr", default="127.0.0.1", show_default=True,
              help="Address for --metrics-port; another than loopback only when asked.")
@click.option("--end-detached", is_flag=True,
              help="At the end, also end processes the job left behind that detached themselves "
                   "(a session of their own, not a rank's); by default they are left running.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def watch(run_dir: Path | None, stall_timeout: float, busy_timeout: float | None, interval: float,
          on_stall: str, kill_grace: float, no_agent: bool, no_gpu: bool, strict: bool,
          metrics_port: int | None, metrics_addr: str, end_detached: bool,
          no_flight_recorder: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND (after --), watch every rank, diagnose stalls.

    Example: stalldoc watch --stall-timeout 120 -- torchrun --nproc_per_node 8 train.py
    """
    from stalldoc.run.options import DEFAULT_BUSY_TIMEOUT, WatchOptions
    from stalldoc.relay.relay import Relay

    busy = busy_timeout if busy_timeout is not None else max(DEFAULT_BUSY_TIMEOUT,
                                                               2 * stall_timeout)
    options = WatchOptions(tuple(command), run_dir, stall_timeout, interval, on_stall,
                           not no_agent, kill_grace, not no_gpu, strict, metrics_port,
                           metrics_addr, busy, end_detached, not no_flight_recorder)
    try:
        code = Relay(options).run()
    except StalldocError as error:
        fail(error)
    sys.exit(code)


ATTACH_EXIT_HELP = """\b
Exit codes of attach:
  0     observed: the verdict printed and the run stored, stalled or not
        (also when --follow is ended by Ctrl-C or SIGTERM; the job runs on)
  1     nothing to attach to: no such pid, one that ended, init, a shell or
        stalldoc itself, another user's process, no rank (RANK) in its
        tree, or a --log file that cannot be read
  125   the run directory cannot be used (unsafe, not empty, cannot be
        created)
  2     usage error (no PID, a bad option)
"""


@main.command(epilog=ATTACH_EXIT_HELP)
@click.argument("pids", metavar="PID...", nargs=-1, required=True,
                type=click.IntRange(1, 2**22))
@click.option("--run-dir", type=click.Path(), default=None, callback=_run_dir,
              help="Where to store the run (default ./stalldoc-runs/<UTC time>-<id>), as watch.")
@click.option("--window", type=click.FloatRange(1, 3600), default=5.0, show_default=True,
              callback=_finite,
              help="Seconds the ranks are observed before the verdict: stalled when no rank "
                   "showed work (CPU in a working stack, I/O, busy children) in them.")
@click.option("--stall-timeout", type=click.FloatRange(0.5, MAX_SECONDS), default=None,
              callback=_finite,
              help="With --follow: seconds without work before a later stall, as in watch "
                   "[default: 45].")
@click.option("--interval", type=click.FloatRange(0.1, 60), default=0.5, show_default=True,
              callback=_finite, help="Seconds between two samples of every rank.")
@click.option("--log", "log", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The job's log file: its last 256 KB are read (and what follows, with "
                   "--follow) for the log rules (NCCL, c10d, vLLM errors).")
@click.option("--follow", is_flag=True,
              help="After the verdict, keep watching like watch (without the agent) until the "
                   "job ends; Ctrl-C detaches.")
@click.option("--no-gpu", is_flag=True, help="Do not read GPU telemetry through NVML.")
def attach(pids: tuple[int, ...], run_dir: Path | None, window: float,
           stall_timeout: float | None, interval: float, log: Path | None, follow: bool,
           no_gpu: bool) -> None:
    """Diagnose a job already running: from its launcher's pid or any rank's.

    Finds every rank of the job on this machine (RANK in its environment), observes them for
    --window seconds, takes their stacks with py-spy (in parallel; each rank is paused for the
    dump only), runs the rules that need no agent, prints the diagnosis and stores a run that
    `stalldoc report` reads. The job is never signalled.

    Example: stalldoc attach $(pgrep -f torchrun)
    """
    from stalldoc.attach.session import AttachOptions, attach as run_attach

    if stall_timeout is not None and not follow:
        raise click.UsageError("--stall-timeout applies with --follow (the first look lasts "
                               "--window seconds)")
    options = AttachOptions(pids, run_dir, window, stall_timeout or 45.0, interval, log, follow,
                            not no_gpu)
    try:
        code = run_attach(options)
    except StalldocError as error:
        fail(error)
    sys.exit(code)


def _formats() -> list[str]:
    from stalldoc.report.formats import FORMATS
    return list(FORMATS)


@main.command()
@click.argument("run_dirs", metavar="RUN_DIR...", nargs=-1, required=True,
                type=click.Path(path_type=Path, readable=False))   # the reader says why, once
@click.option("--format", "fmt", type=click.Choice(_formats()), default="text",
              show_default=True,
              help="text for a terminal, json for tools, markdown to paste into a bug report, "
                   "html (one self-contained page), perfetto (a trace for ui.perfetto.dev).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the report to this file instead of standard output.")
def report(run_dirs: tuple[Path, ...], fmt: str, output: Path | None) -> None:
    """The post-mortem of RUN_DIR: run, stalls, findings with evidence and fixes, stacks, phases.

    Several RUN_DIRs (the nodes of one job), or one directory holding several nodes' runs, are
    merged into one report: global ranks, node names, one wall-clock axis.

    Exit 0, or 1 when a RUN_DIR is not a run directory this version can read or the output file
    cannot be written.
    """
    from stalldoc.report.formats import reporter
    from stalldoc.report.read import read_report

    try:
        text = reporter(fmt).render(read_report(run_dirs))
    except StalldocError as error:
        fail(error)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, ArithmeticError) as exc:
        # values of the wrong type in a damaged database, found while rendering them (a time
        # past what the platform's clock can say: OverflowError)
        fail(RunDirError(f"{', '.join(map(str, run_dirs))}: damaged run database "
                         f"({type(exc).__name__}: {str(exc)[:200]})"))
    _write(text, output)


LOGS_EXIT_HELP = """\b
Exit codes of logs:
  0     read: the report printed (or written), whatever it found
  1     a FILE is no log it can read (missing, a directory, unreadable,
        a binary, not UTF-8 or UTF-16 text, a line over 1 MiB, a broken
        gzip), every FILE is empty, or the --output file cannot be written
  125   the --run-dir cannot be used (unsafe, not empty, cannot be created)
  2     usage error
"""


@main.command(epilog=LOGS_EXIT_HELP)
@click.argument("files", metavar="FILE...", nargs=-1, required=True,
                type=click.Path(path_type=Path))   # the reader says why a file cannot be read
@click.option("--format", "fmt", type=click.Choice(_formats()), default="text",
              show_default=True, help="Any format of stalldoc report (text, json, markdown, "
                                      "html, perfetto).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the report to this file instead of standard output.")
@click.option("--run-dir", type=click.Path(), default=None, callback=_run_dir,
              help="Keep the findings as a run here, for stalldoc report (default: not kept).")
def logs(files: tuple[Path, ...], fmt: str, output: Path | None, run_dir: Path | None) -> None:
    """Read the logs of a job nobody watched: the findings of stalldoc's log rules, with fixes.

    FILE: one log per rank (its rank read from a name such as rank3.log, or from torchrun's
    --log-dir layout), or a launcher's merged log whose lines carry [rankN]: or [default0]:
    prefixes; plain or gzip. The lines are put on one clock by their time stamps and read
    as watch reads a live job's output; what was read (files, lines, ranks, times) is said on
    standard error.

    Example: stalldoc logs train.log    or    stalldoc logs logs/rank*.log --format markdown
    """
    from stalldoc.logs.session import LogsOptions, read_logs

    try:
        text = read_logs(LogsOptions(files, fmt, run_dir))
    except StalldocError as error:
        fail(error)
    _write(text, output)


def _write(text: str, output: Path | None) -> None:
    """``text`` on standard output, or in ``output``."""
    if output is None:
        click.echo(text)
        return
    try:
        output.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        fail(RunDirError(f"cannot write {output}: {exc.strerror or exc}"))


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--gpus", type=click.IntRange(1, MAX_GPUS), default=None,
              help="GPUs per node, when NVML cannot say (no driver here).")
@click.option("--gpu-memory", default=None, help="Memory per GPU (e.g. 80G), when NVML cannot say.")
@click.option("--dataset-size", type=click.IntRange(1, MAX_DATASET_ROWS), default=None,
              help="Rows of the training dataset, when --dataset is not a local file.")
@click.option("--time-budget", type=click.FloatRange(min=0.1, max=3600), default=20.0,
              show_default=True, callback=_finite,
              help="Seconds for counting the dataset, reading the model and running the rules; "
                   "what does not finish in them is named as skipped.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True,
              help="text: findings, the GRPO plan and what was not checked; json: the same for "
                   "tools.")
@click.option("--strict", is_flag=True, help="Warnings fail the check too.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def check(gpus: int | None, gpu_memory: str | None, dataset_size: int | None, time_budget: float,
          fmt: str, strict: bool, command: tuple[str, ...]) -> None:
    """Check COMMAND (after --) before running it: batch arithmetic, GPUs, vLLM, offload.

    Example: stalldoc check --gpus 8 -- swift rlhf --rlhf_type grpo ...

    Exit 0 when nothing is an error, 1 when something is (--strict: or a warning), 2 for a
    usage error or bad input (a number swift would refuse, a config file that cannot be read),
    said in one line.
    """
    from stalldoc.check.preflight import failed, finding_dict, launch_document, parse_size, run_check
    from stalldoc.check.text import render_check

    try:
        memory = parse_size(gpu_memory) if gpu_memory is not None else None
        checks = run_check(list(command), gpus, memory, dataset_size, time_budget)
    except StalldocError as error:
        fail(error)
    if fmt == "json":
        click.echo(json.dumps({"findings": [finding_dict(f) for f in checks.findings],
                               **launch_document(checks)}, indent=2))
    else:
        click.echo(render_check(checks))
    sys.exit(1 if failed(checks.findings, strict) else 0)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--run-dir", type=click.Path(), default=None, callback=_run_dir,
              help="The --run-dir you will give watch (default: a new one below ./stalldoc-runs).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="The --metrics-port you will give watch: is it free?")
@click.option("--metrics-addr", default="127.0.0.1", show_default=True,
              help="The --metrics-addr you will give watch.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="text: one line per check; json: the same for tools.")
@click.option("--gpu", is_flag=True,
              help="Also run short jobs on the GPU under watch (about 3 minutes): CUDA markers, "
                   "NVML memory, SD203, SD201, SD202, an NCCL Flight Recorder dump.")
@click.argument("command", nargs=-1, required=False, type=click.UNPROCESSED)
def doctor(run_dir: Path | None, metrics_port: int | None, metrics_addr: str, fmt: str,
           gpu: bool, command: tuple[str, ...]) -> None:
    """Will watch see anything here? Checks py-spy, the agent, NVML, CUDA, the run directory.

    Give the command you will watch after -- : its python is the one asked (the agent loads
    in it, py-spy reads it, its torch sees CUDA). Nothing of the job runs.

    Example: stalldoc doctor -- torchrun --nproc_per_node 8 train.py

    Each check says ok, warning (it works; something to know), problem (with its fix) or
    skipped (nothing to check here). Exit 0 when no check found a problem, 1 when one did, 2
    for a usage error.
    """
    from stalldoc.doctor.run import DoctorOptions, doctor as run_doctor

    sys.exit(run_doctor(DoctorOptions(command, run_dir, metrics_port, metrics_addr, fmt, gpu)))


@main.command("rules")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True,
              help="text: a table (summaries wrap on a terminal, one line per rule in a pipe); "
                   "json: a list of {code, name, severity, trigger, summary}.")
def rules_command(fmt: str) -> None:
    """List the rules: code, severity, when it runs, name and summary."""
    import shutil

    from stalldoc.rules import RULES
    from stalldoc.rules.listing import render_table, rule_rows

    rows = rule_rows(RULES)
    if fmt == "json":
        click.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    click.echo(render_table(rows, width))


@main.command()
@click.argument("code")
def explain(code: str) -> None:
    """Print rule CODE in full: what it does, why it is bad, evidence, fix, references.

    Exit 0, or 2 for a code no rule has.
    """
    from stalldoc.rules import by_code

    rule = by_code(code)
    if rule is None:
        click.echo(f"stalldoc: no rule has code {code!r}; `stalldoc rules` lists them", err=True)
        sys.exit(2)
    from stalldoc.rules.listing import when

    click.echo(f"{rule.code} {rule.name} ({rule.severity.value}; runs {when(rule.trigger)})\n")
    click.echo(rule.doc().replace("``", "`"))     # as findings quote code


@main.command()
@click.option("--ranks", type=click.IntRange(2, 8), default=3, show_default=True,
              help="Processes of the demo job (rank 1 is the one that blocks).")
@click.option("--stall-timeout", type=click.FloatRange(1, MAX_SECONDS), default=5.0,
              show_default=True, callback=_finite,
              help="Seconds without progress before the stall is declared (as in watch).")
@click.option("--run-dir", type=click.Path(), default=None, callback=_run_dir,
              help="Where to store the demo's run (default ./stalldoc-runs/<UTC time>-<id>).")
def demo(ranks: int, stall_timeout: float, run_dir: Path | None) -> None:
    """Watch a small torchrun (gloo) job in which one rank blocks in its data loader past the
    stall timeout, then goes on (needs torch: pip install '.[demo]')."""
    from stalldoc.demo.run import run_demo

    try:
        sys.exit(run_demo(ranks, stall_timeout, run_dir))
    except StalldocError as error:
        fail(error)


if __name__ == "__main__":
    main()

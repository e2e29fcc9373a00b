"""Which attempt of the job runs, from the processes that take each rank's number in turn, and
from torchrun's own count of restarts in a worker's environment (real processes for that)."""
from __future__ import annotations

import os
import subprocess
import sys

from stalldoc.model.ranks import RankProcess
from stalldoc.sidecar.attempts import Attempts, restart_count


def rank(number: int, pid: int, from_env: bool = True) -> RankProcess:
    return RankProcess(number, pid, number, ("python", "train.py"), from_env)


def silent(pid: int) -> int | None:
    return None


def test_a_rank_number_taken_by_a_new_process_after_the_old_one_ended_is_the_next_attempt():
    attempts = Attempts(silent)
    assert attempts.started(rank(0, 10), None, False) == 1
    assert attempts.started(rank(1, 11), None, False) == 1
    # torchrun restarts both ranks: the job is in its second attempt, not its third
    assert attempts.started(rank(1, 21), rank(1, 11), True) == 2
    assert attempts.started(rank(0, 20), rank(0, 10), True) == 2
    assert attempts.started(rank(1, 31), rank(1, 21), True) == 3


def test_a_replaced_guess_or_a_process_that_lives_on_is_no_restart():
    attempts = Attempts(silent)
    # the single-process guess (mp.spawn's parent) gives way to the rank that claims 0
    assert attempts.started(rank(0, 10), rank(0, 5, from_env=False), True) == 1
    # a number claimed by another process while its holder still lives
    assert attempts.started(rank(1, 12), rank(1, 11), False) == 1
    # the same process seen again
    assert attempts.started(rank(1, 12), rank(1, 12), True) == 1


def test_torchruns_count_of_restarts_is_the_attempt_of_a_rank_it_starts():
    # a rank first seen in torchrun's third attempt (a scale-up): attempt 3, though it took
    # its number from nobody
    attempts = Attempts({40: 2}.get)
    assert attempts.started(rank(0, 10), None, False) == 1
    assert attempts.started(rank(2, 40), None, False) == 3


def _sleeper(env: dict[str, str]) -> subprocess.Popen:
    """A process that has exec'd (its environment is its own, not its parent's) and sleeps."""
    job = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); "
                            "import time; time.sleep(30)"], env=env, stdout=subprocess.PIPE,
                           text=True)
    assert job.stdout is not None and job.stdout.readline() == "up\n"
    return job


def test_the_restart_count_is_read_from_a_real_processs_environment():
    plain = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RESTART_COUNT"}
    for env, count in (({**plain, "TORCHELASTIC_RESTART_COUNT": "1"}, 1), (plain, None)):
        with _sleeper(env) as job:
            try:
                assert restart_count(job.pid) == count
            finally:
                job.kill()
    assert restart_count(2 ** 22 + 7) is None   # gone

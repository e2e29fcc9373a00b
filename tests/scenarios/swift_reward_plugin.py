"""A swift reward plugin (``--external_plugins``): rewards completions by length, and on rank
STUCK_RANK (a run of one process, which has no RANK, is rank 0), at the STUCK_CALL-th call, waits
for an answer that never comes (a reward server without a timeout)."""
import os
import threading

from swift.rewards import ORM, orms

CALLS = {"n": 0}


def wait_for_reward_service() -> None:
    threading.Event().wait()


class LengthReward(ORM):
    def __call__(self, completions, **kwargs):
        CALLS["n"] += 1
        if (os.environ.get("RANK", "0") == os.environ.get("STUCK_RANK")
                and CALLS["n"] >= int(os.environ.get("STUCK_CALL", "2"))):
            wait_for_reward_service()
        return [min(len(c), 32) / 32.0 for c in completions]


orms["length_reward"] = LengthReward

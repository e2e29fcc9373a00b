"""A one-process labelling job without torch, as preference-data and reward-labelling scripts
are: it sends a dataset to an LLM judge in batches, each batch waiting for its API quota first
(little CPU, most of the time asleep in the limiter), and logs a line per batch.

argv: BATCHES [REFILL_AT]. With REFILL_AT, the quota is refilled after that many batches, and
the refill takes the limiter's lock that the batch already holds (a ``threading.Lock``, not
reentrant): the job hangs there, silent, for good."""
import random
import sys
import threading
import time

PACE = 0.6   # seconds a batch waits for the judge API's quota


class Quota:
    def __init__(self, refill_at: int) -> None:
        self.lock = threading.Lock()
        self.used, self.refill_at = 0, refill_at

    def take(self) -> None:
        with self.lock:
            time.sleep(PACE)
            self.used += 1
            if self.used == self.refill_at:
                self.refill()

    def refill(self) -> None:
        with self.lock:
            self.used = 0


def judge(pairs: list[tuple[str, str]]) -> list[int]:
    """Which answer of each pair the judge prefers (the longer, as judges tend to)."""
    return [0 if len(a) >= len(b) else 1 for a, b in pairs]


def main() -> None:
    batches = int(sys.argv[1])
    quota = Quota(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    rng = random.Random(0)
    for batch in range(batches):
        pairs = [("x" * rng.randrange(1, 80), "y" * rng.randrange(1, 80)) for _ in range(16)]
        quota.take()
        first = judge(pairs).count(0)
        print(f"batch {batch}/{batches}: judge preferred the first answer in {first} of "
              f"{len(pairs)}", flush=True)


if __name__ == "__main__":
    main()

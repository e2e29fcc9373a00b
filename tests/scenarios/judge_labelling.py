"""A one-process labelling job without torch, as preference-data and reward-labelling scripts
are: it sends a dataset to an LLM judge in batches, each batch waiting for its API quota first
(little CPU, most of the time asleep in the limiter), and logs a line per batch.

argv: BATCHES [REFILL_AT]. With REFILL_AT, the quota is refilled after that many batches, and
the refill takes the limiter's lock that the batch already holds (a ``threading.Lock``, not
reentrant): the job hangs there, silent, for good.

HEALTH=1: the job also says it is alive, as long-running jobs do, all of it on side threads that
go on while the main thread hangs: a metrics endpoint (``http.server``) that a scraper thread
asks every half second, each request in its access log; a heartbeat line every second with the
elapsed time and the last batch done (``heartbeat: alive, elapsed 0:00:07, last batch 5/100``);
and an INFO line of the quota's state. None of it is progress."""
import datetime
import http.server
import os
import random
import sys
import threading
import time
import urllib.request

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


class Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:   # noqa: N802 - http.server's name
        body = f"labelled_batches {DONE[0]}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(body)


DONE = [0]


def say_alive(batches: int, quota: "Quota") -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"

    def scrape() -> None:
        while True:
            urllib.request.urlopen(url, timeout=5).read()
            time.sleep(0.5)

    def beat() -> None:
        started = time.monotonic()
        while True:
            time.sleep(1.0)
            elapsed = datetime.timedelta(seconds=int(time.monotonic() - started))
            print(f"heartbeat: alive, elapsed {elapsed}, last batch {DONE[0]}/{batches}",
                  flush=True)
            print(f"INFO quota: {quota.used} used of the window, next refill at "
                  f"{quota.refill_at}", file=sys.stderr, flush=True)

    for target in (scrape, beat):
        threading.Thread(target=target, daemon=True).start()


def main() -> None:
    batches = int(sys.argv[1])
    quota = Quota(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    rng = random.Random(0)
    if os.environ.get("HEALTH") == "1":
        say_alive(batches, quota)
    for batch in range(batches):
        pairs = [("x" * rng.randrange(1, 80), "y" * rng.randrange(1, 80)) for _ in range(16)]
        quota.take()
        first = judge(pairs).count(0)
        print(f"batch {batch}/{batches}: judge preferred the first answer in {first} of "
              f"{len(pairs)}", flush=True)
        DONE[0] = batch


if __name__ == "__main__":
    main()

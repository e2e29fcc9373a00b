"""A job that prints secrets on stdout, as careless jobs do: its arguments (``--hf_token``), a URL
with credentials, ``api_key=``, a bearer JWT, one line of each kind of ``tests/secret_kinds.py``
(webhooks, cloud and service keys), a private key line by line with a pause between lines (so
its lines reach stalldoc in separate chunks of output), the environment's ``STRIPE_API_KEY`` and
the rollout-server line SD507 turns into a finding with credentials in it. Usage:
``leaky_job.py RUN_DIR [args...]``.

It then waits (60 s at most) until the watcher has stored that finding, so that the test does not
depend on how soon the sidecar's next tick comes, and exits 0. Nothing goes to stderr."""
import os
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from secret_kinds import KINDS, PEM  # noqa: E402

URL_PASSWORD = "Pa55w0rd-URL-7f3a"
API_KEY = "0123456789abcdef0123456789abcdefAPIKEY"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0cmFpbmVyLTQyIn0.c2lnbmF0dXJlLUpXVC1zZWNyZXQ"
ROLLOUT_PASSWORD = "RolloutPw-9c1e"

LINES = [
    f"connecting to http://trainer:{URL_PASSWORD}@10.0.0.5:8000/v1/models",
    f"wandb: api_key={API_KEY} logged in",
    f"Authorization: Bearer {JWT}",
    "Exception: Servers not reachable after 240.0s "
    f"(http://admin:{ROLLOUT_PASSWORD}@10.0.0.5:8000)",
]


def finding_stored(run_dir: str) -> bool:
    try:
        conn = sqlite3.connect(f"file:{run_dir}/run.db?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        return conn.execute("SELECT 1 FROM findings WHERE code = 'SD507'").fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def main() -> None:
    token = sys.argv[sys.argv.index("--hf_token") + 1]
    print(f"args: Namespace(hf_token='{token}', max_new_tokens=512)", flush=True)
    for line in LINES:
        print(line, flush=True)
    for kind in KINDS:
        print(kind.line, flush=True)
    print("deploy key:", flush=True)
    for line in PEM:           # one write, and one chunk of output, per line
        print(line, flush=True)
        time.sleep(0.05)
    print(f"billing configured with {os.environ.get('STRIPE_API_KEY', '')}", flush=True)
    deadline = time.time() + 60
    while not finding_stored(sys.argv[1]) and time.time() < deadline:
        time.sleep(0.2)
    print("done", flush=True)


if __name__ == "__main__":
    main()

"""A gevent-monkey-patched job, as reward servers and crawlers built on gevent run: ``monkey.
patch_all()`` first, a TCP server in a greenlet, WORKERS greenlets (default 16) that each do
ROUNDS socket round trips with it (default 20), one subprocess (``python -c``) as a reward
sandbox runs, then ``sys.exit(CODE)`` (default 3): a run that ends otherwise (139: SIGSEGV) did
not end as the job meant."""
from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402
from gevent.server import StreamServer  # noqa: E402
from gevent.socket import create_connection  # noqa: E402

WORKERS = int(os.environ.get("WORKERS", "16"))
ROUNDS = int(os.environ.get("ROUNDS", "20"))
CODE = int(os.environ.get("CODE", "3"))


def echo(sock, _address) -> None:
    with sock:
        while data := sock.recv(64):
            sock.sendall(data.upper())


def client(port: int, worker: int) -> int:
    with create_connection(("127.0.0.1", port)) as conn:
        for n in range(ROUNDS):
            conn.sendall(f"reward {worker} {n}".encode())
            assert conn.recv(64).startswith(b"REWARD")
    return worker


def main() -> None:
    server = StreamServer(("127.0.0.1", 0), echo)
    server.start()
    jobs = [gevent.spawn(client, server.server_port, w) for w in range(WORKERS)]
    gevent.joinall(jobs, raise_error=True)
    out = subprocess.run([sys.executable, "-c", "print(sum(range(10)))"], capture_output=True,
                         text=True, check=True)
    server.stop()
    print(f"{len(jobs)} clients done, sandbox said {out.stdout.strip()}", flush=True)
    sys.exit(CODE)


if __name__ == "__main__":
    main()

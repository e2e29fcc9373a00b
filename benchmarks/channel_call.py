"""Agent cost per channel call (a weight-sync / rollout client method: phase, detail with the
method and server, state file writes) and per vLLM sleep / wake_up record, as differences
against the same empty method unwrapped in one agent-injected process. The calls they wrap
last milliseconds to minutes (an HTTP request, an NCCL broadcast), so a few microseconds is
the target; the ratio to a local HTTP round trip measured in the same run gives the scale.

    python benchmarks/channel_call.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stalldoc.run.inject import agent_environment  # noqa: E402

MICRO = textwrap.dedent("""
    import http.server, threading, time, urllib.request
    from stalldoc.agent import channels, runtime, statefile
    assert runtime.current() is not None, "agent not running"

    class Client:
        base_url = "http://user:pw@10.0.0.5:8000"
        def update_named_param(self, name, weights):
            return None
        def sleep(self, level=1):
            return None

    client = Client()
    raw = Client.update_named_param
    wrapped = channels.channel(channels.trl_server)(raw, "weight_sync")
    asleep = channels.sleep_tracked(Client.sleep, False)
    agent = runtime.current()

    def best(call, n):
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            times.append((time.perf_counter() - t0) / n)
        return min(times)

    def nested():
        agent.phase_enter("weight_sync")
        wrapped(client, "w", None)
        agent.phase_exit("weight_sync")

    class Quiet(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/health"
    print(best(lambda: raw(client, "w", None), 100000),
          best(lambda: wrapped(client, "w", None), 50000),
          best(lambda: agent.phase_enter("weight_sync") or agent.phase_exit("weight_sync"), 50000),
          best(nested, 50000), best(lambda: asleep(client), 50000),
          best(lambda: urllib.request.urlopen(url).read(), 200))
""")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = agent_environment(Path(tmp), {**os.environ}, os.getpid())
        out = subprocess.run([sys.executable, "-c", MICRO], env=env, capture_output=True,
                             text=True, check=True)
    raw, wrapped, phase, nested, sleep, http = (float(v) for v in out.stdout.split())
    call = wrapped - raw
    print(f"channel call: {call * 1e6:.2f} us over the bare method "
          f"(a plain phase enter + exit: {phase * 1e6:.2f} us)")
    print(f"inner call of the same phase (detail swapped): {(nested - phase) * 1e6:.2f} us")
    print(f"sleep / wake_up record: {sleep * 1e6:.2f} us")
    print(f"ratio to a local HTTP round trip ({http * 1e6:.0f} us): {call / http:.4f}")


if __name__ == "__main__":
    main()

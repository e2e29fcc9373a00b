"""Put on PYTHONPATH of a `stalldoc watch` process to give its watcher one scripted GPU that the
watched job holds: the `pynvml` functions are replaced in the sidecar alone, nothing above them.
The GPU's processes are the job's (every process whose environment has ``FAKE_GPU_HOLDER=1``,
the watch's own two left out), its utilisation ``FAKE_GPU_UTIL`` percent. The job's processes
load this file too and change nothing: vLLM picks its platform by NVML, and must stay on CPU."""
import os
import sys

with open("/proc/self/cmdline", "rb") as _own:
    _SIDECAR = b"stalldoc.sidecar" in _own.read().split(b"\0")

if _SIDECAR:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import psutil  # noqa: E402
    from fake_pynvml import FakeGpu, FakeNvml  # noqa: E402

    def _job_processes() -> list[tuple[int, int]]:
        watch = {os.getpid(), os.getppid()}
        held = []
        for proc in psutil.process_iter():
            try:
                if proc.pid not in watch and proc.environ().get("FAKE_GPU_HOLDER") == "1":
                    held.append((proc.pid, 2 << 30))
            except psutil.Error:
                continue
        return held

    class _Direct:
        setattr = staticmethod(setattr)

    FakeNvml([FakeGpu("GPU-0", used=20 * 2**30, util=int(os.environ.get("FAKE_GPU_UTIL", "0")),
                      counters=False, processes=_job_processes)]).install(_Direct)
